"""The memory timeline figure: live bytes over each kernel's trace at the largest case.

Forward and backward are shaded (and hatched, so they differ in greyscale); each
float32 ``[B, S, V]`` block is a band labelled with the op and phase that made it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from memprobe.io.sizes import format_bytes
from memprobe.records import Case
from memprobe.render.canvas import clean_text, new_figure, styled, to_png, unit_for
from memprobe.render.style import CATEGORY_STYLE, PHASE_SHADE, Look, short_op
from memprobe.report.breakdown import FP32_BSV, gradient_block, is_fp32_bsv
from memprobe.report.headline import Headline
from memprobe.report.trace import Trace


@styled
def timelines(
    traces: dict[str, Trace], case: Case, looks: dict[str, Look], headline: Headline
) -> bytes | None:
    """Live bytes over each kernel's trace; float32 [B,S,V] blocks as labelled bands.

    Each panel has its own y scale: the breakdown figure compares sizes across
    kernels, this one shows the shape of each step (a shared scale flattens the
    chunked kernels to a line).
    """
    if not traces:
        return None
    n = len(traces)
    height = 1.7 * n + 0.7
    fig = new_figure(9.0, height)
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    panels = [
        (_draw_timeline(ax, kernel, trace, case, looks[kernel]), ax)
        for ax, (kernel, trace) in zip(axes, traces.items(), strict=True)
    ]
    axes[-1].set_xlabel("position in the allocation trace (allocations and frees, in order)")
    handles = [
        Patch(facecolor=PHASE_SHADE["forward"], edgecolor="#999999", label="forward"),
        Patch(
            facecolor=PHASE_SHADE["backward"],
            edgecolor="#999999",
            hatch=BACKWARD_HATCH,
            label="backward",
        ),
        Patch(
            facecolor=CATEGORY_STYLE[FP32_BSV]["color"],
            hatch=CATEGORY_STYLE[FP32_BSV]["hatch"],
            edgecolor="#333333",
            label="float32 [B,S,V] block (op, phase it was made in)",
        ),
        Patch(facecolor=REST_COLOUR, edgecolor="#333333", label="everything else live"),
    ]
    fig.legend(
        handles=handles, loc="upper center", ncol=4, bbox_to_anchor=(0.5, 1.0 - 0.05 / height)
    )
    fig.suptitle(
        f"Memory over the step at {headline.tokens:,} tokens × {headline.vocab:,} vocabulary",
        fontweight="bold",
        fontsize=10,
        y=1.0 + 0.2 / height,
    )
    _lay_out(fig, n, height)
    # Labels go on after layout, where their on-screen boxes are final: one that would
    # overlap an earlier label (or leave its panel) is dropped, never drawn over.
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for labels, ax in panels:
        _place_labels(ax, labels, renderer)
    return to_png(fig)


# The panels' margins, in inches: room for the legend and suptitle above the first panel's
# title, for each panel's title and the x tick labels of the panel above it, and for the
# last axis' label. Fixed, not found by tight_layout (a third of the figure's time, for a
# layout that only ever moves by a tick label's width): to_png crops to what is drawn.
_TOP_IN, _GAP_IN, _BOTTOM_IN, _LEFT_IN, _RIGHT_IN = 0.75, 0.62, 0.5, 0.8, 0.12


def _lay_out(fig: Figure, panels: int, height: float) -> None:
    width = fig.get_figwidth()
    axes_in = (height - _TOP_IN - _BOTTOM_IN - _GAP_IN * (panels - 1)) / panels
    fig.subplots_adjust(
        left=_LEFT_IN / width,
        right=1 - _RIGHT_IN / width,
        top=1 - _TOP_IN / height,
        bottom=_BOTTOM_IN / height,
        hspace=_GAP_IN / axes_in,
    )


BACKWARD_HATCH = "////"
REST_COLOUR = "#BDBDBD"
# A label to place: its text and the positions to try, (x, y, annotate kwargs) each.
_Label = tuple[str, list[tuple[float, float, dict[str, Any]]]]


def _draw_timeline(ax: Axes, kernel: str, trace: Trace, case: Case, look: Look) -> list[_Label]:
    x = np.arange(trace.length + 1)
    live_bytes = trace.live_bytes()
    scale, unit = unit_for(trace.peak_bytes)
    total = np.append(live_bytes, live_bytes[-1:] if trace.length else [0]) / scale
    top = max(float(total.max()), 1e-9) * 1.3
    labels: list[_Label] = []
    peak = trace.peak_pos
    bold = {"fontsize": 7.5, "fontweight": "bold", "va": "bottom"}
    labels.append(
        (
            f"peak {format_bytes(trace.peak_bytes)}",
            [
                (peak + 0.5, total[peak], {**bold, "ha": "left", "xytext": (5, 1)}),
                (peak + 0.5, total[peak], {**bold, "ha": "right", "xytext": (-5, 1)}),
            ],
        )
    )
    phase_text = {"fontsize": 7.5, "color": "#555555", "style": "italic", "va": "top"}
    for phase, start, end in trace.phase_spans():
        if phase in PHASE_SHADE:
            ax.axvspan(
                start,
                end,
                facecolor=PHASE_SHADE[phase],
                zorder=0,
                linewidth=0,
                hatch=BACKWARD_HATCH if phase == "backward" else None,
                edgecolor="#F0D9C4",
            )
            labels.append(
                (
                    phase,
                    [
                        (start, top, {**phase_text, "ha": "left", "xytext": (3, -2)}),
                        (end, top, {**phase_text, "ha": "right", "xytext": (-3, -2)}),
                        ((start + end) / 2, top, {**phase_text, "ha": "center", "xytext": (0, -2)}),
                    ],
                )
            )
    gradient = gradient_block(trace, case)
    big = [b for b in trace.blocks if is_fp32_bsv(b, case) and b is not gradient]
    base = np.zeros(trace.length + 1)
    style = CATEGORY_STYLE[FP32_BSV]
    seen: set[str] = set()
    for block in big:
        end = trace.length if block.end is None else block.end
        live = np.zeros(trace.length + 1)
        live[block.start : end] = block.nbytes / scale
        live[-1] = live[-2] if trace.length else 0
        ax.fill_between(
            x,
            base,
            base + live,
            step="post",
            facecolor=style["color"],
            hatch=style["hatch"],
            edgecolor="#333333",
            linewidth=0.4,
            zorder=2,
        )
        text = f"{short_op(block.op)}" + (f", {block.phase}" if block.phase else "")
        # A repeated op (a chunk loop's blocks) is labelled once, at its first block.
        if text not in seen:
            seen.add(text)
            boxed = {
                "fontsize": 7,
                "va": "center",
                "bbox": {
                    "boxstyle": "round,pad=0.15",
                    "facecolor": "white",
                    "edgecolor": "none",
                    "alpha": 0.85,
                },
            }
            # The band moves down as older blocks die: sit each try at the band's height there.
            tries = [
                ((block.start + end) / 2, "center", (0, 0)),
                (block.start, "left", (3, 0)),
                (end, "right", (-3, 0)),
                (block.start + (end - block.start) / 4, "center", (0, 0)),
                (end - (end - block.start) / 4, "center", (0, 0)),
            ]
            labels.append(
                (
                    text,
                    [
                        (
                            tx,
                            base[min(int(tx), end - 1)] + block.nbytes / scale / 2,
                            {**boxed, "ha": ha, "xytext": off},
                        )
                        for tx, ha, off in tries
                    ],
                )
            )
        base = base + live
    ax.fill_between(x, base, total, step="post", color=REST_COLOUR, zorder=1, linewidth=0)
    ax.step(x, total, where="post", color=look.color, linewidth=1.3, zorder=3)
    ax.plot(
        [peak + 0.5],
        [total[peak]],
        marker="v",
        color=look.color,
        markersize=6,
        zorder=5,
        markeredgecolor="black",
        markeredgewidth=0.5,
    )
    ax.set_xlim(0, max(trace.length, 1))
    ax.set_ylim(0, top)
    ax.set_ylabel(f"{unit} live")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.3g}"))
    ax.set_title(clean_text(kernel), loc="left", fontsize=9)
    return labels


def _place_labels(ax: Axes, labels: list[_Label], renderer: Any) -> None:
    """Each label at its first position that stays in the panel and clear of the others."""
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []  # matplotlib Bbox
    for text, positions in labels:
        for x, y, style in positions:
            style = dict(style)
            offset = style.pop("xytext", (0, 0))
            artist = ax.annotate(
                text,
                (x, y),
                xytext=offset,
                textcoords="offset points",
                zorder=6,
                annotation_clip=False,
                **style,
            )
            box = artist.get_window_extent(renderer)
            inside = frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1 and frame.y0 - 1 <= box.y0
            if inside and not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            artist.remove()
