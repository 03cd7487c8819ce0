"""The canvas draws each PNG once, cropped to the box ``bbox_inches="tight"`` finds."""

from __future__ import annotations

import io

import pytest
from matplotlib.figure import Figure

from memprobe.render.canvas import PAD_INCHES, PNG_SOFTWARE, new_figure, styled, to_png
from memprobe.render.style import DPI


@styled
def _figure(laid_out: bool) -> Figure:
    fig = new_figure(6.0, 3.0)
    left, right = fig.subplots(1, 2)
    left.plot([0, 1, 2], [3, 1, 2], label="a line")
    right.bar(["one", "two"], [1.0, 2.0])
    left.set_ylabel("GiB live")
    fig.legend(loc="upper center")
    fig.suptitle("a title above the figure", y=1.08)
    if laid_out:
        fig.tight_layout()
    return fig


@pytest.mark.parametrize("laid_out", [False, True], ids=["as drawn", "after tight_layout"])
def test_a_png_is_drawn_once_and_equals_the_tight_savefig(
    monkeypatch: pytest.MonkeyPatch, laid_out: bool
) -> None:
    tight = io.BytesIO()
    _figure(laid_out).savefig(
        tight,
        format="png",
        dpi=DPI,
        bbox_inches="tight",
        pad_inches=PAD_INCHES,
        metadata={"Software": PNG_SOFTWARE},
    )
    draws: list[object] = []
    original = Figure.draw

    def counted(self: Figure, renderer: object) -> None:
        draws.append(renderer)
        original(self, renderer)  # type: ignore[arg-type]

    monkeypatch.setattr(Figure, "draw", counted)
    assert to_png(_figure(laid_out)) == tight.getvalue()
    assert len(draws) == 1
