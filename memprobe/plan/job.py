"""The plan job ``memprobe plan`` runs: a request (its flags, checked) → the plans, the
chunk choices and the notes. Rendering them (table, page, progress) is the caller's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprobe.allocator import alloc_conf_setting, modelled_alloc_conf
from memprobe.allocator.config import refuse_fraction_under_budget
from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes, parse_size
from memprobe.plan.chunks import ChunkChoice, chunk_choices, step_seconds
from memprobe.plan.driver import run_plans
from memprobe.plan.message import (
    kept_memory_status,
    lm_head_status,
    long_loop_status,
    reserved_status,
)
from memprobe.plan.model import Budget, OnProbe, TokenPlan, make_budget, with_lm_head_in_other
from memprobe.plan.other import other_from_snapshots
from memprobe.plan.search import seed_tokens
from memprobe.plan.targets import plan_targets
from memprobe.records import MAX_COUNT, too_large
from memprobe.results import read_rows

# After the i-th of n plans finishes (in the order they finish).
OnPlan = Callable[[int, int, TokenPlan], None]


@dataclass(frozen=True)
class PlanRequest:
    vocab: int
    budget: str
    other: str = "0"
    dtype: str = "bf16"
    batch: int = 1
    kernels: tuple[str, ...] | None = None
    # None: the chunk sizes a --from-run run timed, else 1024 (the sweep's default).
    chunk_sizes: tuple[int | None, ...] | None = None
    tp: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)
    hidden: int | None = None
    alloc_conf: str | None = None
    from_run: Path | None = None
    jobs: int = 1
    other_from: tuple[str, ...] = ()  # snapshots to read "other" from instead
    reserved: bool = True  # also plan on the allocator model's reserved peak
    other_includes_lm_head: bool = False  # --other holds the lm_head weight


@dataclass(frozen=True)
class PlanOutcome:
    plans: list[TokenPlan]
    budget: Budget
    choices: list[ChunkChoice]
    skipped: list[str]
    notes: list[str]

    def rows(self) -> list[dict[str, Any]]:
        """The --json rows: each plan, with whether its chunk size is the one to pick."""
        memory = {(c.kernel, c.tp, c.cp): c for c in self.choices}
        rows = []
        for p in self.plans:
            row = p.row()
            choice = memory.get((p.target.kernel, p.target.tp, p.target.cp))
            row["chunk_for_memory"] = choice.for_memory == p.target.chunk_size if choice else None
            row["chunk_for_time"] = (
                choice.for_time == p.target.chunk_size
                if choice and choice.for_time is not None
                else None
            )
            # --other-from's fit (other = other_bytes + per token · N): None for --other.
            fitted = self.budget.other_residual is not None
            row["other_per_token_bytes"] = self.budget.other_per_token if fitted else None
            row["other_fit_residual_bytes"] = self.budget.other_residual
            rows.append(row)
        return rows


def _run_chunk_sizes(rows: Sequence[dict[str, Any]], run: Path) -> tuple[int | None, ...]:
    """The chunk sizes a run timed: those the plan compares when --chunk-size is not given.
    Each is held to the bound --chunk-size is (no sweep times one past it): a row's
    chunk_size of 2^62 ended the plan in torch's overflow, blamed on the kernel, and one
    of 2^40 + 1 was planned as a chunk of 516 TiB."""
    timed = {
        r["chunk_size"]
        for r in rows
        if r.get("chunk_size") is not None and r.get("fwd_time_s") is not None
    }
    past = sorted(c for c in timed if c > MAX_COUNT)
    if past:
        raise UserError(
            f"--from-run {run} timed chunk_size {past[0]:,}, beyond the largest count "
            f"memprobe simulates ({MAX_COUNT:,} = 2^40): no sweep runs it",
            "the run was edited or is not memprobe's; give --chunk-size to choose the sizes",
        )
    return tuple(sorted(timed)) or (1024,)


def budget_from(
    budget: str | int,
    other: str | int = 0,
    other_from: Sequence[str] = (),
    *,
    vocab: int | None = None,
) -> tuple[Budget, str | None]:
    """The budget with ``other`` as given, or read from snapshots (``other_from``): a
    constant from one, a constant + per-token term fitted to several; with the line
    that says what was read (None when ``other`` was given)."""
    if not other_from:
        return make_budget(budget, other), None
    if other not in (0, "0"):
        raise UserError(
            "--other and --other-from both say what the rest of the job holds", "give one"
        )
    fit = other_from_snapshots(other_from, vocab=vocab)
    budget_bytes = parse_size(budget, what="--budget")
    if fit.at(0) > budget_bytes:
        # Said of --other-from: the user gave no --other for make_budget to name.
        raise UserError(
            f"the rest of the job read from --other-from holds {format_bytes(fit.at(0))}, "
            f"more than --budget {format_bytes(budget_bytes)} ({fit.describe()})",
            "the budget is the GPU's whole memory: give the GPU's size, or snapshots of "
            "the job you plan",
        )
    limit = make_budget(budget, fit.at(0))
    return Budget(
        limit.budget_bytes,
        limit.other_bytes,
        other_per_token=fit.per_token_bytes,
        other_residual=fit.residual_bytes,
    ), fit.describe()


def run_plan_job(
    request: PlanRequest, on_plan: OnPlan | None = None, on_probe: OnProbe | None = None
) -> PlanOutcome:
    """Every target the request covers, planned; bad input fails before any simulation.
    ``on_plan`` hears of each finished plan, ``on_probe`` of each token count tried."""
    # Checked before any simulation; --other-from reads the snapshots now.
    budget, other_note = budget_from(
        request.budget, request.other, request.other_from, vocab=request.vocab
    )
    # --alloc-conf, else the environment's settings (as sweep models them).
    setting = alloc_conf_setting(request.alloc_conf) if request.reserved else None
    if setting is not None:
        modelled_alloc_conf(*setting)  # a typo must fail before any simulation
        refuse_fraction_under_budget(setting, budget.budget_bytes)
    rows = read_rows(request.from_run) if request.from_run is not None else None
    # Its times are all --from-run reads: without any, the flag would change nothing. Only
    # a row that finished ok with both times counts (as the chunk choice reads them): a
    # run whose timed rows all failed, or that timed forward alone, changed nothing.
    if rows is not None and not any(step_seconds(r) is not None for r in rows):
        # Meta is named only where the run holds meta rows: a cpu run whose times were
        # lost was told of meta runs, which it is not.
        on_meta = any(r["device"] == "meta" for r in rows)
        raise UserError(
            f"--from-run {request.from_run} has no measured times: none of its rows finished "
            "ok on cpu or cuda with forward and backward timed"
            + (" (a --device meta run simulates memory only)" if on_meta else ""),
            "give a --device cpu or cuda sweep, or drop --from-run",
        )
    chunk_sizes = request.chunk_sizes
    if chunk_sizes is None:
        run = request.from_run
        chunk_sizes = _run_chunk_sizes(rows, run) if rows and run is not None else (1024,)
    targets, skipped = plan_targets(
        request.kernels,
        vocab=request.vocab,
        batch=request.batch,
        dtype=request.dtype,
        chunk_sizes=chunk_sizes,
        tp=request.tp,
        cp=request.cp,
        hidden=request.hidden,
    )
    for target in targets:
        # The search starts from its seeds: sizes that overflow torch there failed the
        # first simulation, blamed on the kernel.
        seed = seed_tokens(target)[1]
        past = too_large(target.batch, seed, target.vocab // target.tp, target.hidden)
        if past is not None:
            raise UserError(
                f"{target.kernel} is planned from {seed:,} tokens per GPU up, where {past}",
                "give a smaller --batch, --vocab or --hidden",
            )
    if request.other_includes_lm_head:
        budget = with_lm_head_in_other(budget, targets)
    finished = 0

    def on_done(done: TokenPlan) -> None:
        nonlocal finished
        finished += 1
        if on_plan is not None:
            on_plan(finished, len(targets), done)

    plans = run_plans(
        targets,
        budget,
        jobs=request.jobs,
        alloc_conf=setting[0] if setting is not None else None,
        reserved=request.reserved,
        on_done=on_done,
        on_probe=on_probe,
    )
    choices = chunk_choices(plans, rows)
    notes = [
        reserved_status(setting)
        if request.reserved
        else "reserved: not planned (--no-reserved); a real GPU reserves more than it allocates"
    ] + ([other_note] if other_note else [])
    long_loops = long_loop_status(plans) if request.reserved else None
    notes += [long_loops] if long_loops else []
    lm_head = lm_head_status(targets, budget)
    notes += [lm_head] if lm_head else []
    kept = kept_memory_status(targets)
    notes += [kept] if kept else []
    return PlanOutcome(plans, budget, choices, skipped, notes)
