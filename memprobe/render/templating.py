"""The one HTML stack: Jinja2 templates shipped in ``memprobe/render/templates/``.

Every page extends ``base.html`` (the Content-Security-Policy, the shared style sheet
and, where a page has sortable tables, the table script, all inlined: a page loads
nothing from elsewhere). Autoescaping is on for every template, so a kernel name, a
frame or a path from data always shows as text. Python hands templates plain values
(strings, numbers, :class:`Cell` rows, PNG bytes); the markup lives in the templates.
"""

from __future__ import annotations

import base64
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from memprobe.io.sizes import format_bytes
from memprobe.results import missing


@dataclass(frozen=True)
class Cell:
    """One table cell: the text shown, an optional sort value, and how it reads."""

    text: str
    sort: Any = None  # the raw value the table script sorts by (None: sort by the text)
    numeric: bool = False
    href: str | None = None  # a link to a file beside the page
    title: str | None = None  # a tooltip (the reasons behind a reading)
    mono: bool = False  # code: a frame, a path

    @property
    def sort_value(self) -> str | None:
        """``data-v``: the sort value, "" for a numeric cell without one, else absent."""
        if self.sort is not None and not missing(self.sort):
            return str(self.sort)
        return "" if self.numeric else None


@dataclass(frozen=True)
class Table:
    """Headers are (title, numeric) pairs; ``row_classes`` marks rows (``bad``)."""

    headers: Sequence[tuple[str, bool]]
    rows: Sequence[Sequence[Cell]]
    sortable: bool = False
    row_classes: Sequence[str] = field(default=())


@dataclass(frozen=True)
class Figure:
    """A PNG shown inline, or the sentence that says why there is none."""

    png: bytes | None
    alt: str
    caption: str = ""
    missing: str = ""


def bytes_cell(n: Any) -> Cell:
    if missing(n):
        return Cell("-", None, numeric=True)
    return Cell(format_bytes(n), int(n), numeric=True)


def number_cell(x: Any, fmt: str, suffix: str = "") -> Cell:
    if missing(x):
        return Cell("-", None, numeric=True)
    return Cell(format(x, fmt) + suffix, x, numeric=True)


def relative_href(target: Path, page_dir: Path) -> str:
    """A link from the page to a file beside it (kept working when the folder moves)."""
    href = os.path.relpath(target, page_dir).replace(os.sep, "/")
    # "javascript:x" or "C:x" as a first path part would read as a URL scheme.
    return f"./{href}" if ":" in href.split("/", 1)[0] else href


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("memprobe.render", "templates"),
        autoescape=True,  # every template, whatever its name ends with
        undefined=jinja2.StrictUndefined,  # a missing value is a bug, not an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["data_uri"] = _data_uri
    env.filters["bytes"] = format_bytes
    return env


def render_page(template: str, **context: Any) -> str:
    """A whole page: ``template`` extends ``base.html``."""
    return environment().get_template(template).render(**context)
