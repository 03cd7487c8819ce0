"""A gate Verdict as Markdown, for a GitHub step summary."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from memprobe.gate import Verdict
from memprobe.io.text import printable
from memprobe.render.gate_text import format_excess, format_value


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_MARKUP = re.compile(r"([\\`*\[\]<>!~&])")


def _text(value: object) -> str:
    """Data as inert Markdown text: escapes first (a note from a tampered file could
    hold control characters), then every character that could start markup (an image,
    a link, bold) is backslash-escaped."""
    return _MARKUP.sub(r"\\\1", printable(str(value)))


def _code(value: object) -> str:
    """A code span that its content cannot close: the fence is one backtick longer than
    the longest run of backticks inside (CommonMark), padded when the text touches one."""
    text = printable(str(value))
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_summary(verdict: Verdict) -> str:
    failed, total = len(verdict.failures), len(verdict.checks)
    title = f"{failed} of {total} checks failed" if failed else f"all {total} checks passed"
    lines = [
        f"### memprobe gate: {title}",
        "",
        f"{verdict.cases} case(s) from {_code(verdict.results)}"
        + (
            f"; baseline {_code(verdict.baseline)} (max regression {verdict.max_regression:g}%)"
            if verdict.baseline
            else ""
        ),
        "",
        "| | check | case | measured | limit | over by |",
        "|---|---|---|---|---|---|",
    ]
    ordered = list(verdict.failures) + [c for c in verdict.checks if c.passed]
    for c in ordered:
        measured = format_value(c.measured, c.unit) if c.measured is not None else _text(c.reason)
        cells = [
            "✅" if c.passed else "❌",
            printable(f"{c.source} {c.kind}"),  # memprobe's names for the config's rules
            _code(c.case),
            measured,
            format_value(c.limit, c.unit),
            "" if c.passed else format_excess(c),
        ]
        lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return "\n".join(lines) + "\n\n"


def append_step_summary(
    verdict: Verdict, inputs: Iterable[Path] = (), outputs: Iterable[Path] = ()
) -> str | None:
    """Append the Markdown table to $GITHUB_STEP_SUMMARY when set. Returns a warning on failure.

    A summary that cannot be written must not hide the verdict, so this warns
    instead of raising. Nor is it appended to one of ``inputs`` (a file, or a file in a
    folder, the command read: the results, the config), by any name or link to it, nor
    to one of the files the command wrote (``outputs``): appended to --junit-xml's file
    or --update-baseline's, it left XML or JSON no reader takes.
    """
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    # Appended only to a regular file: opened without waiting (a FIFO with no reader would
    # block the gate for ever) and judged by what it is once open.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(target, flags | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        return f"could not append to GITHUB_STEP_SUMMARY ({target}): {exc.strerror or exc}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return f"could not append to GITHUB_STEP_SUMMARY ({target}): not a regular file"
        # The file this command prints into (`> log` with the summary at /dev/stdout, as a
        # local try of a CI script may set it): appended at its end while the printed lines
        # still waited in their buffer, the summary was then written over by them.
        stream = _stream_among(info)
        if stream is not None:
            return (
                f"did not append to GITHUB_STEP_SUMMARY ({target}): it is this command's {stream}"
            )
        for files, role in ((inputs, "an input"), (outputs, "an output")):
            named = _file_among(info, files)
            if named is not None:
                return (
                    f"did not append to GITHUB_STEP_SUMMARY ({target}): it is {named}, "
                    f"{role} of this command"
                )
        with os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace", closefd=False) as fh:
            fh.write(markdown_summary(verdict))
    except OSError as exc:
        return f"could not append to GITHUB_STEP_SUMMARY ({target}): {exc.strerror or exc}"
    finally:
        os.close(fd)
    return None


def _stream_among(info: os.stat_result) -> str | None:
    """Which of standard output and error (by descriptor) is the file ``info`` describes."""
    for fd, name in ((1, "standard output"), (2, "standard error")):
        try:
            other = os.fstat(fd)
        except OSError:  # closed
            continue
        if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
            return name
    return None


def _file_among(info: os.stat_result, paths: Iterable[Path]) -> Path | None:
    """The path of ``paths`` (or file inside a folder of them) that is the file ``info``
    describes."""
    for path in paths:
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        for file in files:
            try:
                other = os.stat(file)
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
                return file
    return None
