"""The terminal, through rich: tables on stdout, progress on stderr.

On a terminal rich draws them (a box, bold headers, a live bar). Anywhere else (a
pipe, a file, CI logs, the tests) the text is plain and stable: no ANSI codes, no box
characters, and no wrapping at a width, so a table row is one line whatever the
width and a log diffs cleanly. ``--json`` output never comes through here.
"""

from __future__ import annotations

import copy
import io
import sys
from collections.abc import Collection, Iterable, Sequence
from typing import TextIO

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from memprobe.io.sizes import format_bytes
from memprobe.records import Case, Run

# Wide enough that no table of memprobe's ever wraps: plain rows stay one line each.
PLAIN_WIDTH = 10_000

# A printable part of a command's output: a line of text, or a table.
Part = str | Table


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    left: Collection[str] = (),
    show_header: bool = True,
) -> Table:
    """Columns in ``left`` read left-aligned (names, words), the rest right-aligned
    (numbers). Cells never wrap: a byte count split over two lines misreads."""
    out = Table(
        box=box.SIMPLE_HEAD,
        header_style="bold",
        pad_edge=False,
        padding=(0, 1),
        show_edge=False,
        show_header=show_header,
    )
    for name in header:
        out.add_column(name, justify="left" if name in left else "right", no_wrap=True)
    for row in rows:
        out.add_row(*row)
    return out


def _plain_console(file: TextIO) -> Console:
    return Console(
        file=file,
        width=PLAIN_WIDTH,
        no_color=True,
        color_system=None,
        force_terminal=False,
        highlight=False,
        markup=False,
        emoji=False,
    )


def plain_lines(part: Part) -> list[str]:
    """The part as plain lines: a table without its box (two spaces between
    columns, the header first), trailing spaces dropped."""
    if isinstance(part, str):
        return part.split("\n")
    bare = copy.copy(part)  # shares the columns; only the box differs
    bare.box = None
    buffer = io.StringIO()
    _plain_console(buffer).print(bare)
    return [line.rstrip() for line in buffer.getvalue().rstrip("\n").split("\n")]


def indented(part: Part, by: int = 2) -> list[str]:
    return [" " * by + line if line else line for line in plain_lines(part)]


def _terminal_console(stream: TextIO, *, width: int | None = None) -> Console:
    # A width is given with a height: rich takes a width alone as asked only where it is
    # given both or the terminal is not "dumb"; under TERM=dumb it drew 80 columns, and the
    # plan's and sweep's numbers were cut to "299,…" and "1,03…".
    height = None if width is None else _DUMB_HEIGHT
    return Console(
        file=stream, width=width, height=height, highlight=False, markup=False, emoji=False
    )


# Lines rich assumes a terminal has when it is not told (what it takes for TERM=dumb); a
# table printed whole does not read it.
_DUMB_HEIGHT = 25


def show(parts: Iterable[Part], *, file: TextIO | None = None) -> None:
    """Print parts on stdout: drawn by rich on a terminal, plain elsewhere."""
    stream = file if file is not None else sys.stdout
    console = _terminal_console(stream)
    if console.is_terminal:
        for part in parts:
            if isinstance(part, str):
                console.print(part, soft_wrap=True)
                continue
            # A table wider than the terminal is printed whole (the terminal wraps its
            # lines) rather than squeezed into truncated cells.
            natural = Measurement.get(console, console.options.update_width(PLAIN_WIDTH), part)
            wide = _terminal_console(stream, width=max(natural.maximum, console.width))
            wide.print(part, crop=False)
        return
    for part in parts:
        for line in plain_lines(part):
            stream.write(line + "\n")
    stream.flush()


class Progress:
    """Progress over n steps on stderr: rich's live bar on a terminal, a line per step
    (``[i/n] what``) elsewhere. ``step(i, n, what)`` after the i-th step; ``case`` is the
    sweep's per-case callback; ``probe(what)`` shows what a long step is doing now, on
    a terminal only (a line per probe would bury the step lines in a log); ``close()``
    takes the bar down when the work ends early."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._console = Console(file=self.stream, highlight=False, markup=False, emoji=False)
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None

    def step(self, i: int, n: int, what: str) -> None:
        if not self.enabled:
            return
        if not self._console.is_terminal:
            self.stream.write(f"[{i}/{n}] {what}\n")
            self.stream.flush()
            return
        bar, task = self._live()
        bar.update(task, completed=i, total=n, description=what)
        if i >= n:
            self.close()

    def probe(self, what: str) -> None:
        if not self.enabled or not self._console.is_terminal:
            return
        bar, task = self._live()
        bar.update(task, description=what)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        self._bar = self._task = None

    def _live(self) -> tuple[RichProgress, TaskID]:
        if self._bar is None or self._task is None:
            self._bar = RichProgress(
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}", markup=False),
                console=self._console,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=None)
        return self._bar, self._task

    def case(self, i: int, n: int, case: Case, run: Run) -> None:
        """After each finished sweep case: its peak, or why it has none."""
        result = format_bytes(run.peak_bytes) if run.status == "ok" else run.status
        what = f"{case.kernel} tokens={case.tokens:,} vocab={case.vocab:,} {case.dtype}"
        self.step(i, n, f"{what}{_layout_words(case)}: {result}")


# A Case's defaults (batch 1, chunk 1024, tp 1, cp 1, no hidden): a progress line names
# each field off its default, so that cases swept over --batch/--chunk-size/--hidden/--tp/
# --cp read apart ("[1/8] distributed tokens=64 ..." and "[3/8] ..." at tp 2 looked alike).
_CASE_DEFAULTS = Case("", 1, 1, 1)


def _layout_words(case: Case) -> str:
    words = [
        f" {name}={value:,}"
        for name, value, default in (
            ("batch", case.batch, _CASE_DEFAULTS.batch),
            ("hidden", case.hidden, _CASE_DEFAULTS.hidden),
            ("chunk", case.chunk_size, _CASE_DEFAULTS.chunk_size),
            ("tp", case.tp, _CASE_DEFAULTS.tp),
            ("cp", case.cp, _CASE_DEFAULTS.cp),
        )
        if value is not None and value != default
    ]
    return "".join(words)
