"""plan.png reads: tick labels never overlap, the y axis is in bytes (GiB), the legend
stays off the plot (it hides neither the answers nor the budget label), and two chunk
sizes of one kernel never draw alike."""

from __future__ import annotations

import itertools

import pytest
from matplotlib.text import Text

from memprobe import plan
from memprobe.render.canvas import styled
from memprobe.render.plan_page import plan_figure

GiB = 2**30


def _plan(kernel: str, chunk: int | None, tokens: list[int], slope: float, fixed: float,
          budget: plan.Budget) -> plan.TokenPlan:  # fmt: skip
    target = plan.PlanTarget(kernel, 131072, chunk_size=chunk)
    points = tuple((t, int(slope * t + fixed)) for t in tokens)
    fits = [p for p in points if p[1] <= budget.limit_bytes]
    top = max(fits) if fits else (0, 0)
    search = plan.Search(top[0], top[1] or None, int(slope * (top[0] + 1) + fixed),
                         plan.Line(slope, fixed), top[0], len(points), points)  # fmt: skip
    return plan.TokenPlan(target, budget, search)


def _ladder(lo: int, hi: int) -> list[int]:
    out = [lo]
    while out[-1] * 2 < hi:
        out.append(out[-1] * 2)
    return [*out, hi]


BUDGET = plan.make_budget("80GiB", "54GiB")
CASES = {
    "headline": [
        _plan("unchunked", None, _ladder(2048, 15213), 1.75 * 2**20, 0, BUDGET),
        _plan("local_chunked", 1024, _ladder(2048, 52000), 0.5 * 2**20, 0.5 * GiB, BUDGET),
        _plan("local_chunked", 4096, _ladder(8192, 51000), 0.5 * 2**20, 2 * GiB, BUDGET),
    ],
    "wide token range": [
        _plan("local_chunked_inplace", 1024, _ladder(2048, 1_500_000), 18_000, GiB, BUDGET),
        _plan("unchunked", None, _ladder(2048, 15213), 1.75 * 2**20, 0, BUDGET),
    ],
    "narrow peak range": [
        _plan("local_chunked", 1024, [40000, 50000, 52000], 0.5 * 2**20, 0.5 * GiB, BUDGET),
    ],
    "tiny budget": [
        _plan("unchunked", None, _ladder(16, 300), 2**17, 0, plan.make_budget("64MiB")),
    ],
}


def _overlap(a: Text, b: Text, renderer) -> bool:
    return a.get_window_extent(renderer).overlaps(b.get_window_extent(renderer))


@pytest.mark.parametrize("name", CASES)
def test_the_plan_plot_reads(name: str) -> None:
    plans = CASES[name]
    fig = styled(plan_figure)(plans, plans[0].budget)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    yticks = [t for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert yticks and all(t.get_text().endswith("B") for t in yticks)  # "16.00 GiB", not 10^1
    for axis_labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        shown = [t for t in axis_labels if t.get_text() and t.get_visible()]
        for a, b in itertools.combinations(shown, 2):
            assert not _overlap(a, b, renderer), (a.get_text(), b.get_text())
    legend = ax.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(ax.get_window_extent(renderer))  # beside the plot, not on it
    looks = {(line.get_color(), line.get_markerfacecolor(), line.get_linestyle())
             for line in ax.get_lines() if not line.get_label().startswith("_")}  # fmt: skip
    assert len(looks) == len(plans)  # each plan (kernel x chunk size) has its own look
