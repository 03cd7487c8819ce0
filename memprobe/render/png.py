"""The page model → the report's PNG plots (bytes per plot name)."""

from __future__ import annotations

from dataclasses import dataclass

from memprobe.render import plots, timeline
from memprobe.render.style import kernel_looks
from memprobe.report.page import Page

PLOT_NAMES = ("peak_vs_tokens", "peak_vs_vocab", "peak_breakdown", "timeline", "numerics")


@dataclass(frozen=True)
class Plots:
    """PNG bytes per plot name (None: nothing to draw for this run)."""

    images: dict[str, bytes | None]


def render_plots(p: Page) -> Plots:
    h = p.headline
    looks = kernel_looks(list(p.kernels))
    config = p.config
    traced = p.traced
    traces = {e.kernel: e.trace for e in traced if e.trace is not None}
    return Plots(
        {
            "peak_vs_tokens": plots.peak_vs(config, "tokens", looks, h),
            "peak_vs_vocab": plots.peak_vs(config, "vocab", looks, h),
            "peak_breakdown": plots.breakdown_bars([e.breakdown for e in traced if e.breakdown], h),
            # Every headline case has the same shapes: the first traced one stands for all.
            "timeline": timeline.timelines(traces, traced[0].case, looks, h) if traced else None,
            "numerics": plots.numerics(p.table, list(p.kernels)),
        }
    )
