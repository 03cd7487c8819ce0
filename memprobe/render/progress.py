"""Progress over sweep cases, on stderr: a bar on a terminal, a line per case elsewhere."""

from __future__ import annotations

import sys
from typing import TextIO

from memprobe.io.sizes import format_bytes
from memprobe.records import Case, Run

BAR_WIDTH = 24


class CaseProgress:
    """Callable as ``progress(i, n, case, run)`` after each finished case."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, i: int, n: int, case: Case, run: Run) -> None:
        if not self.enabled:
            return
        result = format_bytes(run.peak_bytes) if run.status == "ok" else run.status
        what = f"{case.kernel} tokens={case.tokens:,} vocab={case.vocab:,} {case.dtype}: {result}"
        if self.tty:
            filled = BAR_WIDTH * i // max(n, 1)
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            end = "\n" if i == n else ""
            self.stream.write(f"\r\033[K[{bar}] {i}/{n} {what}{end}")
        else:
            self.stream.write(f"[{i}/{n}] {what}\n")
        self.stream.flush()
