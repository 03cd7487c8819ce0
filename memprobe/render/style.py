"""Colours, markers, line styles and byte-axis ticks shared by every plot.

Each kernel keeps one look across all figures (by its order in the run), and
every look differs in marker and line style as well as colour, so the plots
still read when printed in greyscale. Colours are the Okabe-Ito palette.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

from memprobe.attribute.categories import (
    ACTIVATIONS,
    ATTENTION,
    AUTOCAST,
    BACKWARD_TEMP,
    CHECKPOINT,
    COMMUNICATION,
    GRADIENTS,
    LOGITS,
    OPTIMIZER,
    OTHER,
    PARAMETERS,
)
from memprobe.attribute.categories import CATEGORIES as ATTRIBUTE_CATEGORIES
from memprobe.report.breakdown import CATEGORIES, CHUNK, FP32_BSV, GRADIENT, INPUT, OTHER_BSV

# Grey is kept for the floors; past eight kernels the colours repeat with other markers
# (12 of them), so every look differs up to 24 kernels.
# Okabe-Ito's eight, then four of Paul Tol's that stay apart from them: the default
# sweep's ten kernels each get a colour of their own.
_COLOURS = (
    "#000000",
    "#D55E00",
    "#0072B2",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#882255",
    "#332288",
    "#999933",
    "#44AA99",
    "#AA4499",
)
# Eleven markers beside twelve colours: no two of the first 132 kernels look alike.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")
# Dashed is kept for the floor and dash-dot for the budget; kernels use the rest.
_LINES = (
    "-",
    (0, (1, 1.2)),
    "-",
    (0, (6, 1.5, 1, 1.5, 1, 1.5)),
    "-",
    (0, (1, 1.2)),
    "-",
    (0, (4, 1)),
)

FLOOR_STYLE: dict[str, Any] = {"color": "#555555", "linestyle": (0, (5, 3)), "linewidth": 1.3}
BUDGET_STYLE: dict[str, Any] = {
    "color": "#B2182B",
    "linestyle": (0, (8, 3, 2, 3)),
    "linewidth": 1.6,
}

# One look per category, on every page and figure (the sweep report's breakdown and
# timeline, the attribute page's timeline): luminance and hatching differ too, so the
# figures read in greyscale. Keyed by name: the sweep report's categories and
# attribution's (memprobe.attribute.categories) share "other".
CATEGORY_STYLE: dict[str, dict[str, str]] = {
    # the sweep report's story of a log-prob step
    INPUT: {"color": "#4D4D4D", "hatch": ""},
    GRADIENT: {"color": "#A6A6A6", "hatch": "//"},
    FP32_BSV: {"color": "#D55E00", "hatch": "xx"},
    OTHER_BSV: {"color": "#F0C27B", "hatch": "\\\\"},
    CHUNK: {"color": "#0072B2", "hatch": ".."},
    OTHER: {"color": "#E8E8E8", "hatch": ""},
    # attribution's categories of a training step
    PARAMETERS: {"color": "#332288", "hatch": ""},
    GRADIENTS: {"color": "#88CCEE", "hatch": "//"},
    OPTIMIZER: {"color": "#CC79A7", "hatch": "--"},
    ACTIVATIONS: {"color": "#009E73", "hatch": ""},
    BACKWARD_TEMP: {"color": "#E69F00", "hatch": ".."},
    LOGITS: {"color": "#CC3311", "hatch": "xx"},
    ATTENTION: {"color": "#44AA99", "hatch": "\\\\"},
    AUTOCAST: {"color": "#999933", "hatch": "++"},
    CHECKPOINT: {"color": "#117733", "hatch": ".."},
    COMMUNICATION: {"color": "#6699CC", "hatch": "||"},
}
assert set(CATEGORIES) <= set(CATEGORY_STYLE) and set(ATTRIBUTE_CATEGORIES) <= set(CATEGORY_STYLE)
# A category added later (attribution grows) still gets one fixed look, from its name.
_SPARE = ("#44AA99", "#999933", "#882255", "#117733", "#DDCC77", "#6699CC", "#AA4499")


def category_style(category: str) -> dict[str, str]:
    """The category's colour and hatch: the same on every page and figure."""
    known = CATEGORY_STYLE.get(category)
    if known is not None:
        return known
    return {
        "color": _SPARE[zlib.crc32(category.encode("utf-8", "replace")) % len(_SPARE)],
        "hatch": "",
    }


PHASE_SHADE = {"forward": "#E3EEF8", "backward": "#FBEBDD"}
DPI = 100


@dataclass(frozen=True)
class Look:
    color: str
    marker: str
    linestyle: object


def kernel_looks(kernels: list[str]) -> dict[str, Look]:
    return {
        k: Look(_COLOURS[i % len(_COLOURS)], _MARKERS[i % len(_MARKERS)], _LINES[i % len(_LINES)])
        for i, k in enumerate(kernels)
    }


def power_of_two_ticks(low: float, high: float, max_ticks: int = 9) -> list[float]:
    """Powers of two spanning [low, high], thinned to at most ``max_ticks``."""
    lo = math.floor(math.log2(max(low, 1.0)))
    hi = math.ceil(math.log2(max(high, 2.0)))
    step = 1
    while (hi - lo) // step + 1 > max_ticks:
        step += 1
    return [2.0**e for e in range(lo, hi + 1, step)]


def short_op(op: str) -> str:
    """'aten._log_softmax.default' → '_log_softmax'."""
    name = op.removeprefix("aten.")
    for suffix in (".default", ".Tensor", ".Scalar", ".dim_IntList", ".int"):
        name = name.removesuffix(suffix)
    return name
