"""A self-contained HTML page of ``memprobe attribute`` on a real snapshot.

It leads with one sentence on the peak and, when the snapshot holds an OOM, the OOM
moments (device, exact request, free and reserved then) as its first section. Then
per device: the timeline of allocated bytes by category with the peak marked, what
the peak is made of, the inferred shapes, identical blocks grouped, every
logits-family block, and the full text report. The markup is
``templates/attribute.html`` (extending the base page: its CSP, style and no script).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from matplotlib.patches import Patch

from memprobe.attribute.findings import Findings
from memprobe.attribute.frames import describe_frame
from memprobe.io.files import write_atomic
from memprobe.io.sizes import format_bytes
from memprobe.render.canvas import clean_text, new_figure, styled, to_png, unit_for
from memprobe.render.findings_text import render_findings
from memprobe.render.findings_view import op_text
from memprobe.render.style import category_style
from memprobe.render.templating import Cell, Figure, Table, bytes_cell, render_page
from memprobe.report.attribution import OomSummary, headline, oom_summaries


@styled
def timeline_png(f: Findings) -> bytes | None:
    """Allocated bytes by category over the trace (stacked), the peak and OOMs marked."""
    t = f.timeline
    if t is None or not t.positions or not t.series:
        return None
    fig = new_figure(10.0, 3.9)
    ax = fig.subplots()
    scale, unit = unit_for(max(f.peak_allocated_bytes, 1))
    looks = [category_style(name) for name, _ in t.series]
    stacks = ax.stackplot(
        t.positions,
        *[[v / scale for v in values] for _, values in t.series],
        colors=[look["color"] for look in looks],
        edgecolor="#333333",
        linewidth=0.3,
    )
    for area, look in zip(stacks, looks, strict=True):
        area.set_hatch(look["hatch"])
    peak = f.peak_allocated_bytes / scale
    ax.set_ylim(0, peak * 1.25 if peak else 1)
    if f.peak_index is not None and f.peak_index >= 0:
        ax.axvline(f.peak_index, color="black", linestyle="--", linewidth=1)
        # Above the stack, on the side with room: never under the legend (which sits
        # outside the axes) nor off the figure.
        left = f.peak_index > (t.positions[0] + t.positions[-1]) / 2
        ax.annotate(
            f"peak {format_bytes(f.peak_allocated_bytes)}",
            (f.peak_index, peak),
            textcoords="offset points",
            xytext=(-6 if left else 6, 4),
            ha="right" if left else "left",
            va="bottom",
            fontsize=8,
            fontweight="bold",
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none"},
        )
    for o in f.ooms:
        ax.axvline(o.index, color="#B2182B", linewidth=1.2)
    handles = [
        Patch(
            facecolor=look["color"],
            hatch=look["hatch"],
            edgecolor="#333333",
            label=clean_text(name),
        )
        for (name, _), look in zip(t.series, looks, strict=True)
    ]
    if f.ooms:
        handles.append(Patch(facecolor="#B2182B", label="OOM (failed request)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xlim(t.positions[0], max(t.positions[-1], t.positions[0] + 1))
    ax.set_xlabel("trace entry")
    ax.set_ylabel(f"allocated ({unit})")
    ax.set_title(f"Device {f.device}: allocated bytes by category")
    return to_png(fig)


@dataclass(frozen=True)
class _Oom:
    s: OomSummary
    entry: str
    requested: str
    device_free: str
    allocated: str
    reserved: str
    free_in_reserved: str
    largest_free: str


def _exact(n: int | None) -> str:
    return "unknown" if n is None else f"{format_bytes(n)} ({n:,} bytes)"


def _oom(s: OomSummary) -> _Oom:
    return _Oom(
        s,
        entry=f"{s.entry:,}",
        requested=_exact(s.requested_bytes),
        device_free=_exact(s.device_free_bytes),
        allocated=_exact(s.allocated_bytes),
        reserved=_exact(s.reserved_bytes),
        free_in_reserved=_exact(s.free_in_reserved_bytes),
        largest_free=_exact(s.largest_free_block),
    )


@dataclass(frozen=True)
class _Device:
    device: int
    headline: str
    timeline: Figure
    breakdown: Table
    shapes: str
    confidence: str
    evidence: tuple[str, ...]
    groups: Table
    family: Table | None
    family_count: int
    no_family: str
    report: str


def _device(f: Findings) -> _Device:
    total = f.peak_allocated_bytes or 1
    breakdown = Table(
        [("category", False), ("bytes", True), ("share", True)],
        [
            [Cell(c), bytes_cell(b), Cell(f"{100 * b / total:.1f}%", b / total, numeric=True)]
            for c, b in f.breakdown
        ],
    )
    groups = Table(
        [("count", True), ("size", True), ("total", True), ("category", False), ("why", False),
         ("op", False), ("line", False)],
        [
            [Cell(str(g.count), g.count, numeric=True), bytes_cell(g.size),
             bytes_cell(g.total_bytes), Cell(g.category), Cell(g.reason),
             Cell(op_text(g.op or "?", g.kernel)), Cell(describe_frame(g.frame), mono=True)]
            for g in f.groups[:30]
        ],
    )  # fmt: skip
    family = f.logits_family
    rows = []
    for b in family:
        what = b.explanations[0].describe() if b.explanations else f"{b.dtype} {b.shape}"
        freed = "still live" if b.free_index is None else f"#{b.free_index}"
        rows.append(
            [bytes_cell(b.size), Cell(what), Cell(b.phase or "?"),
             Cell(op_text(b.op or "?", b.kernel)), Cell(describe_frame(b.frame), mono=True),
             Cell("yes" if b.live_at_peak else "no"),
             Cell(freed)]
        )  # fmt: skip
    inf = f.inference
    return _Device(
        device=f.device,
        headline=headline(f),
        timeline=Figure(
            timeline_png(f),
            "allocated bytes by category over the trace",
            missing="No trace over time in this snapshot: no timeline.",
        ),
        breakdown=breakdown,
        shapes=inf.shape_text(),
        confidence=str(inf.confidence),
        evidence=tuple(inf.evidence),
        groups=groups,
        family=Table(
            [
                ("size", True),
                ("shape", False),
                ("phase", False),
                ("op", False),
                ("line", False),
                ("live at peak", False),
                ("freed", False),
            ],
            rows,
        )
        if rows
        else None,  # fmt: skip
        family_count=len(family),
        no_family=str(inf.evidence[0]) if not inf.logits_path and inf.evidence else "none found",
        report="\n".join(render_findings(f)),
    )


def attribute_page(all_findings: tuple[Findings, ...], *, title: str) -> str:
    """The page for every device attributed (the device that hit an OOM first)."""
    return render_page(
        "attribute.html",
        title=title,
        headline=headline(all_findings[0]) if all_findings else "",
        ooms=[_oom(s) for f in all_findings for s in oom_summaries(f)],
        devices=[_device(f) for f in all_findings],
    )


def write_attribute_page(
    all_findings: tuple[Findings, ...], path: str | os.PathLike[str], *, title: str
) -> Path:
    out = Path(path)
    return write_atomic(out, attribute_page(all_findings, title=title), what="HTML page")
