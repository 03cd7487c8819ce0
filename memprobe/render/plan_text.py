"""``memprobe plan`` in the terminal: a table, the notes, and a one-line answer last."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from memprobe.io.sizes import format_bytes
from memprobe.kernels.registry import get_spec
from memprobe.plan import Budget, ChunkChoice, OnProbe, Probe, TokenPlan
from memprobe.render.console import Progress, table


def _chunk(plan: TokenPlan) -> str:
    return "-" if plan.target.chunk_size is None else str(plan.target.chunk_size)


def line_check(plan: TokenPlan) -> str:
    """The `line` column: whether the seed line alone was right, else what it said (or,
    where nothing fits and both say no tokens, that it was off at one token)."""
    a = plan.allocated
    if a.predicted is None:
        return "flat"
    if a.line_exact:
        return "exact"
    return "off" if a.max_tokens == 0 else f"said {a.predicted:,}"


def count_column(plans: Sequence[TokenPlan]) -> str:
    """The answer column's name: with several sequences per GPU the answer counts one
    sequence's tokens, and says so (the terminal's table and the page's alike)."""
    return count_unit(max((p.target.batch for p in plans), default=1))


def count_unit(batch: int) -> str:
    """What a searched count is: with several sequences per GPU the search counts one
    sequence's tokens (the GPU holds ``batch`` times as many)."""
    return "tokens/seq" if batch > 1 else "tokens/GPU"


def plan_table(plans: Sequence[TokenPlan]) -> Table:
    """One row per kernel × layout × chunk size; peaks are per rank."""
    with_cp = any(p.target.cp > 1 for p in plans)
    with_reserved = any(p.reserved is not None for p in plans)
    header = ["kernel", "tp", "cp", "chunk", count_column(plans)]
    header += ["global"] if with_cp else []
    header += ["peak at max", "left at max", "over at max+1", "per token", "fixed", "line"]
    header += ["tokens (reserved)"] if with_reserved else []
    body = []
    for p in plans:
        a = p.allocated
        cells = [p.target.kernel, str(p.target.tp), str(p.target.cp), _chunk(p)]
        cells += [f"{p.max_tokens:,}"]
        cells += [f"{p.global_tokens:,}"] if with_cp else []
        limit = p.budget.limit_bytes
        cells += [
            format_bytes(a.peak_at_max),
            format_bytes(None if a.peak_at_max is None else limit - a.peak_at_max),
            "no more positions" if a.peak_above is None else format_bytes(a.peak_above - limit),
            format_bytes(a.line.slope),
            format_bytes(a.line.fixed),
            line_check(p),
        ]
        if with_reserved:
            cells += [f"{p.reserved.max_tokens:,}" if p.reserved else "-"]
        body.append(cells)
    # The kernel name reads best left-aligned, numbers right-aligned.
    return table(header, body, left=("kernel",))


def budget_line(budget: Budget) -> str:
    both = budget.in_step_bytes
    given_back = f" + lm_head weight in both {format_bytes(both)}" if both else ""
    grows = budget.other_per_token
    per_token = f" (+ {format_bytes(grows)} per token)" if grows else ""
    less = " less the per-token part," if grows else ""
    return (
        f"budget {format_bytes(budget.budget_bytes)} - other {format_bytes(budget.other_bytes)}"
        f"{per_token}{given_back} = {format_bytes(budget.limit_bytes)}{less} for the logprob step "
        "(allocated peak, per rank)"
    )


def chunk_lines(choices: Sequence[ChunkChoice], *, timed: bool = False) -> list[str]:
    """Which chunk size to pick, per chunked kernel × layout; one line when only one was
    planned (nothing to compare). ``timed``: --from-run was given (its times are read;
    the line does not ask for them again)."""
    single = [c for c in choices if c.single]
    lines = []
    if single:
        sizes = sorted({c.for_memory for c in single if c.for_memory is not None})
        times = "" if timed else " (and their measured times with --from-run DIR)"
        lines.append(
            f"chunk size: only {', '.join(map(str, sizes))} planned for "
            f"{', '.join(dict.fromkeys(c.kernel for c in single))}; compare sizes with "
            f"--chunk-size a,b,c{times}"
        )
    # Layouts that agree are said once: "local_chunked: 512 ..." rather than a line each.
    groups: dict[tuple[str, int | None, int | None, str], list[str]] = {}
    kinds: dict[str, int] = {}
    for c in choices:
        if c.single:
            continue
        key = (c.kernel, c.for_memory, c.for_time, c.why)
        if key not in groups:
            kinds[c.kernel] = kinds.get(c.kernel, 0) + 1
        groups.setdefault(key, []).append(f"tp {c.tp} cp {c.cp}")
    for (kernel, memory, time, why), layouts in groups.items():
        where = kernel if kinds[kernel] == 1 else f"{kernel} ({'; '.join(layouts)})"
        if time is None:
            lines.append(f"chunk for {where}: {memory} fits the most tokens; {why}")
        elif time == memory:
            lines.append(f"chunk for {where}: {memory}, both lowest peak and {why}")
        else:
            lines.append(
                f"chunk for {where}: {memory} fits the most tokens; "
                f"when time matters {time} ({why})"
            )
    return lines


def line_note(plans: Sequence[TokenPlan]) -> str | None:
    """Where the seed line missed the simulated answer, and by how much at the answer."""
    # Not where the model's positions ended the answer before the budget did. Where
    # nothing fits, the line is judged at one token (Search.line_exact).
    missed = [p for p in plans if not p.at_positions and not p.allocated.line_exact]
    if not missed:
        return None
    worst = max(abs(p.allocated.line_error_bytes or 0) for p in missed)
    kernels = ", ".join(dict.fromkeys(p.target.kernel for p in missed))
    fit = [p.fits_at_all for p in missed]
    where = (
        "at the answer"
        if all(fit)
        else "at one token, where nothing fits"
        if not any(fit)
        else "at the answer, or at one token where nothing fits"
    )
    return (
        f"line: the peak is not one line for {kernels} (off by up to {format_bytes(worst)} "
        f"{where}); the answers come from the simulation, not the line"
    )


def answer_line(plans: Sequence[TokenPlan], budget: Budget) -> str:
    """The one-line answer: the plan that fits the most tokens per GPU, against the
    reference kernel where it was planned."""
    left = format_bytes(budget.limit_bytes)
    fitting = [p for p in plans if p.fits_at_all]
    if not fitting:
        # Nothing fits: every search ended at one token, over the limit (never None).
        leanest = min(plans, key=lambda p: p.allocated.peak_above or 0)
        # The search counts one sequence's tokens: at --batch 2 its one token is two on
        # the GPU ("one token per GPU already needs 28.01 KiB" was the peak of two).
        batch = leanest.target.batch
        one = (
            f"one token per sequence × {batch} sequences = {batch} per GPU"
            if batch > 1
            else "one token per GPU"
        )
        return (
            f"answer: nothing fits: {one} already needs "
            f"{format_bytes(leanest.allocated.peak_above)} with {leanest.target.kernel} "
            f"(tp {leanest.target.tp}), and the step has {left}"
        )
    best = max(fitting, key=lambda p: p.max_tokens)
    if best.at_positions:
        return _positions_answer(plans, best.max_tokens, left)
    tokens = f"{best.max_tokens:,} {'token' if best.max_tokens == 1 else 'tokens'}"
    batch = best.target.batch
    where = (
        f"per sequence × {batch} sequences = {best.max_tokens * batch:,} per GPU"
        if batch > 1
        else "per GPU"
    )
    text = f"answer: with {left} for the step, {best.target.kernel} fits the most: {tokens} {where}"
    layout = []
    if best.target.tp > 1:
        layout.append(f"tp {best.target.tp}")
    if best.target.cp > 1:
        # With --batch B, "= 2B·T per GPU (cp 4, 4T global)" read as the job's total tokens
        # (4 x 2B·T): the global figure is one sequence's length across the cp group.
        cp, whole = best.target.cp, best.global_tokens
        layout.append(
            f"cp {cp}: each sequence {whole:,} tokens across the group"
            if batch > 1
            else f"cp {cp}, {whole:,} global"
        )
    if best.target.chunk_size is not None:
        layout.append(f"chunk {best.target.chunk_size}")
    if get_spec(best.target.kernel).consumes_logits:
        layout.append("consumes the logits")
    if layout:
        text += f" ({', '.join(layout)})"
    reference = [
        p
        for p in plans
        if p.target.kernel == "unchunked" and p.target.cp == best.target.cp and p is not best
    ]
    if reference:
        text += f"; unchunked fits {reference[0].max_tokens:,}"
    return text


def _positions_answer(plans: Sequence[TokenPlan], positions: int, left: str) -> str:
    """The answer when the model's learned positions, not the budget, end the longest
    sequence: which kernels fit all of them, the leanest there, and the others' answers."""
    whole = [p for p in plans if p.at_positions]
    leanest = min(whole, key=lambda p: p.allocated.peak_at_max or 0)
    peak = format_bytes(leanest.allocated.peak_at_max)
    if len(whole) == 1:
        names, lowest = whole[0].target.kernel, f", at {peak}"
    else:
        everyone = len(whole) == len(plans)
        names = "every kernel" if everyone else ", ".join(p.target.kernel for p in whole)
        lowest = f"; lowest peak there: {leanest.target.kernel}, {peak}"
    verb = "fit" if len(whole) > 1 and names != "every kernel" else "fits"
    text = (
        f"answer: with {left} for the step, {names} {verb} all {positions:,} positions the "
        f"model learned (no longer sequence runs){lowest}"
    )
    rest = [f"{p.target.kernel} fits {p.max_tokens:,}" for p in plans if not p.at_positions]
    return text + (f"; {', '.join(rest)}" if rest else "")


def probe_line(probe: Probe, unit: str | None = None) -> str:
    """One count a search tried, for the live progress bar: ``local_chunked c1024 tp=1
    cp=1: 163,840 tokens/GPU -> 61.20 GiB allocated, fits 74.00 GiB`` (unit: the
    target's, :func:`count_unit`, unless the caller names it)."""
    t = probe.target
    unit = unit or count_unit(t.batch)
    chunk = f" c{t.chunk_size}" if t.chunk_size else ""
    verdict = "fits" if probe.fits else "over"
    return (
        f"{t.kernel}{chunk} tp={t.tp} cp={t.cp}: {probe.tokens:,} {unit} -> "
        f"{format_bytes(probe.peak)} {probe.kind}, {verdict} {format_bytes(probe.limit)}"
    )


def probe_progress(progress: Progress, unit: str | None = None) -> OnProbe:
    """Each count a search tries, in the live bar on a terminal (stdout and --json, and
    stderr off a terminal, stay as they are)."""
    return lambda probe: progress.probe(probe_line(probe, unit))
