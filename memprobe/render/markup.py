"""HTML building blocks: one self-contained page, every data string escaped.

Nothing on a page loads from elsewhere: the style sheet and the small
table-sorting script (package data in ``assets/``) are inlined, plots are
base64 PNGs. Every value that comes from data
(kernel names, frames, file paths, the command line) goes through :func:`esc`.
"""

from __future__ import annotations

import base64
import functools
import html
import os
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from memprobe.io.files import write_atomic
from memprobe.io.sizes import format_bytes
from memprobe.results import missing


def _asset(name: str) -> str:
    """A file shipped in ``memprobe/render/assets/`` (package data), as text."""
    return resources.files("memprobe.render").joinpath("assets", name).read_text(encoding="utf-8")


@functools.cache
def _css() -> str:
    return _asset("report.css")


@functools.cache
def _sort_js() -> str:
    return _asset("sort_table.js")


def esc(value: Any) -> str:
    """Text for HTML: ``<script>`` shows as text, quotes are safe inside attributes."""
    return html.escape("" if value is None else str(value), quote=True)


def img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}">'


def figure(png: bytes | None, alt: str, caption: str, missing: str) -> str:
    if png is None:
        return f'<p class="muted">{esc(missing)}</p>'
    return f"<figure>{img(png, alt)}<figcaption>{esc(caption)}</figcaption></figure>"


def page(title: str, body: str, *, sortable: bool = False) -> str:
    script = f"<script>{_sort_js()}</script>" if sortable else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # Offline by construction: forbid anything a page could fetch from elsewhere.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<title>{esc(title)}</title><style>{_css()}</style></head>\n"
        f"<body><main>\n{body}\n</main>{script}</body></html>\n"
    )


def ul(items: Iterable[str], cls: str = "lines") -> str:
    """A list of already-escaped HTML items."""
    return f'<ul class="{cls}">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


class Cell:
    """One table cell: shown text (escaped here), optional sort value, numeric alignment."""

    def __init__(
        self, text: Any, sort: Any = None, *, numeric: bool = False, raw_html: bool = False
    ) -> None:
        self.html = str(text) if raw_html else esc(text)
        self.sort = sort
        self.numeric = numeric

    def render(self) -> str:
        attrs = ' class="n"' if self.numeric else ""
        if self.sort is not None and not missing(self.sort):
            attrs += f' data-v="{esc(self.sort)}"'
        elif self.numeric:
            attrs += ' data-v=""'
        return f"<td{attrs}>{self.html}</td>"


def bytes_cell(n: Any) -> Cell:
    return Cell(
        "-" if missing(n) else format_bytes(n), None if missing(n) else int(n), numeric=True
    )


def number_cell(x: Any, fmt: str, suffix: str = "") -> Cell:
    if missing(x):
        return Cell("-", None, numeric=True)
    return Cell(format(x, fmt) + suffix, x, numeric=True)


def table(
    headers: Sequence[tuple[str, bool]],
    rows: Iterable[Sequence[Cell]],
    *,
    sortable: bool = False,
    row_classes: Sequence[str] | None = None,
) -> str:
    """``headers`` are (title, numeric) pairs; the titles are escaped here."""
    numeric = ' class="n"'
    head = "".join(f"<th{numeric if num else ''}>{esc(t)}</th>" for t, num in headers)
    body = []
    for i, cells in enumerate(rows):
        cls = row_classes[i] if row_classes and row_classes[i] else ""
        attr = f' class="{esc(cls)}"' if cls else ""
        body.append(f"<tr{attr}>" + "".join(c.render() for c in cells) + "</tr>")
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def definitions(pairs: Iterable[tuple[str, Any]]) -> str:
    items = "".join(
        f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs if not missing(v) and v != ""
    )
    return f'<dl class="meta">{items}</dl>'


def relative_href(target: Path, page_dir: Path) -> str:
    """A link from the page to a file beside it (kept working when the folder moves)."""
    href = os.path.relpath(target, page_dir).replace(os.sep, "/")
    # "javascript:x" or "C:x" as a first path part would read as a URL scheme.
    return f"./{href}" if ":" in href.split("/", 1)[0] else href


def write_text(path: Path, text: str) -> Path:
    """Write a page whole or not at all (a reader never sees half a report)."""
    return write_atomic(path, text)


def write_bytes(path: Path, data: bytes) -> Path:
    return write_atomic(path, data)
