"""The report's charts: peak against tokens and vocabulary, the breakdown, numerics.

Each function takes plain data (a DataFrame slice, breakdowns) and returns PNG
bytes, or None when the run has nothing to draw for it (one token count only, no
numerics). Legends sit outside the axes so they never hide a line. The timeline
figure lives in :mod:`memprobe.render.timeline`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from memprobe.io.sizes import format_bytes
from memprobe.records import dtype_bytes
from memprobe.render.canvas import clean_text, new_figure, styled, to_png, unit_for
from memprobe.render.style import (
    BUDGET_STYLE,
    CATEGORY_STYLE,
    FLOOR_STYLE,
    Look,
    power_of_two_ticks,
)
from memprobe.report.breakdown import CATEGORIES, Breakdown
from memprobe.report.headline import Headline, vs_reference
from memprobe.results import missing

# The numerics plot's log axis spans whole decades a float holds as normal numbers (a
# results file takes errors up to 1e100; a kernel's can be subnormal).
_LOWEST_DECADE, _HIGHEST_DECADE = -307, 307


def _bytes_axis_log(ax: Axes, low: float, high: float) -> None:
    ax.set_yscale("log", base=2)
    ax.set_ylim(low / 1.3, high * 1.3)
    ax.yaxis.set_major_locator(FixedLocator(power_of_two_ticks(low / 1.3, high * 1.3)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(True, which="major", axis="both", color="#E5E5E5", linewidth=0.7)


def _count_axis_log(ax: Axes, values: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(values))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_locator(NullLocator())
    # Ladders end on an odd top value (16,384 then 20,000): tilt so neighbours never collide.
    if len(ticks) > 1 and min(b / a for a, b in zip(ticks, ticks[1:], strict=False)) < 1.6:
        for label in ax.get_xticklabels():
            label.set_rotation(30)
            label.set_horizontalalignment("right")


def _series(rows: pd.DataFrame, axis: str) -> list[tuple[str, str, int, pd.DataFrame]]:
    """(kernel, label, variant, rows sorted by ``axis``) per line. A kernel gets one line
    per chunk size only where chunk size changes its peaks; ``variant`` numbers them."""
    out = []
    for kernel in dict.fromkeys(rows["kernel"]):
        mine = rows[rows["kernel"] == kernel]
        chunks = list(dict.fromkeys(mine["chunk_size"]))
        by_chunk = {c: mine[mine["chunk_size"] == c].sort_values(axis) for c in chunks}
        if len(chunks) > 1 and len({tuple(r["peak_bytes"]) for r in by_chunk.values()}) > 1:
            for i, (c, sub) in enumerate(by_chunk.items()):
                label = clean_text(kernel)
                label = label if missing(c) else f"{label} (chunk {int(c):,})"
                out.append((str(kernel), label, i, sub))
        else:
            out.append((str(kernel), clean_text(kernel), 0, by_chunk[chunks[0]]))
    return out


def _floor_label(floor: float, logits: float) -> str:
    if math.isclose(floor, logits):
        return "floor: logits only (gradient in place)"
    if math.isclose(floor, 2 * logits):
        return "floor: logits + gradient"
    return "floor"


@styled
def peak_vs(
    rows: pd.DataFrame, axis: str, looks: dict[str, Look], headline: Headline
) -> bytes | None:
    """Peak memory against ``axis`` ('tokens' or 'vocab'), log-log, floor dashed, budget line."""
    other = "vocab" if axis == "tokens" else "tokens"
    fixed = getattr(headline, other)
    rows = rows[(rows[other] == fixed) & (rows["status"] == "ok") & rows["peak_bytes"].notna()]
    xs = sorted(set(int(x) for x in rows[axis]))
    if len(xs) < 2:
        return None
    fig = new_figure(9.0, 4.6)
    ax = fig.subplots()
    values: list[float] = []
    for kernel, label, variant, mine in _series(rows, axis):
        look = looks[kernel]
        y = mine["peak_bytes"].astype(float).to_numpy()
        values.extend(y)
        # A kernel's further chunk sizes: same colour and marker, hollow, thinner line.
        ax.plot(
            mine[axis],
            y,
            label=label,
            color=look.color,
            marker=look.marker,
            markerfacecolor=look.color if variant == 0 else "white",
            linestyle=look.linestyle,
            linewidth=1.6 if variant == 0 else 1.0,
            markersize=5.5 + variant,
        )
    floors = rows.drop_duplicates([axis, "floor_bytes"])[[axis, "floor_bytes"]].dropna()
    width = dtype_bytes(headline.dtype)
    seen: set[str] = set()
    for floor_series in _floor_lines(floors, axis):
        floor_x, floor_y = zip(*floor_series, strict=True)
        values.extend(floor_y)
        logits = width * headline.batch * _local(floor_x[-1], fixed, axis, headline)
        label = _floor_label(floor_y[-1], logits)
        style = dict(FLOOR_STYLE)
        if "logits only" in label:
            style["color"] = "#9A9A9A"  # lighter: the two floors stay apart in greyscale
        ax.plot(floor_x, floor_y, label=label if label not in seen else None, **style)
        seen.add(label)
    top = max(values)
    if headline.budget_bytes is not None:
        ax.axhline(
            headline.budget_bytes,
            label=f"budget {format_bytes(headline.budget_bytes)}",
            **BUDGET_STYLE,
        )
        top = max(top, headline.budget_bytes)
    _bytes_axis_log(ax, min(values), top)
    _count_axis_log(ax, xs)
    what = "tokens (sequence length)" if axis == "tokens" else "vocabulary size"
    ax.set_xlabel(f"{what}, log scale")
    ax.set_ylabel("peak memory, log scale")
    fixed_what = f"{fixed:,} vocabulary" if axis == "tokens" else f"{fixed:,} tokens"
    config = f"{headline.dtype}, batch {headline.batch:,}"
    ax.set_title(f"Peak memory vs {what.split(' ')[0]} at {fixed_what} ({config})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return to_png(fig)


def _local(x: float, fixed: int, axis: str, h: Headline) -> float:
    tokens, vocab = (x, fixed) if axis == "tokens" else (fixed, x)
    return (tokens // h.cp) * (vocab // h.tp)


def _floor_lines(floors: pd.DataFrame, axis: str) -> list[list[tuple[float, float]]]:
    """Distinct floor curves: at each x the floors sorted, the i-th floors joined."""
    by_x: dict[float, list[float]] = {}
    for x, f in zip(floors[axis], floors["floor_bytes"], strict=True):
        by_x.setdefault(float(x), []).append(float(f))
    depth = max(len(v) for v in by_x.values())
    lines = []
    for i in range(depth):
        line = [(x, sorted(v)[i]) for x, v in sorted(by_x.items()) if i < len(v)]
        if len(line) > 1:
            lines.append(line)
    return lines


@styled
def breakdown_bars(parts: list[Breakdown], headline: Headline) -> bytes | None:
    """At the largest case: one horizontal bar per kernel, split by what made the peak."""
    # A peak of no bytes has no bar (a trace whose allocations are all of 0 bytes): with
    # nothing else to draw, the empty legend ended `report` in matplotlib's ValueError.
    parts = [b for b in parts if b.peak_bytes > 0]
    if not parts:
        return None
    by_kernel = {k.kernel: k for k in headline.kernels}
    fig = new_figure(9.0, 0.55 * len(parts) + 1.6)
    ax = fig.subplots()
    ypos = np.arange(len(parts))
    scale, unit = unit_for(max(b.peak_bytes for b in parts))
    used = [c for c in CATEGORIES if any(b.parts[c] for b in parts)]
    for category in used:
        left = np.array(
            [sum(b.parts[c] for c in CATEGORIES[: CATEGORIES.index(category)]) for b in parts]
        )
        width = np.array([b.parts[category] for b in parts], dtype=float)
        style = CATEGORY_STYLE[category]
        ax.barh(
            ypos,
            width / scale,
            left=left / scale,
            height=0.62,
            color=style["color"],
            hatch=style["hatch"],
            edgecolor="#333333",
            linewidth=0.5,
            label=category,
        )
    top = max(b.peak_bytes for b in parts)
    for y, b in zip(ypos, parts, strict=True):
        k = by_kernel.get(b.kernel)
        note = f"{format_bytes(b.peak_bytes)}"
        if k is not None and k.ok:
            note += f" · {vs_reference(k)}"
        ax.text(b.peak_bytes / scale + top / scale * 0.01, float(y), note, va="center", fontsize=8)
    if headline.budget_bytes is not None and headline.budget_bytes < top * 1.6:
        ax.axvline(headline.budget_bytes / scale, **BUDGET_STYLE)
        ax.text(
            headline.budget_bytes / scale,
            len(parts) - 0.45,
            f" budget {format_bytes(headline.budget_bytes)}",
            color=BUDGET_STYLE["color"],
            fontsize=8,
            va="bottom",
        )
    ax.set_yticks(ypos, [clean_text(b.kernel) for b in parts])
    ax.invert_yaxis()
    ax.set_xlim(0, top / scale * 1.38)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.4g} {unit}"))
    ax.grid(True, axis="x", color="#E5E5E5", linewidth=0.7)
    ax.set_axisbelow(True)
    ax.set_xlabel("bytes live at the peak")
    ax.set_title(
        f"What makes each peak at {headline.tokens:,} tokens × {headline.vocab:,} vocabulary"
    )
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=min(len(used), 3))
    return to_png(fig)


@styled
def numerics(frame: pd.DataFrame, kernels: list[str]) -> bytes | None:
    """Worst forward and backward deviation from float64 per kernel × dtype."""
    cols = ["max_abs_err_fwd", "max_abs_err_bwd"]
    have = frame.dropna(subset=cols, how="all")
    if have.empty:
        return None
    worst = have.groupby(["kernel", "dtype"], sort=False)[cols].max().reset_index()
    dtypes = list(dict.fromkeys(worst["dtype"]))
    names = [k for k in kernels if k in set(worst["kernel"])]
    fig = new_figure(9.0, 0.36 * len(names) * max(1, len(dtypes)) + 1.5)
    axes = fig.subplots(1, 2, sharey=True)
    hatches = ("", "//", "..", "xx")
    greys = ("#0072B2", "#E69F00", "#7F7F7F", "#009E73")
    height = 0.8 / len(dtypes)
    titles = ("forward: log-probs", "backward: gradient")
    for ax, col, what in zip(axes, cols, titles, strict=True):
        values = []
        for j, dt in enumerate(dtypes):
            sub = worst[worst["dtype"] == dt].set_index("kernel")
            ys = np.arange(len(names)) + (j - (len(dtypes) - 1) / 2) * height
            vals = [float(sub[col].get(k, np.nan)) if k in sub.index else np.nan for k in names]
            values += [v for v in vals if not missing(v) and v > 0]
            ax.barh(
                ys,
                [v if not missing(v) and v > 0 else 0 for v in vals],
                height=height * 0.9,
                color=greys[j % len(greys)],
                hatch=hatches[j % len(hatches)],
                edgecolor="#333333",
                linewidth=0.5,
                label=dt,
            )
            for y, v in zip(ys, vals, strict=True):
                if not missing(v):
                    ax.text(v if v > 0 else 1e-12, y, f" {v:.1e}", va="center", fontsize=7)
        if values:
            # Whole decades, labelled only there: minor labels on a short log axis collide.
            # Float decades, within a float's normal range: an int power (10 ** 19 past
            # int64) is no limit numpy takes, and half a subnormal error is 0 (no log).
            low = math.floor(math.log10(min(values)) - math.log10(2))
            low = min(max(low, _LOWEST_DECADE), _HIGHEST_DECADE - 1)
            high = math.ceil(math.log10(max(values)) + math.log10(6))
            limits = (10.0**low, 10.0 ** min(max(high, low + 1), _HIGHEST_DECADE))
        else:
            # Every error exactly 0: the decades around where their labels are drawn (a log
            # axis has no 0, and autoscaling one with no positive value only warns).
            limits = (1e-13, 1e-10)
        ax.set_xlim(*limits)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(what, fontsize=9)
        ax.set_xlabel("worst |error| vs float64, log scale")
        ax.grid(True, axis="x", color="#E5E5E5", linewidth=0.7)
        ax.set_axisbelow(True)
    axes[0].set_yticks(np.arange(len(names)), [clean_text(k) for k in names])
    axes[0].invert_yaxis()
    if len(dtypes) > 1:
        axes[1].legend(title="logits dtype", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(
        "Numerics: each kernel × dtype against a float64 reference at a small CPU shape",
        fontweight="bold",
        fontsize=10,
    )
    fig.tight_layout()
    return to_png(fig)


__all__ = ["breakdown_bars", "numerics", "peak_vs"]
