"""HTML building blocks: one self-contained page, every data string escaped.

Nothing on a page loads from elsewhere: styles and the small table-sorting
script are inline, plots are base64 PNGs. Every value that comes from data
(kernel names, frames, file paths, the command line) goes through :func:`esc`.
"""

from __future__ import annotations

import base64
import html
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from memprobe.atomic_files import write_atomic
from memprobe.units import format_bytes

_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1a1a1a; margin: 0; background: #fafafa; }
main { max-width: 1200px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 32px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 16px; margin: 20px 0 6px; }
.sub { color: #555; margin: 0 0 16px; }
.answer { background: #eef6ee; border-left: 5px solid #2e7d32; padding: 12px 16px; margin: 12px 0; }
.answer p { margin: 6px 0; }
.answer .big { font-size: 18px; font-weight: 600; }
.warn { background: #fff4e5; border-left: 5px solid #e65100; padding: 8px 14px; }
ul.lines li { margin: 3px 0; }
.muted { color: #666; font-size: 13px; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
              font-size: 13px; }
figure { margin: 16px 0 24px; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 13px; margin-top: 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border-bottom: 1px solid #e3e3e3; padding: 4px 8px; text-align: left; vertical-align: top;
         white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th:hover { background: #e8e8e8; }
th.asc::after { content: " \\25B2"; } th.desc::after { content: " \\25BC"; }
.scroll { overflow-x: auto; max-height: 640px; overflow-y: auto; border: 1px solid #eee; }
tr.bad td { background: #fff1f0; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; }
dl.meta dt { color: #555; } dl.meta dd { margin: 0; word-break: break-all; }
details { margin: 6px 0 12px; } summary { cursor: pointer; font-weight: 600; }
"""

# Sorts a table by the clicked column: numbers by data-v (raw value), text otherwise.
_SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var desc = th.classList.contains("asc");
      table.querySelectorAll("th").forEach(function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(desc ? "desc" : "asc");
      function key(row) {
        var cell = row.cells[col], v = cell.getAttribute("data-v");
        if (v === null) { v = cell.textContent; }
        var f = parseFloat(v);
        return (v !== "" && isFinite(v)) ? f : v.toLowerCase();
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b), r;
        if (typeof x === typeof y) { r = x < y ? -1 : x > y ? 1 : 0; }
        else { r = typeof x === "number" ? -1 : 1; }
        return desc ? -r : r;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


def esc(value: Any) -> str:
    """Text for HTML: ``<script>`` shows as text, quotes are safe inside attributes."""
    return html.escape("" if value is None else str(value), quote=True)


def is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}">'


def figure(png: bytes | None, alt: str, caption: str, missing: str) -> str:
    if png is None:
        return f'<p class="muted">{esc(missing)}</p>'
    return f"<figure>{img(png, alt)}<figcaption>{esc(caption)}</figcaption></figure>"


def page(title: str, body: str, *, sortable: bool = False) -> str:
    script = f"<script>{_SORT_JS}</script>" if sortable else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # Offline by construction: forbid anything a page could fetch from elsewhere.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>\n"
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
        if self.sort is not None and not is_missing(self.sort):
            attrs += f' data-v="{esc(self.sort)}"'
        elif self.numeric:
            attrs += ' data-v=""'
        return f"<td{attrs}>{self.html}</td>"


def bytes_cell(n: Any) -> Cell:
    return Cell(
        "-" if is_missing(n) else format_bytes(n), None if is_missing(n) else int(n), numeric=True
    )


def number_cell(x: Any, fmt: str, suffix: str = "") -> Cell:
    if is_missing(x):
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
        f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs if not is_missing(v) and v != ""
    )
    return f'<dl class="meta">{items}</dl>'


def relative_href(target: Path, page_dir: Path) -> str:
    """A link from the page to a file beside it (kept working when the folder moves)."""
    return os.path.relpath(target, page_dir).replace(os.sep, "/")


def write_text(path: Path, text: str) -> Path:
    """Write a page whole or not at all (a reader never sees half a report)."""
    return write_atomic(path, text)


def write_bytes(path: Path, data: bytes) -> Path:
    return write_atomic(path, data)
