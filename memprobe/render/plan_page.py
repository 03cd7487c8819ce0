"""``memprobe plan --out DIR``: plan.html (self-contained, offline), plan.png, plan.json.

The plot draws each plan's simulated peaks against tokens per GPU (every point the
search simulated, joined; reserved peaks dashed where planned), the step's share of
the budget as a line, and a mark at each answer. The page is
``templates/plan.html`` on the shared base page; the plot goes through the one canvas.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from memprobe.io.files import write_atomic
from memprobe.io.sizes import format_bytes
from memprobe.plan import Budget, TokenPlan
from memprobe.render.canvas import clean_text, new_figure, styled, to_png
from memprobe.render.plan_text import count_column, line_check
from memprobe.render.style import BUDGET_STYLE, kernel_looks, power_of_two_ticks
from memprobe.render.templating import Cell, Figure, Table, bytes_cell, render_page


def _label(p: TokenPlan) -> str:
    t = p.target
    parts = [clean_text(t.kernel)]
    if t.tp > 1 or t.cp > 1:
        parts.append(f"tp{t.tp} cp{t.cp}")
    if t.chunk_size is not None:
        parts.append(f"c{t.chunk_size}")
    return " ".join(parts)


def _log2_axis(ax: Axes, which: str, low: float, high: float, label: Any) -> None:
    """Powers of two, thinned so labels never collide, each labelled in words."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log", base=2)
    (ax.set_ylim if which == "y" else ax.set_xlim)(low / 1.3, high * 1.3)
    axis.set_major_locator(FixedLocator(power_of_two_ticks(low / 1.3, high * 1.3, max_ticks=8)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: label(v)))
    axis.set_minor_locator(NullLocator())


def _counted(plans: Sequence[TokenPlan]) -> str:
    """What the x axis counts: the table's unit (per sequence at --batch > 1)."""
    from memprobe.render.plan_text import count_column

    return "tokens per sequence" if count_column(plans) == "tokens/seq" else "tokens per GPU"


@styled
def plot_png(plans: Sequence[TokenPlan], budget: Budget) -> bytes:
    """Peak per rank against tokens per GPU, log-log, with the limit and the answers."""
    return to_png(plan_figure(plans, budget))


def plan_figure(plans: Sequence[TokenPlan], budget: Budget) -> MplFigure:
    """The figure :func:`plot_png` draws (call under :func:`styled`)."""
    fig = new_figure(9.0, 4.8)
    ax = fig.subplots()
    looks = kernel_looks(list(dict.fromkeys(p.target.kernel for p in plans)))
    # A kernel keeps its colour across chunk sizes; the second and later sizes get
    # hollow markers, so two sizes of one kernel never draw as one look.
    sizes: dict[str, list[int | None]] = {}
    for p in plans:
        sizes.setdefault(p.target.kernel, [])
        if p.target.chunk_size not in sizes[p.target.kernel]:
            sizes[p.target.kernel].append(p.target.chunk_size)
    xs: list[float] = []
    ys: list[float] = []
    for p in plans:
        look = looks[p.target.kernel]
        rank = sizes[p.target.kernel].index(p.target.chunk_size)
        searches = [(p.allocated, "-", "")]
        if p.reserved is not None:
            searches.append((p.reserved, ":", " (reserved)"))
        for search, style, what in searches:
            pts = [(t, peak) for t, peak in search.points if t > 0 and peak > 0]
            if not pts:
                continue
            xs += [t for t, _ in pts]
            ys += [peak for _, peak in pts]
            ax.plot(
                [t for t, _ in pts],
                [peak for _, peak in pts],
                marker=look.marker,
                markersize=3.5 + rank,
                markerfacecolor=look.color if rank == 0 else "white",
                color=look.color,
                linestyle=style,
                linewidth=1.4 if rank == 0 else 1.0,
                label=_label(p) + what,
            )
            if search.max_tokens > 0 and search.peak_at_max is not None:
                ax.plot(
                    [search.max_tokens],
                    [search.peak_at_max],
                    marker="D",
                    markersize=7,
                    color=look.color,
                    markeredgecolor="black",
                    linestyle="none",
                )
    limit = budget.limit_bytes
    if limit > 0:
        ys.append(limit)
        ax.axhline(limit, **BUDGET_STYLE)
        ax.annotate(
            f"budget − other = {format_bytes(limit)}",
            (0.01, limit),
            xycoords=("axes fraction", "data"),
            va="bottom",
            fontsize=8,
            color=BUDGET_STYLE["color"],
        )
    if xs and ys:
        _log2_axis(ax, "x", min(xs), max(xs), lambda v: f"{v:,.0f}")
        _log2_axis(ax, "y", min(ys), max(ys), format_bytes)
        for text in ax.get_xticklabels():
            text.set_rotation(30)
            text.set_horizontalalignment("right")
    ax.grid(True, which="major", color="#E5E5E5", linewidth=0.7)
    ax.set_xlabel(f"{_counted(plans)}, log scale")
    ax.set_ylabel("simulated peak per rank, log scale")
    ax.set_title("Peak against tokens; diamonds mark the largest count that fits")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _table(plans: Sequence[TokenPlan]) -> Table:
    with_reserved = any(p.reserved is not None for p in plans)
    per = count_column(plans)
    headers = [
        ("kernel", False), ("tp", True), ("cp", True), ("chunk", True), (per, True),
        ("global tokens", True), ("peak at max", True), ("peak at max+1", True),
        ("per token", True), ("fixed", True), ("line", False),
    ]  # fmt: skip
    if with_reserved:
        headers += [(f"{per} (reserved)", True), ("reserved peak at max", True)]
    rows = []
    for p in plans:
        a, t = p.allocated, p.target
        cells = [
            Cell(t.kernel),
            Cell(str(t.tp), t.tp, numeric=True),
            Cell(str(t.cp), t.cp, numeric=True),
            Cell("-" if t.chunk_size is None else str(t.chunk_size), t.chunk_size, numeric=True),
            Cell(f"{p.max_tokens:,}", p.max_tokens, numeric=True),
            Cell(f"{p.global_tokens:,}", p.global_tokens, numeric=True),
            bytes_cell(a.peak_at_max),
            bytes_cell(a.peak_above),
            bytes_cell(a.line.slope),
            bytes_cell(a.line.fixed),
            Cell(line_check(p)),
        ]
        if with_reserved:
            r = p.reserved
            cells += [
                Cell("-", None, numeric=True)
                if r is None
                else Cell(f"{r.max_tokens:,}", r.max_tokens, numeric=True),
                bytes_cell(None if r is None else r.peak_at_max),
            ]
        rows.append(cells)
    return Table(headers, rows, sortable=True)


def page_html(plans: Sequence[TokenPlan], budget: Budget, png: bytes, answer: str) -> str:
    return render_page(
        "plan.html",
        title="memprobe plan",
        sortable=True,
        answer=answer,
        budget=format_bytes(budget.budget_bytes),
        other=format_bytes(budget.other_bytes),
        in_step=format_bytes(budget.in_step_bytes) if budget.in_step_bytes else None,
        limit=format_bytes(budget.limit_bytes),
        plot=Figure(png or None, f"simulated peak against {_counted(plans)}", missing="No plot."),
        rows=_table(plans),
    )


# What ``--out DIR`` holds: the page, its plot and the rows.
PLAN_FILES = ("plan.html", "plan.png", "plan.json")
# What each is called in a line about it (write_atomic's ``what``).
PLAN_FILE_WHAT = ("plan", "plan plot", "plan rows")


def write_plan_page(
    out_dir: Path, plans: Sequence[TokenPlan], budget: Budget, rows: list[dict[str, Any]]
) -> tuple[Path, ...]:
    from memprobe.render.plan_text import answer_line

    png = plot_png(plans, budget)
    answer = answer_line(plans, budget)
    html, image, table = PLAN_FILES
    said_html, said_image, said_table = PLAN_FILE_WHAT
    return (
        write_atomic(out_dir / html, page_html(plans, budget, png, answer), what=said_html),
        write_atomic(out_dir / image, png, what=said_image),
        write_atomic(out_dir / table, json.dumps(rows, indent=1), what=said_table),
    )
