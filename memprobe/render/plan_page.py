"""``memprobe plan --out DIR``: plan.html (self-contained, offline), plan.png, plan.json.

The plot draws each plan's simulated peaks against tokens per GPU (every point
the search simulated, joined), the step's share of the budget as a line, and a
mark at each answer. Every text that comes from data is escaped.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from memprobe.io.files import write_atomic
from memprobe.io.sizes import format_bytes
from memprobe.plan import Budget, TokenPlan

_GIB = 2**30


def _label(p: TokenPlan) -> str:
    t = p.target
    parts = [t.kernel]
    if t.tp > 1 or t.cp > 1:
        parts.append(f"tp{t.tp} cp{t.cp}")
    if t.chunk_size is not None:
        parts.append(f"c{t.chunk_size}")
    return " ".join(parts)


def plot_png(plans: Sequence[TokenPlan], budget: Budget) -> bytes:
    """Peak (GiB, per rank) against tokens per GPU, log-log, with the limit and the answers."""
    fig = Figure(figsize=(8, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    limit = budget.limit_bytes / _GIB
    for p in plans:
        pts = [(t, peak) for t, peak in p.allocated.points if t > 0]
        if not pts:
            continue
        (line,) = ax.plot(
            [t for t, _ in pts], [peak / _GIB for _, peak in pts], marker=".", label=_label(p)
        )
        if p.fits_at_all and p.allocated.peak_at_max is not None:
            ax.plot(
                [p.max_tokens], [p.allocated.peak_at_max / _GIB], marker="D", color=line.get_color()
            )
    if limit > 0:
        ax.axhline(limit, color="black", linestyle="--", linewidth=1)
        ax.annotate(
            f"budget - other = {format_bytes(budget.limit_bytes)}",
            (0.01, limit),
            xycoords=("axes fraction", "data"),
            va="bottom",
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per GPU")
    ax.set_ylabel("simulated peak per rank (GiB)")
    ax.set_title("Peak against tokens; diamonds mark the largest count that fits")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    # Kernel names come from data: "$" must print, never start mathtext.
    for text in ax.get_legend().get_texts():
        text.set_usetex(False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _cell(value: Any) -> str:
    return f"<td>{html.escape(str(value))}</td>"


def page_html(plans: Sequence[TokenPlan], budget: Budget, png: bytes, answer: str) -> str:
    e = html.escape
    rows = []
    for p in plans:
        a = p.allocated
        rows.append(
            "<tr>"
            + "".join(
                _cell(v)
                for v in (
                    p.target.kernel,
                    p.target.tp,
                    p.target.cp,
                    "-" if p.target.chunk_size is None else p.target.chunk_size,
                    f"{p.max_tokens:,}",
                    f"{p.global_tokens:,}",
                    format_bytes(a.peak_at_max),
                    format_bytes(a.peak_above),
                    format_bytes(a.line.slope),
                    format_bytes(a.line.fixed),
                    "exact" if a.predicted == a.max_tokens else f"said {a.predicted}",
                )
            )
            + "</tr>"
        )
    head = "".join(
        f"<th>{e(h)}</th>"
        for h in (
            "kernel",
            "tp",
            "cp",
            "chunk",
            "tokens/GPU",
            "global tokens",
            "peak at max",
            "peak at max+1",
            "per token",
            "fixed",
            "line",
        )
    )
    image = base64.b64encode(png).decode("ascii")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>memprobe plan</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 2em; max-width: 72em; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 8px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} tr:nth-child(even) {{ background: #f3f3f3; }}
.answer {{ font-weight: bold; }}
</style></head><body>
<h1>How many tokens per GPU fit</h1>
<p class="answer">{e(answer)}</p>
<p>Budget {e(format_bytes(budget.budget_bytes))} minus {e(format_bytes(budget.other_bytes))}
for the rest of the job leaves {e(format_bytes(budget.limit_bytes))} for the logprob step.
Peaks are allocated bytes on one rank, simulated exactly on meta tensors; each answer is the
largest count whose peak fits while one token more does not.</p>
<img alt="simulated peak against tokens per GPU" src="data:image/png;base64,{image}">
<table><thead><tr>{head}</tr></thead><tbody>
{"".join(rows)}
</tbody></table>
</body></html>
"""


def write_plan_page(
    out_dir: Path, plans: Sequence[TokenPlan], budget: Budget, rows: list[dict[str, Any]]
) -> tuple[Path, ...]:
    from memprobe.render.plan_text import answer_line

    png = plot_png(plans, budget)
    answer = answer_line(plans, budget)
    return (
        write_atomic(out_dir / "plan.html", page_html(plans, budget, png, answer), what="plan"),
        write_atomic(out_dir / "plan.png", png, what="plan plot"),
        write_atomic(out_dir / "plan.json", json.dumps(rows, indent=1), what="plan rows"),
    )
