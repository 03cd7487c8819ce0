"""A self-contained HTML page of ``memprobe attribute`` on a real snapshot.

One page per snapshot: per device, the timeline of allocated bytes by category with
the peak marked (a PNG embedded as a data URI), what the peak is made of, the
inferred shapes, identical blocks grouped, every logits-family block, the OOMs and
the allocator's view. Offline: no scripts, no external links. Every text is escaped.
"""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path

from memprobe.attribute.findings import Findings
from memprobe.attribute.frames import describe_frame
from memprobe.io.files import write_atomic
from memprobe.io.sizes import format_bytes, gib
from memprobe.render.findings_text import render_findings

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:75em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
.mono{font-family:ui-monospace,monospace;font-size:.9em}pre{background:#f8f8f8;padding:1em;overflow:auto}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _timeline_png(f: Findings) -> str | None:
    """The stacked timeline as a base64 PNG, or None when there is nothing to draw."""
    t = f.timeline
    if t is None or not t.positions or not t.series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.6), dpi=100)
    ax.stackplot(
        t.positions,
        *[[gib(v) for v in values] for _, values in t.series],
        labels=[name for name, _ in t.series],
        alpha=0.85,
    )
    if f.peak_index is not None and f.peak_index >= 0:
        ax.axvline(f.peak_index, color="black", linestyle="--", linewidth=1)
        ax.annotate(
            f"peak {format_bytes(f.peak_allocated_bytes)}",
            (f.peak_index, gib(f.peak_allocated_bytes)),
            textcoords="offset points",
            xytext=(-90, -12),
            fontsize=8,
        )
    for o in f.ooms:
        ax.axvline(o.index, color="red", linewidth=1)
    ax.set_xlabel("trace entry")
    ax.set_ylabel("allocated (GiB)")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _table(
    headers: list[str], rows: list[list[str]], numeric: frozenset[int] | set[int] = frozenset()
) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _device_section(f: Findings) -> str:
    parts = [f"<h2>Device {f.device}</h2>"]
    png = _timeline_png(f)
    if png:
        parts.append(
            f'<img alt="allocated bytes by category over the trace" '
            f'src="data:image/png;base64,{png}">'
        )
    total = f.peak_allocated_bytes or 1
    parts.append("<h3>What the peak is made of</h3>")
    parts.append(
        _table(
            ["category", "bytes", "share"],
            [[c, format_bytes(b), f"{100 * b / total:.1f}%"] for c, b in f.breakdown],
            {1, 2},
        )
    )
    inf = f.inference
    parts.append("<h3>Inferred shapes</h3>")
    parts.append(
        f"<p>{_e(inf.shape_text())}, confidence {_e(inf.confidence)}</p><ul>"
        + "".join(f"<li>{_e(r)}</li>" for r in inf.evidence)
        + "</ul>"
    )
    parts.append("<h3>Identical blocks live at the peak</h3>")
    parts.append(
        _table(
            ["count", "size", "total", "category", "op", "line"],
            [
                [
                    str(g.count),
                    format_bytes(g.size),
                    format_bytes(g.total_bytes),
                    g.category,
                    g.op or "?",
                    describe_frame(g.frame),
                ]
                for g in f.groups[:30]
            ],  # fmt: skip
            {0, 1, 2},
        )
    )
    family = f.logits_family
    parts.append(f"<h3>Logits-family blocks ({len(family)})</h3>")
    if family:
        rows = []
        for b in family:
            what = b.explanations[0].describe() if b.explanations else f"{b.dtype} {b.shape}"
            freed = "still live" if b.free_index is None else f"#{b.free_index}"
            rows.append(
                [format_bytes(b.size), what, b.phase or "?", b.op or "?",
                 describe_frame(b.frame), "yes" if b.live_at_peak else "no", freed]
            )  # fmt: skip
        parts.append(
            _table(["size", "shape", "phase", "op", "line", "live at peak", "freed"], rows, {0})
        )
    else:
        parts.append(f"<p>{_e(inf.evidence[0] if not inf.logits_path else 'none found')}</p>")
    parts.append("<h3>Full report</h3>")
    parts.append(f'<pre class="mono">{_e(chr(10).join(render_findings(f)))}</pre>')
    return "\n".join(parts)


def attribute_page(all_findings: tuple[Findings, ...], *, title: str) -> str:
    sections = "\n".join(_device_section(f) for f in all_findings)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{_e(title)}</h1>{sections}</body></html>\n"
    )


def write_attribute_page(
    all_findings: tuple[Findings, ...], path: str | os.PathLike[str], *, title: str
) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(out, attribute_page(all_findings, title=title), what="HTML page")
