"""The report page's sections, each a function of computed data returning escaped HTML."""

from __future__ import annotations

from typing import Any

import pandas as pd

from memprobe.io.sizes import format_bytes
from memprobe.records import Case
from memprobe.render.evidence import Evidence
from memprobe.render.findings_html import findings_section
from memprobe.render.headline import (
    Headline,
    budget_sentence,
    kernel_line_parts,
    other_slices,
    recommendation,
    shape_text,
    why_sentence,
)
from memprobe.render.markup import (
    Cell,
    bytes_cell,
    definitions,
    esc,
    number_cell,
    relative_href,
    table,
    ul,
)
from memprobe.results import missing


def answer(h: Headline, device_name: str, table: pd.DataFrame) -> str:
    lines = recommendation(h)
    also = other_slices(table, h)
    if also:
        lines = [*lines, also]
    first = f'<p class="big">{esc(lines[0])}</p>'
    rest = "".join(f"<p>{esc(s)}</p>" for s in lines[1:])
    why = why_sentence(h)
    where = (
        "simulated exactly on meta tensors" if h.device == "meta" else f"measured on {device_name}"
    )
    return (
        '<section class="answer">'
        f"<p>At <b>{esc(shape_text(h))}</b>, {esc(where)}:</p>"
        f"{first}{rest}<p>{esc(budget_sentence(h))}</p>"
        + (f"<p>{esc(why)}</p>" if why else "")
        + "</section>"
    )


def kernel_lines(h: Headline) -> str:
    items = []
    for k in h.kernels:
        head, rest = kernel_line_parts(k, h)
        text = f"<b>{esc(head)}</b>" + (
            f", {esc(rest)}" if k.ok and rest else f" ({esc(rest)})" if rest else ""
        )
        if k.summary:
            text += f'<br><span class="muted">{esc(k.summary)}</span>'
        items.append(text)
    return "<h2>What this means, kernel by kernel</h2>" + ul(items)


def evidence_note(evidence: tuple[Evidence, ...]) -> str:
    """Say where each kernel's trace came from, and what could not be shown."""
    snap = [e.kernel for e in evidence if e.snapshot is not None]
    sources = []
    if snap:
        sources.append(
            f"the run's allocator snapshots (snapshots/, one per case) for {', '.join(snap)}"
        )
    problems = [f"{e.kernel}: {p}" for e in evidence for p in e.problems]
    text = ""
    if sources:
        text += f'<p class="muted">Traces from {esc("; ".join(sources))}.</p>'
    if problems:
        text += '<p class="muted">Notes:</p>' + ul(esc(p) for p in problems)
    return text


def attribution(evidence: tuple[Evidence, ...], case: Case) -> str:
    parts = [
        "<h2>Attribution at the largest case</h2>",
        '<p class="muted">What <code>memprobe attribute</code> says about each kernel\'s '
        "snapshot: the blocks live at the peak, what each most likely is, the op and the "
        "line that made it, and the phase.</p>",
    ]
    shown = 0
    for e in evidence:
        if e.findings is None:
            continue
        shown += 1
        big = any(
            f.live_at_peak and f.dtype is not None and case.is_fp32_bsv(f.size, f.dtype)
            for f in e.findings.findings
        )
        flag = " — float32 [B,S,V] blocks at the peak" if big else ""
        parts.append(
            f"<details{' open' if big else ''}><summary>{esc(e.kernel)}{esc(flag)}</summary>"
            f"{findings_section(e.findings)}</details>"
        )
    if not shown:
        parts.append('<p class="muted">No attribution findings for this run.</p>')
    return "\n".join(parts)


_ORDER = ["batch", "dtype", "tp", "cp", "vocab", "tokens"]


def results_table(results: pd.DataFrame, page_dir: Any, run_dir: Any) -> str:
    """Every case; ``results`` has the ratios (the page model's table)."""
    rows = results.sort_values(_ORDER, kind="stable")
    cols: list[tuple[str, bool, Any]] = [
        ("kernel", False, lambda r: Cell(r.kernel)),
        ("tokens", True, lambda r: number_cell(r.tokens, ",")),
        ("vocab", True, lambda r: number_cell(r.vocab, ",")),
        ("batch", True, lambda r: number_cell(r.batch, ",")),
        ("dtype", False, lambda r: Cell(r.dtype)),
        ("chunk", True, lambda r: number_cell(r.chunk_size, ",.0f")),
        ("tp", True, lambda r: number_cell(r.tp, "d")),
        ("cp", True, lambda r: number_cell(r.cp, "d")),
        ("status", False, lambda r: Cell(r.status)),
        ("peak", True, lambda r: bytes_cell(r.peak_bytes)),
        ("floor", True, lambda r: bytes_cell(r.floor_bytes)),
        ("peak / floor", True, lambda r: number_cell(r.peak_over_floor, ".2f", "×")),
        ("unchunked / peak", True, lambda r: number_cell(r.saving_vs_unchunked, ".2f", "×")),
        ("fp32 [B,S,V] at peak", True, lambda r: number_cell(r.big_fp32_blocks, ".0f")),
        ("forward peak", True, lambda r: bytes_cell(r.forward_peak_bytes)),
        ("backward peak", True, lambda r: bytes_cell(r.backward_peak_bytes)),
        ("reserved peak", True, lambda r: bytes_cell(r.reserved_peak_bytes)),
        ("forward s", True, lambda r: number_cell(r.fwd_time_s, ".4f")),
        ("backward s", True, lambda r: number_cell(r.bwd_time_s, ".4f")),
        ("max |err| fwd", True, lambda r: number_cell(r.max_abs_err_fwd, ".1e")),
        ("max |err| bwd", True, lambda r: number_cell(r.max_abs_err_bwd, ".1e")),
        ("note", False, lambda r: Cell("" if missing(r.note) else r.note)),
        ("snapshot", False, lambda r: _snapshot_cell(r.snapshot, page_dir, run_dir)),
    ]
    source = {
        "chunk": "chunk_size",
        "reserved peak": "reserved_peak_bytes",
        "forward s": "fwd_time_s",
        "backward s": "bwd_time_s",
        "max |err| fwd": "max_abs_err_fwd",
        "max |err| bwd": "max_abs_err_bwd",
        "note": "note",
        "snapshot": "snapshot",
        "tp": "tp",
        "cp": "cp",
    }
    dropped = []
    keep = []
    for title, numeric, make in cols:
        column = source.get(title)
        if column is not None and _uninformative(rows[column], column):
            dropped.append(title)
            continue
        keep.append((title, numeric, make))
    body = [[make(r) for _, _, make in keep] for r in rows.itertuples(index=False)]
    classes = ["" if r.status == "ok" else "bad" for r in rows.itertuples(index=False)]
    html_table = table([(t, n) for t, n, _ in keep], body, sortable=True, row_classes=classes)
    note = (
        f'<p class="muted">{len(rows):,} cases. Click a column to sort. '
        "“unchunked / peak” is the saving against unchunked at the same shape. "
        + (
            f"Left out (empty or all the same in this run): {esc(', '.join(dropped))}."
            if dropped
            else ""
        )
        + "</p>"
    )
    return f'<h2>All results</h2>{note}<div class="scroll">{html_table}</div>'


def _uninformative(values: pd.Series, column: str) -> bool:
    present = values.dropna()
    present = present[present.astype(str) != ""]
    if present.empty:
        return True
    return column in ("tp", "cp") and set(present.astype(int)) == {1}


def _snapshot_cell(value: Any, page_dir: Any, run_dir: Any) -> Cell:
    if missing(value) or not value:
        return Cell("")
    href = relative_href(run_dir / value, page_dir)
    return Cell(f'<a href="{esc(href)}">pickle</a>', value, raw_html=True)


def run_metadata(meta: dict[str, Any], frame: pd.DataFrame, h: Headline, run_dir: Any) -> str:
    planned = len(meta.get("cases") or [])
    statuses = frame["status"].value_counts().to_dict()
    counts = ", ".join(f"{n:,} {s}" for s, n in statuses.items())
    budget = None
    if h.budget_bytes is not None:
        budget = f"{format_bytes(h.budget_bytes)} ({h.budget_source})"
    pairs = [
        ("run directory", str(run_dir)),
        ("command", meta.get("command")),
        ("started", meta.get("started")),
        ("device", f"{meta.get('device', '?')}: {meta.get('device_name', '?')}"),
        ("memprobe", meta.get("memprobe_version")),
        ("torch", meta.get("torch_version")),
        ("python", meta.get("python_version")),
        ("cases", f"{len(frame):,} finished of {planned:,} planned ({counts})"),
        ("memory budget", budget),
        ("re-render", f"memprobe report {run_dir}"),
    ]
    return "<h2>Run</h2>" + definitions(pairs)
