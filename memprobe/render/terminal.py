"""The sweep's terminal output: the end table (peak, floor, peak/floor, saving against
unchunked) and the ``--json`` summary."""

from __future__ import annotations

from typing import Any

import pandas as pd

from memprobe.io.sizes import format_bytes
from memprobe.render.ratios import with_ratios
from memprobe.results import missing


def _num(value: Any, fmt: str) -> str:
    return "-" if missing(value) else format(value, fmt)


def table_lines(frame: pd.DataFrame) -> list[str]:
    """One aligned line per case, largest shape last within each kernel block."""
    if frame.empty:
        return ["(no cases)"]
    rows = with_ratios(frame)
    # Group by shape, smallest first, so the largest case ends the table.
    rows = rows.sort_values(["batch", "dtype", "tp", "cp", "vocab", "tokens"], kind="stable")
    header = [
        "kernel",
        "tokens",
        "vocab",
        "dtype",
        "chunk",
        "tp",
        "cp",
        "status",
        "peak",
        "floor",
        "peak/floor",
        "vs unchunked",
        "fwd s",
        "bwd s",
    ]
    body = []
    for r in rows.itertuples(index=False):
        body.append(
            [
                r.kernel,
                f"{r.tokens:,}",
                f"{r.vocab:,}",
                r.dtype,
                "-" if missing(r.chunk_size) else f"{int(r.chunk_size)}",
                str(r.tp),
                str(r.cp),
                r.status,
                format_bytes(None if missing(r.peak_bytes) else r.peak_bytes),
                format_bytes(None if missing(r.floor_bytes) else r.floor_bytes),
                _num(r.peak_over_floor, ".2f") + ("" if missing(r.peak_over_floor) else "x"),
                _num(r.saving_vs_unchunked, ".2f")
                + ("" if missing(r.saving_vs_unchunked) else "x"),
                _num(r.fwd_time_s, ".4f"),
                _num(r.bwd_time_s, ".4f"),
            ]
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    right = {1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13}

    def fmt(cells: list[str]) -> str:
        padded = zip(cells, widths, strict=True)
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(padded)
        )

    lines = [fmt(header), fmt(["-" * w for w in widths])]
    lines += [fmt(b) for b in body]
    notes = [
        f"{r.kernel} s={r.tokens} v={r.vocab}: {r.note}"
        for r in rows.itertuples()
        if r.status != "ok" and r.note
    ]
    return lines + notes


def json_summary(frame: pd.DataFrame, run_dir: str) -> dict[str, Any]:
    rows = with_ratios(frame)
    records = rows.astype(object).where(rows.notna(), None).to_dict(orient="records")
    return {"run_dir": run_dir, "cases": len(records), "results": records}
