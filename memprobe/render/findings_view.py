"""One snapshot's findings as the values an HTML table shows: the blocks live at the
peak, the other large blocks, the OOM requests and the notes. The sweep report (one
per kernel) and the attribute page share it and its template macro
(``templates/findings.html``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memprobe.attribute.findings import Findings
from memprobe.attribute.frames import file_name, in_kernel
from memprobe.attribute.records import BlockFinding
from memprobe.io.sizes import format_bytes
from memprobe.records import Frame
from memprobe.render.templating import Cell, Table, bytes_cell
from memprobe.snapshot.labels import op_words


def shape_text(shape: Any) -> str:
    if not shape:
        return ""
    return "[" + ", ".join(f"{int(d):,}" for d in shape) + "]"


def frame_text(frame: Frame | None) -> str:
    if frame is None:
        return "-"
    return f"{file_name(frame) or '??'}:{frame.line} in {frame.name or '??'}"


def op_text(op: Any, kernel: Frame | None = None) -> str:
    return op_words(str(op or "-")) + in_kernel(kernel)


def _what(f: BlockFinding) -> tuple[str, str]:
    """(shown text, tooltip) for what a block is: dtype and shape, with the reasons."""
    exps = f.explanations
    if f.dtype:
        text = f"{f.dtype} {shape_text(f.shape)}".strip()
    elif exps:
        text = f"{exps[0].dtype} {shape_text(exps[0].shape)}"
    else:
        return "not a [B,S,V] size", ""
    if f.dtype_source == "explanation":
        others = len(exps) - 1 + f.more_explanations
        text += f" (best of {others + 1} fits)" if others else " (only fit)"
    reasons = "; ".join(exps[0].reasons) if exps else ""
    return text, reasons


def _lifetime(f: BlockFinding) -> str:
    if f.alloc_index is None:
        return "from before the trace"
    if f.free_index is None:
        return "never freed in the trace"
    us = f.lifetime_us
    return f"{f.lifetime_entries:,} entries" + (f", {us:,} µs" if us is not None else "")


BLOCK_HEADERS = (
    ("size", True),
    ("what it is", False),
    ("op", False),
    ("phase", False),
    ("made at (first user frame)", False),
    ("lived", False),
)


def blocks_table(blocks: Sequence[BlockFinding]) -> Table:
    rows = []
    for f in blocks:
        what, why = _what(f)
        rows.append(
            [
                bytes_cell(f.size),
                Cell(what, title=why or None),
                Cell(op_text(f.op, f.kernel)),
                Cell(f.phase or "-"),
                Cell(frame_text(f.frame), mono=True),
                Cell(_lifetime(f)),
            ]
        )
    return Table(BLOCK_HEADERS, rows)


@dataclass(frozen=True)
class OomLine:
    number: int
    requested: str
    free: str | None  # free on the device when the request failed, when recorded
    allocated: str
    phase: str
    op: str
    frame: str


@dataclass(frozen=True)
class FindingsView:
    peak: str
    at: str  # " at trace entry 1,234" or ""
    live_count: int
    reserved: str | None
    blocks: Table | None  # live at the peak (None: none)
    more: int  # smaller blocks live at the peak left out of the table
    ooms: tuple[OomLine, ...]
    others: Table | None  # large blocks not live at the peak
    others_count: int
    notes: tuple[str, ...]


def oom_line(oom: Any) -> OomLine:
    free = oom.device_free_bytes
    return OomLine(
        number=oom.number,
        requested=format_bytes(oom.requested_bytes),
        free=None if free is None else format_bytes(free),
        allocated=format_bytes(oom.allocated_bytes),
        phase=oom.phase or "?",
        op=op_text(oom.op),
        frame=frame_text(oom.frame),
    )


def _at(index: int | None) -> str:
    if index is None:
        return ""
    if index < 0:  # BEFORE_TRACE: the blocks live before the first entry
        return " at the start of the recorded trace"
    return f" at trace entry {index:,}"


def findings_view(findings: Findings, *, top: int | None = None) -> FindingsView:
    d = findings
    blocks = [f for f in d.findings if f.live_at_peak]
    shown = blocks[:top] if top else blocks
    others = [f for f in d.findings if not f.live_at_peak]
    reserved = d.peak_reserved_bytes
    return FindingsView(
        peak=format_bytes(d.peak_allocated_bytes),
        at=_at(d.peak_index),
        live_count=d.live_at_peak_count,
        reserved=format_bytes(reserved) if reserved else None,
        blocks=blocks_table(shown) if shown else None,
        more=len(blocks) - len(shown),
        ooms=tuple(oom_line(o) for o in d.ooms),
        others=blocks_table(others) if others else None,
        others_count=len(others),
        notes=tuple(d.notes),
    )
