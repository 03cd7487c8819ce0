"""Attribution findings as HTML: the blocks live at the peak, OOM requests, notes.

Reads the JSON form of :class:`memprobe.attribute.Findings` (``to_json()``), so it
renders findings from a live object, a ``--json`` dump, or a report's evidence alike.
:func:`write_findings_page` is what ``memprobe attribute --html FILE`` writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memprobe.render.markup import Cell, bytes_cell, definitions, esc, page, table, ul, write_text
from memprobe.units import format_bytes


def as_json(findings: Any) -> dict[str, Any]:
    """A Findings object or its JSON dict → the dict."""
    return findings.to_json() if hasattr(findings, "to_json") else dict(findings)


def _shape(shape: Any) -> str:
    if not shape:
        return ""
    return "[" + ", ".join(f"{int(d):,}" for d in shape) + "]"


def _frame(frame: dict[str, Any] | None) -> str:
    if not frame:
        return "-"
    filename = str(frame.get("filename", "??")).replace("\\", "/").rsplit("/", 1)[-1]
    return f"{filename}:{frame.get('line', 0)} in {frame.get('name', '??')}"


def _op(op: Any) -> str:
    # memprobe's labels keep one word per value: "input:_logits" reads "input: logits".
    text = str(op or "-")
    return "input: " + text[len("input:_") :] if text.startswith("input:_") else text


def _what(f: dict[str, Any]) -> tuple[str, str]:
    """(shown text, tooltip) for what a block is: dtype and shape, with the reasons."""
    exps = f.get("explanations") or []
    if f.get("dtype"):
        text = f"{f['dtype']} {_shape(f.get('shape'))}".strip()
    elif exps:
        text = f"{exps[0]['dtype']} {_shape(exps[0]['shape'])}"
    else:
        return "not a [B,S,V] size", ""
    source = f.get("dtype_source")
    if source == "explanation":
        others = len(exps) - 1 + int(f.get("more_explanations") or 0)
        text += f" (best of {others + 1} fits)" if others else " (only fit)"
    reasons = "; ".join(exps[0].get("reasons", [])) if exps else ""
    return text, reasons


def _lifetime(f: dict[str, Any]) -> str:
    if f.get("alloc_index") is None:
        return "from before the trace"
    if f.get("free_index") is None:
        return "never freed in the trace"
    us = f.get("lifetime_us")
    entries = f.get("lifetime_entries")
    return f"{entries:,} entries" + (f", {us:,} µs" if us is not None else "")


def blocks_table(blocks: list[dict[str, Any]]) -> str:
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
                bytes_cell(f.get("size")),
                Cell(what_html, raw_html=True),
                Cell(_op(f.get("op")), raw_html=False),
                Cell(f.get("phase") or "-"),
                Cell(f'<span class="mono">{esc(_frame(f.get("frame")))}</span>', raw_html=True),
                Cell(_lifetime(f)),
            ]
        )
    return table(headers, rows)


def findings_section(findings: Any, *, top: int | None = None) -> str:
    """HTML for one snapshot's findings (no page around it)."""
    d = as_json(findings)
    blocks = [f for f in d.get("findings", []) if f.get("live_at_peak")]
    shown = blocks[:top] if top else blocks
    at = f" at trace entry {d['peak_index']:,}" if isinstance(d.get("peak_index"), int) else ""
    reserved = d.get("peak_reserved_bytes")
    parts = [
        f"<p>Peak allocated <b>{esc(format_bytes(d.get('peak_allocated_bytes')))}</b>{esc(at)}"
        f" with {esc(d.get('live_at_peak_count', len(blocks)))} blocks live"
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
    for oom in d.get("ooms", []):
        requested = format_bytes(oom.get("requested_bytes"))
        free = oom.get("device_free_bytes")
        allocated = format_bytes(oom.get("allocated_bytes"))
        where = oom.get("phase") or "?"
        made_by = _op(oom.get("op"))
        parts.append(
            f'<p class="warn">Out of memory #{esc(oom.get("number"))}: '
            f"a request for <b>{esc(requested)}</b>"
            + (f" with {esc(format_bytes(free))} free on the device" if free is not None else "")
            + f", {esc(allocated)} allocated, in {esc(where)} by {esc(made_by)} at "
            + f'<span class="mono">{esc(_frame(oom.get("frame")))}</span>.</p>'
        )
    others = [f for f in d.get("findings", []) if not f.get("live_at_peak")]
    if others:
        parts.append(
            f"<details><summary>{len(others)} other large blocks (not live at the peak)</summary>"
        )
        parts.append(blocks_table(others) + "</details>")
    notes = d.get("notes") or []
    if notes:
        parts.append('<p class="muted">Notes:</p>' + ul(esc(n) for n in notes))
    return "\n".join(parts)


def write_findings_page(findings: Any, path: str | Path, *, title: str) -> Path:
    """A self-contained page for one snapshot's findings (``memprobe attribute --html``)."""
    d = as_json(findings)
    meta = definitions(
        [
            ("snapshot", d.get("path")),
            ("read from", d.get("source")),
            ("device", d.get("device")),
            (
                "trace entries",
                f"{d['trace_entries']:,}" if d.get("trace_entries") is not None else None,
            ),
            (
                "vocab / tokens / batch given",
                " / ".join(
                    "-" if d.get(k) is None else f"{d[k]:,}" for k in ("vocab", "tokens", "batch")
                ),
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
