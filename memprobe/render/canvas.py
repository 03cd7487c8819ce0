"""The canvas every report figure is drawn on: Agg, report styling, PNG bytes out.

Every PNG memprobe makes (the sweep report's plots, the attribute page's timeline, the
plan plot) is a :func:`new_figure` turned into bytes by :func:`to_png`: this is the one
place the Agg canvas is chosen (no pyplot, no ``matplotlib.use``) and the one place
memprobe's tag is written. Text from data goes through :func:`clean_text`.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any, TypeVar

import matplotlib
import matplotlib.style
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine

from memprobe.render.style import DPI

# Written into every PNG memprobe makes (a tEXt chunk), so a re-render removes only
# its own stale plots, never a user's file that happens to share a name.
PNG_SOFTWARE = "memprobe"


def made_by_memprobe(png: bytes) -> bool:
    return b"tEXtSoftware\x00" + PNG_SOFTWARE.encode() in png[:4096]


# The most characters of data text a figure draws. A legend or tick label is as wide as
# its text and ``bbox_inches="tight"`` grows the canvas to hold it: a kernel name of a
# million characters (a tampered results.json) asked Agg for a canvas past any memory.
MAX_LABEL = 80


def clean_text(text: object) -> str:
    """Data text a figure can draw: a lone surrogate (a tampered kernel name, a frame from
    a broken file) would raise inside matplotlib's text layout; it shows as "?". Text
    longer than :data:`MAX_LABEL` is cut, its end shown as "…"."""
    shown = str(text).encode("utf-8", "replace").decode("utf-8")
    return shown if len(shown) <= MAX_LABEL else shown[: MAX_LABEL - 1] + "…"


def unit_for(nbytes: float) -> tuple[float, str]:
    """The binary unit a figure's axis reads best in: GiB from 1 GiB, else MiB or KiB."""
    for name, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return float(scale), name
    return 1024.0, "KiB"


# Applied only while a report figure is drawn, so a caller's own matplotlib
# settings are left as they were; over matplotlib's defaults, not over the settings the
# process holds, which user code may have changed as memprobe ran it (a kernel's
# ``rcParams["text.usetex"] = True`` ended a sweep in a LaTeX traceback as its report
# was drawn; a style or dpi it set drew memprobe's plots in it).
_RC: Any = {  # matplotlib's stubs type rc keys as a Literal of every name
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "hatch.linewidth": 0.6,
    # Kernel names, ops and dtypes come from data: a "$" in one must print, not start
    # mathtext (which raises on a bad formula). Every tick label here is plain text.
    "text.parse_math": False,
}
F = TypeVar("F", bound=Callable[..., Any])


def styled(fn: F) -> F:
    """Run a figure function under the report's matplotlib settings."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with matplotlib.style.context(["default", _RC]):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def new_figure(width: float, height: float) -> Figure:
    """A figure drawn by the Agg canvas directly: no pyplot, no GUI backend, no global
    figure registry to leak into (so nothing needs ``matplotlib.use`` or closing)."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


# The margin kept around a figure's drawn content.
PAD_INCHES = 0.15


def to_png(fig: Figure) -> bytes:
    """The figure cropped to its content plus :data:`PAD_INCHES`.

    The box is the one ``bbox_inches="tight"`` would find, but that setting first draws
    the whole figure without rendering (for a layout engine, which these figures do not
    keep) and then draws it again: the first draw was a third of a report's time. Asking
    for the box directly skips it. ``tight_layout`` leaves a placeholder engine behind
    that lays out nothing but would bring that draw back, so it goes first.
    """
    canvas = fig.canvas
    if not isinstance(canvas, FigureCanvasAgg):  # a figure made elsewhere
        canvas = FigureCanvasAgg(fig)
    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):
        fig.set_layout_engine(None)
    box = fig.get_tightbbox(canvas.get_renderer()).padded(PAD_INCHES)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches=box, metadata={"Software": PNG_SOFTWARE})
    return buf.getvalue()
