"""Progress on stderr, for sweep cases and plans: a bar on a terminal, a line per step elsewhere."""

from __future__ import annotations

import sys
from typing import TextIO

from memprobe.io.sizes import format_bytes
from memprobe.records import Case, Run

BAR_WIDTH = 24


class Progress:
    """``progress.step(i, n, what)`` after the i-th of n steps."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, i: int, n: int, what: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            filled = BAR_WIDTH * i // max(n, 1)
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            end = "\n" if i == n else ""
            self.stream.write(f"\r\033[K[{bar}] {i}/{n} {what}{end}")
        else:
            self.stream.write(f"[{i}/{n}] {what}\n")
        self.stream.flush()


class CaseProgress(Progress):
    """Callable as ``progress(i, n, case, run)`` after each finished case."""

    def __call__(self, i: int, n: int, case: Case, run: Run) -> None:
        result = format_bytes(run.peak_bytes) if run.status == "ok" else run.status
        what = f"{case.kernel} tokens={case.tokens:,} vocab={case.vocab:,} {case.dtype}: {result}"
        self.step(i, n, what)
