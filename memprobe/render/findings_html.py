"""Attribution findings as HTML: the blocks live at the peak, OOM requests, notes.

Reads the typed :class:`memprobe.attribute.Findings` (a ``--json`` dump reads back
with ``Findings.from_json``). :func:`write_findings_page` is what
``memprobe attribute --html FILE`` writes; the sweep report embeds
:func:`findings_section` per kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memprobe.io.sizes import format_bytes
from memprobe.records import Frame
from memprobe.render.markup import Cell, bytes_cell, definitions, esc, page, table, ul, write_text

if TYPE_CHECKING:  # the attribution package is only read from, never run, here
    from memprobe.attribute import BlockFinding, Findings


def _shape(shape: Any) -> str:
    if not shape:
        return ""
    return "[" + ", ".join(f"{int(d):,}" for d in shape) + "]"


def _frame(frame: Frame | None) -> str:
    if frame is None:
        return "-"
    filename = str(frame.filename or "??").replace("\\", "/").rsplit("/", 1)[-1]
    return f"{filename}:{frame.line} in {frame.name or '??'}"


def _op(op: Any) -> str:
    # memprobe's labels keep one word per value: "input:_logits" reads "input: logits".
    text = str(op or "-")
    return "input: " + text[len("input:_") :] if text.startswith("input:_") else text


def _what(f: BlockFinding) -> tuple[str, str]:
    """(shown text, tooltip) for what a block is: dtype and shape, with the reasons."""
    exps = f.explanations
    if f.dtype:
        text = f"{f.dtype} {_shape(f.shape)}".strip()
    elif exps:
        text = f"{exps[0].dtype} {_shape(exps[0].shape)}"
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


def blocks_table(blocks: Sequence[BlockFinding]) -> str:
    headers = [
        ("size", True),
        ("what it is", False),
        ("op", False),
        ("phase", False),
        ("made at (first user frame)", False),
        ("lived", False),
    ]
    rows = []
    for f in blocks:
        what, why = _what(f)
        what_html = f'<span title="{esc(why)}">{esc(what)}</span>' if why else esc(what)
        rows.append(
            [
                bytes_cell(f.size),
                Cell(what_html, raw_html=True),
                Cell(_op(f.op)),
                Cell(f.phase or "-"),
                Cell(f'<span class="mono">{esc(_frame(f.frame))}</span>', raw_html=True),
                Cell(_lifetime(f)),
            ]
        )
    return table(headers, rows)


def findings_section(findings: Findings, *, top: int | None = None) -> str:
    """HTML for one snapshot's findings (no page around it)."""
    d = findings
    blocks = [f for f in d.findings if f.live_at_peak]
    shown = blocks[:top] if top else blocks
    at = f" at trace entry {d.peak_index:,}" if d.peak_index is not None else ""
    reserved = d.peak_reserved_bytes
    parts = [
        f"<p>Peak allocated <b>{esc(format_bytes(d.peak_allocated_bytes))}</b>{esc(at)}"
        f" with {esc(d.live_at_peak_count)} blocks live"
        + (f"; peak reserved {esc(format_bytes(reserved))}" if reserved else "")
        + ".</p>"
    ]
    if shown:
        more = len(blocks) - len(shown)
        parts.append(blocks_table(shown))
        if more > 0:
            parts.append(
                f'<p class="muted">{more} smaller blocks live at the peak are not listed.</p>'
            )
    else:
        parts.append('<p class="muted">No block is live at the peak.</p>')
    for oom in d.ooms:
        requested = format_bytes(oom.requested_bytes)
        free = oom.device_free_bytes
        allocated = format_bytes(oom.allocated_bytes)
        where = oom.phase or "?"
        made_by = _op(oom.op)
        parts.append(
            f'<p class="warn">Out of memory #{esc(oom.number)}: '
            f"a request for <b>{esc(requested)}</b>"
            + (f" with {esc(format_bytes(free))} free on the device" if free is not None else "")
            + f", {esc(allocated)} allocated, in {esc(where)} by {esc(made_by)} at "
            + f'<span class="mono">{esc(_frame(oom.frame))}</span>.</p>'
        )
    others = [f for f in d.findings if not f.live_at_peak]
    if others:
        parts.append(
            f"<details><summary>{len(others)} other large blocks (not live at the peak)</summary>"
        )
        parts.append(blocks_table(others) + "</details>")
    notes = d.notes
    if notes:
        parts.append('<p class="muted">Notes:</p>' + ul(esc(n) for n in notes))
    return "\n".join(parts)


def write_findings_page(findings: Findings, path: str | Path, *, title: str) -> Path:
    """A self-contained page for one snapshot's findings (``memprobe attribute --html``)."""
    d = findings
    given = (d.vocab, d.tokens, d.batch)
    meta = definitions(
        [
            ("snapshot", d.path),
            ("read from", d.source),
            ("device", d.device),
            ("trace entries", f"{d.trace_entries:,}" if d.trace_entries is not None else None),
            ("times", "simulated: no times" if d.times == "simulated" else d.times),
            (
                "vocab / tokens / batch given",
                " / ".join("-" if v is None else f"{v:,}" for v in given),
            ),
        ]
    )
    body = (
        f"<h1>{esc(title)}</h1>\n"
        '<p class="sub">memprobe attribution: the blocks live at the peak, what each one most '
        "likely is, which op and line made it, and in which phase.</p>\n"
        f"{findings_section(d)}\n<h2>Snapshot</h2>\n{meta}"
    )
    return write_text(Path(path), page(title, body))
