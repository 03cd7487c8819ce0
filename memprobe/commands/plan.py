"""``memprobe plan``: how many tokens per GPU fit a memory budget, per kernel × layout."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from memprobe.allocator import parse_alloc_conf
from memprobe.commands.flags import (
    MAX_COUNT,
    CpOption,
    TpOption,
    int_list,
    name_list,
    positive_ints,
    user_errors,
    warn_if_unitless,
)
from memprobe.errors import UserError


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
    out: Path | None = None
    jobs: int = 1
    other_from: tuple[str, ...] = ()  # snapshots to read "other" from instead
    reserved: bool = True  # also plan on the allocator model's reserved peak
    progress: bool = True  # a line (or a bar) on stderr as each plan finishes
    other_includes_lm_head: bool = False  # --other holds the lm_head weight


@dataclass(frozen=True)
class PlanOutcome:
    plans: list[Any]  # memprobe.plan.TokenPlan, imported lazily with torch
    budget: Any
    choices: list[Any]
    skipped: list[str]
    notes: list[str]
    written: tuple[Path, ...] = ()

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
            rows.append(row)
        return rows


def _run_chunk_sizes(rows: list[dict[str, Any]]) -> tuple[int | None, ...]:
    timed = {
        r["chunk_size"]
        for r in rows
        if r.get("chunk_size") is not None and r.get("fwd_time_s") is not None
    }
    return tuple(sorted(timed)) or (1024,)


def _progress(total: int, enabled: bool) -> Callable[[Any], None]:
    """Report each finished plan on stderr: some take minutes (torch's chunk loop at a
    million tokens), and the table comes only when all are done."""
    from memprobe.render.progress import Progress

    progress = Progress(enabled=enabled)
    finished = 0

    def on_done(done: Any) -> None:
        nonlocal finished
        finished += 1
        t = done.target
        what = f"{t.kernel} tp={t.tp} cp={t.cp}: {done.max_tokens:,} tokens/GPU"
        progress.step(finished, total, what)

    return on_done


def run_plan_job(request: PlanRequest) -> PlanOutcome:
    from memprobe import plan
    from memprobe.results import read_rows

    # Checked before any simulation; --other-from reads the snapshots now.
    budget, other_note = plan.budget_from(request.budget, request.other, request.other_from)
    if request.alloc_conf is not None:
        parse_alloc_conf(request.alloc_conf)  # a typo must fail before any simulation
    rows = read_rows(request.from_run) if request.from_run is not None else None
    chunk_sizes = request.chunk_sizes
    if chunk_sizes is None:
        chunk_sizes = _run_chunk_sizes(rows) if rows else (1024,)
    targets, skipped = plan.plan_targets(
        request.kernels,
        vocab=request.vocab,
        batch=request.batch,
        dtype=request.dtype,
        chunk_sizes=chunk_sizes,
        tp=request.tp,
        cp=request.cp,
        hidden=request.hidden,
    )
    if request.other_includes_lm_head:
        budget = plan.with_lm_head_in_other(budget, targets)
    plans = plan.run_plans(
        targets,
        budget,
        jobs=request.jobs,
        alloc_conf=request.alloc_conf,
        reserved=request.reserved,
        on_done=_progress(len(targets), request.progress),
    )
    choices = plan.chunk_choices(plans, rows)
    notes = [
        plan.reserved_status(request.alloc_conf)
        if request.reserved
        else "reserved: not planned (--no-reserved); a real GPU reserves more than it allocates"
    ] + ([other_note] if other_note else [])
    lm_head = plan.lm_head_status(targets, budget)
    notes += [lm_head] if lm_head else []
    outcome = PlanOutcome(plans, budget, choices, skipped, notes)
    if request.out is not None:
        from memprobe.render.plan_page import write_plan_page

        written = write_plan_page(request.out, plans, budget, outcome.rows())
        outcome = PlanOutcome(plans, budget, choices, skipped, notes, written)
    return outcome


def _single(text: str, flag: str) -> int:
    values = positive_ints(text, flag)
    if len(values) != 1:
        raise UserError(f"{flag} takes one value, got {text!r}", f"e.g. {flag} {values[0]}")
    return values[0]


@user_errors
def command(
    vocab: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Vocabulary size (one value), e.g. 131072. (--step: the config's)"),
    ] = None,
    *,
    budget: Annotated[
        str, typer.Option(help="Memory of one GPU, e.g. 80GiB (KiB/MiB/GiB or KB/MB/GB).")
    ],
    other: Annotated[
        str,
        typer.Option(
            help="What the rest of the job holds on that GPU (weights, optimizer...); "
            "with --hidden, not the lm_head weight (see --other-includes-lm-head)."
        ),
    ] = "0",
    other_from: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Read --other from CUDA snapshots of the whole step, comma list: one gives "
            "a constant, two or more at different token counts a constant + per-token fit."
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help="Logits dtype: bf16, fp16 or fp32.")] = "bf16",
    batch: Annotated[str, typer.Option(help="Sequences per GPU (one value).")] = "1",
    kernel: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional on py3.10
        typer.Option(
            help="Kernels, comma list (`memprobe kernels`). "
            "(default: as the sweep: single-device ones, vocabulary-parallel ones with --tp)"
        ),
    ] = None,
    chunk_size: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Chunk sizes to compare for chunked kernels, comma list. "
            "(default: those --from-run timed, else 1024)"
        ),
    ] = None,
    tp: TpOption = "1",
    cp: CpOption = "1",
    hidden: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=1,
            max=MAX_COUNT,
            help="Hidden size H: plan the hidden family (lm_head fused or not with the "
            "log-prob; hidden [B,S,H], weight [V,H] and both gradients count in the peak: "
            "keep the weight out of --other, or see --other-includes-lm-head).",
        ),
    ] = None,
    other_includes_lm_head: Annotated[
        bool,
        typer.Option(
            "--other-includes-lm-head",
            help="With --hidden: --other already holds the lm_head weight [V,H]; give it "
            "back so it counts once (its gradient stays: the step makes it).",
        ),
    ] = False,
    alloc_conf: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Caching-allocator settings (PYTORCH_ALLOC_CONF syntax) for the allocator "
            "model's reserved answer, e.g. expandable_segments:True."
        ),
    ] = None,
    from_run: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="A cpu/cuda sweep's run directory: its times pick a chunk size."),
    ] = None,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Directory for plan.html, plan.png and plan.json."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plans as a JSON list of rows.")
    ] = False,
    reserved: Annotated[
        bool,
        typer.Option(
            help="Also find the tokens that fit on the allocator model's reserved peak "
            "(about 2-4x the simulations); --no-reserved plans on allocated bytes only."
        ),
    ] = True,
    jobs: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            help="Simulation processes (forked; helps where cores are free). (default: 1)"
        ),
    ] = None,
    step: Annotated[
        bool,
        typer.Option(
            "--step", help="Plan the whole training step of --config's model (`memprobe step`)."
        ),
    ] = False,
    config: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="--step: the model's config.json, or the directory holding it."),
    ] = None,
    checkpointing: Annotated[
        bool, typer.Option(help="--step: activation checkpointing of every layer.")
    ] = False,
    optimizer: Annotated[str, typer.Option(help="--step: adamw, sgd or none.")] = "adamw",
) -> None:
    """The largest token count per GPU whose simulated peak fits BUDGET - OTHER.

    For every kernel x parallel layout, found by bisection on the exact meta
    simulation the sweep uses, seeded by the line peak = slope x tokens + fixed.
    Peaks are allocated bytes on one rank.
    """
    from memprobe.render.plan_text import (
        answer_line,
        budget_line,
        chunk_lines,
        line_note,
        table_lines,
    )

    if jobs is not None and jobs < 1:
        raise UserError(f"--jobs {jobs} must be 1 or more", "e.g. --jobs 2")
    warn_if_unitless(budget, "--budget")
    warn_if_unitless(other, "--other")
    if step or config is not None:
        from memprobe.commands.step import plan_step_lines

        for line in plan_step_lines(
            config, budget=budget, kernel=kernel, batch=_single(batch, "--batch"), dtype=dtype,
            chunk_size=chunk_size, checkpointing=checkpointing, optimizer=optimizer,
            alloc_conf=alloc_conf, reserved=reserved, as_json=as_json, step=step,
        ):  # fmt: skip
            typer.echo(line)
        return
    if vocab is None:
        raise UserError("--vocab is missing", "e.g. --vocab 131072 (or --step --config CONFIG)")
    request = PlanRequest(
        vocab=_single(vocab, "--vocab"),
        budget=budget,
        other=other,
        dtype=dtype,
        batch=_single(batch, "--batch"),
        kernels=None if kernel is None else tuple(name_list(kernel, "--kernel")),
        chunk_sizes=(
            tuple(int_list(chunk_size, "--chunk-size", allow_none=True)) if chunk_size else None
        ),
        tp=tuple(positive_ints(tp, "--tp")),
        cp=tuple(positive_ints(cp, "--cp")),
        hidden=hidden,
        alloc_conf=alloc_conf,
        from_run=from_run,
        out=out,
        jobs=jobs if jobs is not None else 1,
        reserved=reserved,
        other_includes_lm_head=other_includes_lm_head,
        other_from=tuple(name_list(other_from, "--other-from")) if other_from else (),
    )
    outcome = run_plan_job(request)
    if as_json:
        typer.echo(json.dumps(outcome.rows(), indent=1))
        return
    typer.echo(budget_line(outcome.budget))
    for line in table_lines(outcome.plans):
        typer.echo(line)
    if outcome.skipped:
        typer.echo(f"not planned (no vocabulary shards): {', '.join(outcome.skipped)}")
    for line in [*chunk_lines(outcome.choices), *outcome.notes]:
        typer.echo(line)
    note = line_note(outcome.plans)
    if note:
        typer.echo(note)
    for path in outcome.written:
        typer.echo(f"wrote {path}")
    typer.echo(answer_line(outcome.plans, outcome.budget))
