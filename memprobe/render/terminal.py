"""The sweep's terminal output: the end table (peak, floor, peak/floor, peak against
unchunked, whether it fits a budget), the closing answer, and the ``--json`` summary.
:mod:`~memprobe.render.console` draws the table."""

from __future__ import annotations

from typing import Any

import pandas as pd

from memprobe.io.sizes import format_bytes
from memprobe.render.console import Part, table
from memprobe.report.ratios import with_ratios
from memprobe.results import missing, rows_of


def _num(value: Any, fmt: str) -> str:
    return "-" if missing(value) else format(value, fmt)


def _times(x: Any) -> str:
    return "-" if missing(x) else f"{x:.2f}x"


def sweep_table(frame: pd.DataFrame, *, budget_bytes: int | None = None) -> list[Part]:
    """The end table, one row per case, largest shape last within each kernel block,
    then a line for each case that did not run.

    ``peak vs unchunked`` is this kernel's peak over unchunked's at the same shape
    (0.30x: 70% less memory). ``reserved`` is what the caching allocator holds; ``~``
    marks memprobe's model of it (meta, cpu) rather than a measurement. With a budget,
    ``fits`` says whether the peak is within it. Times show only where measured (cpu,
    cuda): a simulation has none.
    """
    if frame.empty:
        return ["(no cases)"]
    rows = with_ratios(frame)
    # Group by shape, smallest first, so the largest case ends the table.
    rows = rows.sort_values(["batch", "dtype", "tp", "cp", "vocab", "tokens"], kind="stable")
    header = [
        "kernel",
        "batch",
        "tokens",
        "vocab",
        "dtype",
        "chunk",
        "tp",
        "cp",
        "status",
        "peak",
        "reserved",
        "floor",
        "peak/floor",
        "peak vs unchunked",
        "fwd s",
        "bwd s",
    ]
    if budget_bytes is not None:
        header.append("fits")
    # The hidden family's H tells its rows apart; a run without it has no such column.
    with_hidden = "hidden" in rows and rows["hidden"].notna().any()
    if with_hidden:
        header.insert(1, "hidden")
    body = []
    for r in rows.itertuples(index=False):
        cells = [
            r.kernel,
            f"{r.batch:,}",
            f"{r.tokens:,}",
            f"{r.vocab:,}",
            r.dtype,
            "-" if missing(r.chunk_size) else f"{int(r.chunk_size)}",
            str(r.tp),
            str(r.cp),
            r.status,
            format_bytes(None if missing(r.peak_bytes) else r.peak_bytes),
            _reserved(r.reserved_peak_bytes, r.reserved_source),
            format_bytes(None if missing(r.floor_bytes) else r.floor_bytes),
            _times(r.peak_over_floor),
            _times(None if missing(r.saving_vs_unchunked) else 1 / r.saving_vs_unchunked),
            _num(r.fwd_time_s, ".4f"),
            _num(r.bwd_time_s, ".4f"),
        ]
        if budget_bytes is not None:
            cells.append(_fits(r.status, r.peak_bytes, budget_bytes))
        if with_hidden:
            cells.insert(1, "-" if missing(r.hidden) else f"{int(r.hidden):,}")
        body.append(cells)
    notes = [
        f"{r.kernel} s={r.tokens} v={r.vocab}: {r.note}"
        for r in rows.itertuples()
        if r.status != "ok" and r.note
    ]
    return [table(header, body, left=("kernel", "dtype", "status", "fits")), *notes]


def _reserved(value: Any, source: Any) -> str:
    """Reserved bytes; ``~`` marks the caching-allocator model's figure (meta/cpu)."""
    if missing(value):
        return "-"
    return ("~" if source == "modelled" else "") + format_bytes(value)


def _fits(status: str, peak: Any, budget_bytes: int) -> str:
    if status != "ok" or missing(peak):
        return "-"
    return "yes" if peak <= budget_bytes else "no"


def answer_lines(
    frame: pd.DataFrame, meta: dict[str, Any], *, budget_bytes: int | None
) -> list[str]:
    """The closing lines: at the largest case, what to use and (with a budget) what fits,
    for every parallel layout (tp, cp) the run has there."""
    from memprobe.report.headline import (
        LAYOUT_KEYS,
        SLICE_KEYS,
        budget_sentence,
        make_headlines,
        other_slices,
        recommendation,
    )

    if frame.empty:
        return []
    headlines = make_headlines(frame, meta, budget_bytes=budget_bytes)
    several_hidden = "hidden" in frame and frame["hidden"].dropna().nunique() > 1
    lines: list[str] = []
    for h in headlines:
        at = f"At {h.tokens:,} tokens x {h.vocab:,} vocabulary ({h.dtype}"
        at += f", hidden {h.case.hidden:,}" if several_hidden and h.case.hidden else ""
        at += f", batch {h.batch}" if h.batch != 1 else ""
        at += f", tp {h.tp}" if h.tp != 1 else ""
        at += f", cp {h.cp}" if h.cp != 1 else ""
        lines += [f"{at}):", *(f"  {line}" for line in recommendation(h))]
        if h.budget_bytes is not None or any(k.status == "oom" for k in h.kernels):
            lines.append(f"  {budget_sentence(h)}")
    # Every layout has its answer above: only the other configurations go unsaid.
    keys: tuple[str, ...] = SLICE_KEYS
    if len(headlines) > 1:
        keys = tuple(k for k in SLICE_KEYS if k not in LAYOUT_KEYS)
    also = other_slices(with_ratios(frame), headlines[0], keys=keys, subject="This answer is")
    if also:
        lines.append(f"  {also}")
    return lines


def json_summary(frame: pd.DataFrame, run_dir: str) -> dict[str, Any]:
    # As results.json writes them: a byte count whole though an error row left its column
    # with a missing value (pandas then holds the column as floats: 114944.0).
    records = rows_of(with_ratios(frame))
    return {"run_dir": run_dir, "cases": len(records), "results": records}
