"""The terminal through rich: plain, stable text off a terminal; rich's drawing on one."""

from __future__ import annotations

import io

from memprobe.records import Case, Run
from memprobe.render.console import Progress, indented, plain_lines, show, table


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _table() -> object:
    return table(
        ["kernel", "peak", "fits"],
        [["unchunked", "1.75 GiB", "no"], ["local_chunked_inplace", "384.04 MiB", "yes"]],
        left=("kernel", "fits"),
    )


def test_plain_text_is_two_spaces_between_columns_and_no_box() -> None:
    assert plain_lines(_table()) == [
        "kernel                       peak  fits",
        "unchunked                1.75 GiB  no",
        "local_chunked_inplace  384.04 MiB  yes",
    ]


def test_off_a_terminal_no_ansi_and_rows_never_wrap() -> None:
    wide = table([f"column {i}" for i in range(40)], [[f"{i:,}" for i in range(40)]])
    out = io.StringIO()
    show(["head", wide], file=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "head" and len(lines) == 3  # one header line, one row: no wrapping
    assert "\x1b" not in out.getvalue() and "─" not in out.getvalue()
    assert lines[2].endswith("  39")


def test_on_a_terminal_rich_draws_the_table() -> None:
    out = _Tty()
    show([_table()], file=out)
    text = out.getvalue()
    assert "─" in text and "local_chunked_inplace" in text  # the header rule of rich's box


def test_on_a_narrow_terminal_a_wide_table_is_printed_whole_not_truncated() -> None:
    out = _Tty()
    show([table([f"column {i}" for i in range(40)], [[f"{i:,}" for i in range(40)]])], file=out)
    assert "column 39" in out.getvalue() and "…" not in out.getvalue()


def test_indented_keeps_blank_lines_blank() -> None:
    assert indented("a\n\nb") == ["  a", "", "  b"]


def test_progress_is_a_line_per_step_off_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(out)
    case = Case("unchunked", 1, 1024, 32768, "bf16")
    progress.case(1, 2, case, Run(case, "ok", peak_bytes=448 * 2**20))
    progress.case(2, 2, case, Run(case, "oom"))
    assert out.getvalue().splitlines() == [
        "[1/2] unchunked tokens=1,024 vocab=32,768 bf16: 448.00 MiB",
        "[2/2] unchunked tokens=1,024 vocab=32,768 bf16: oom",
    ]
    quiet = io.StringIO()
    Progress(quiet, enabled=False).step(1, 1, "x")
    assert quiet.getvalue() == ""


def test_progress_on_a_terminal_is_rich_bar_that_ends() -> None:
    out = _Tty()
    progress = Progress(out)
    progress.step(1, 2, "first")
    progress.step(2, 2, "second")
    assert "2/2" in out.getvalue() and "second" in out.getvalue()
    assert progress._bar is None  # stopped after the last step: the cursor is back
