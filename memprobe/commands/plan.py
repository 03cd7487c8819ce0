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
    CpOption,
    TpOption,
    int_list,
    name_list,
    positive_ints,
    user_errors,
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
    reserved: bool = True  # also plan on the allocator model's reserved peak
    progress: bool = True  # a line (or a bar) on stderr as each plan finishes


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
    from memprobe.render.console import Progress

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

    budget = plan.make_budget(request.budget, request.other)  # checked before any simulation
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
    ]
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
    vocab: Annotated[str, typer.Option(help="Vocabulary size (one value), e.g. 131072.")],
    budget: Annotated[
        str, typer.Option(help="Memory of one GPU, e.g. 80GiB (KiB/MiB/GiB or KB/MB/GB).")
    ],
    other: Annotated[
        str,
        typer.Option(help="What the rest of the job holds on that GPU (weights, optimizer...)."),
    ] = "0",
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
            help="Hidden size H: plan the hidden family (lm_head fused or not with the "
            "log-prob; hidden [B,S,H] and weight [V,H] count in the peak).",
        ),
    ] = None,
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
) -> None:
    """The largest token count per GPU whose simulated peak fits BUDGET - OTHER.

    For every kernel x parallel layout, found by bisection on the exact meta
    simulation the sweep uses, seeded by the line peak = slope x tokens + fixed.
    Peaks are allocated bytes on one rank.
    """
    from memprobe.render.console import show
    from memprobe.render.plan_text import (
        answer_line,
        budget_line,
        chunk_lines,
        line_note,
        plan_table,
    )

    if jobs is not None and jobs < 1:
        raise UserError(f"--jobs {jobs} must be 1 or more", "e.g. --jobs 2")
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
    )
    outcome = run_plan_job(request)
    if as_json:
        typer.echo(json.dumps(outcome.rows(), indent=1))
        return
    typer.echo(budget_line(outcome.budget))
    show([plan_table(outcome.plans)])
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
