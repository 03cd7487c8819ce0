"""The memprobe command line: assembles the commands in :mod:`memprobe.commands`.

Nothing imports this module; only the console script and ``python -m memprobe`` run it.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import sys
from typing import Annotated, Any, Optional, TextIO, cast

import typer

from memprobe import __version__
from memprobe.commands import attribute, diff, gate, kernels, plan, profile, report, step, sweep
from memprobe.commands.help import Command, Group
from memprobe.io.text import long_words_clipped, lookalikes_shown, quoted

app = typer.Typer(
    name="memprobe",
    help=(
        "Memory profiling and regression gates for the kernels that turn LLM logits "
        "[B, S, V] into per-token log-probabilities.\n\n"
        "Plan: `memprobe sweep` (simulated exactly on any machine, measured on a GPU). "
        "Diagnose: `memprobe attribute SNAPSHOT`, or `memprobe profile pkg.mod:step` for your "
        "own training step. Guard: `memprobe gate`."
    ),
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"memprobe {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        Optional[bool],  # noqa: UP045 - typer needs Optional on py3.10
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = None,
) -> None:
    if ctx.invoked_subcommand is None:
        # `memprobe` alone: the help on stdout, exit 2 like any other usage mistake.
        typer.echo(ctx.get_help())
        raise typer.Exit(2)


# Each command's help is its module's HELP constant, not the function's docstring:
# python -OO (PYTHONOPTIMIZE=2) drops docstrings, and --help listed the commands bare.
app.command("kernels", cls=Command, help=kernels.HELP)(kernels.command)
app.command("sweep", cls=Command, help=sweep.HELP)(sweep.command)
app.command("gate", cls=Command, help=gate.HELP)(gate.command)
app.command("attribute", cls=Command, help=attribute.HELP)(attribute.command)
app.command("diff", cls=Command, help=diff.HELP)(diff.command)
app.command("report", cls=Command, help=report.HELP)(report.command)
app.command("plan", cls=Command, help=plan.HELP)(plan.command)
app.command("profile", cls=Command, help=profile.HELP)(profile.command)
app.command("step", cls=Command, help=step.HELP)(step.command)


@functools.cache
def _click_command() -> Any:
    """The click command typer builds from ``app``, built once per process: typer rebuilds
    it at every ``app()`` call (evaluating every option's annotations again, about 30 ms),
    which whoever runs the CLI more than once in a process (the test suite does, a
    thousand times) pays each time."""
    return typer.main.get_command(app)


_SPLIT_UNIT = re.compile(r"unexpected extra argument(?:s|\(s\))? \(([KMGT]i?B|B)\b", re.I)


def main() -> None:
    """Run the CLI. A usage mistake (unknown option, bad value) is one line and exit 2,
    like every other user mistake, not a framed box."""
    _standard_streams_open()
    streams = sys.stdout, sys.stderr
    sys.stdout = cast(TextIO, _ReaderMayLeave(sys.stdout, errors_said=True))
    sys.stderr = cast(TextIO, _ReaderMayLeave(sys.stderr, errors_said=False))
    try:
        _main()
    finally:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, _ReaderMayLeave):
                stream.settle()
        sys.stdout, sys.stderr = streams


def _standard_streams_open() -> None:
    """Started with standard output or error closed (`>&-`, `2>&-`): what goes there goes
    nowhere, as with `>/dev/null`, and the files the command writes are still written.
    The descriptor itself is opened on /dev/null too. Left closed, the next file opened
    took its number: with standard error closed, user code's print() and os.write(1, ...)
    (sent to standard error while it runs) went into `--json`'s object on standard output,
    and a run with both closed exited 1 after writing its results."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process


def _main() -> None:
    try:
        os.getcwd()
    except FileNotFoundError:
        # Started in a directory since removed: torch cannot even load there (oneMKL's
        # "FATAL ERROR: Cannot load libtorch_cpu.so"), a relative path means nothing, and
        # finding pyproject.toml raised.
        typer.echo(
            "memprobe: error: the current directory no longer exists "
            "(cd to a directory that exists and run it again)",
            err=True,
        )
        sys.exit(2)
    _drop_unusable_columns()
    _refuse_typographic_dashes(sys.argv[1:])
    _warn_repeated_lists(sys.argv[1:])
    if "--help" in sys.argv[1:] and not sys.stdout.isatty():
        # Help piped or captured: wide enough that option names are never cut off
        # (rich sizes it for 80 columns and truncates the names column).
        os.environ.setdefault("COLUMNS", "120")
    try:
        # As ``app(standalone_mode=False)`` runs it; its own exception hook is off
        # (pretty_exceptions_enable=False), so nothing of typer's call is skipped.
        code = _click_command()(standalone_mode=False)
    except typer.TyperException as exc:
        # typer's public base of its (vendored, private) click errors; usage errors exit 2.
        if exc.exit_code != 2:
            raise
        # A usage error carries the context of the command it was given to.
        where: str = getattr(getattr(exc, "ctx", None), "command_path", "memprobe")
        message = (
            _one_dash_option(exc, sys.argv[1:])
            or _option_of_another_command(exc)
            or " ".join(exc.format_message().split())
        )
        if _SPLIT_UNIT.search(message):
            # `--budget 80 GiB`: the shell split the size, and its unit became an argument.
            message += "; write a size without a space, e.g. --budget 80GiB"
        line = long_words_clipped(lookalikes_shown(message))
        typer.echo(f"memprobe: error: {line} (see `{where} --help`)", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        _output_lost(exc)
    sys.exit(code if isinstance(code, int) else 0)


# The narrowest COLUMNS taken as a width: rich lays the help out in it, and below this the
# options' names and words are cut to a few letters a line.
MIN_COLUMNS = 40
# The widest: rich pads every line of the help to the width, so COLUMNS=100000 printed
# 3.5 MB of spaces, and a width past what an index holds (20 digits) ended the help in
# an OverflowError traceback. No terminal is wider than this.
MAX_COLUMNS = 1000


def _drop_unusable_columns() -> None:
    """A COLUMNS of 0 (left by a tool that found no terminal), a few columns or more than
    any screen: rich drew the help in that width, empty at 0 (`memprobe sweep --help`
    printed one blank line), a column of word pieces at 1 to 20, megabytes of padding or
    a traceback past MAX_COLUMNS. Dropped, the terminal's own width (or the width for
    help off a terminal) is used, as for a value that is no number."""
    columns = os.environ.get("COLUMNS")
    if columns is None:
        return
    # (Its digits counted first: int() refuses a text past 4,300 of them.)
    usable = columns.isascii() and columns.isdigit() and len(columns) <= len(str(MAX_COLUMNS))
    if not (usable and MIN_COLUMNS <= int(columns) <= MAX_COLUMNS):
        del os.environ["COLUMNS"]


# An option word led by a dash that is not "-": an en or em dash, a minus sign (what a
# word processor, a chat or a web page makes of "--" when the command is copied from it).
# ASCII hyphens may be mixed in ("–-tokens").
_TYPOGRAPHIC_OPTION = re.compile(r"^([^\x00-\x2c\x2e-\x7f]+)([A-Za-z][A-Za-z0-9-]*)(=.*)?$", re.S)


def _refuse_typographic_dashes(args: list[str]) -> None:
    """``—config g.toml`` (copied from a page that set "--" as an em dash) is no option to
    click: it was an extra argument (``unexpected extra argument (g.toml)``), a path, or
    left the option it spells missing (``Missing option '--budget'`` of a plan that looks
    as if it gave one). Each such word is named, with the dash it holds."""
    import unicodedata

    for arg in args:
        match = _TYPOGRAPHIC_OPTION.match(arg)
        if match is None:
            continue
        lead = match.group(1).replace("-", "")
        if not lead or not all(unicodedata.category(c) == "Pd" or c == "\u2212" for c in lead):
            continue
        names = ", ".join(dict.fromkeys(f"U+{ord(c):04X} {unicodedata.name(c, '?')}" for c in lead))
        typer.echo(
            f"memprobe: error: {quoted(arg)} starts with {names} where '--' belongs (text "
            f"copied from a page or a chat turns '--' into one) (type --{match.group(2)})",
            err=True,
        )
        sys.exit(2)


# A word of letters after one dash: click reads `-tokens` as the short options -t -o -k
# ... and said "No such option: -t", a letter never typed on its own (`-quiet` got past -q
# to "No such option: -u"), while the long option the word spells was one dash away.
_ONE_DASH_WORD = re.compile(r"^-([A-Za-z][A-Za-z0-9-]+)(=.*)?$", re.S)


def _one_dash_option(exc: typer.TyperException, args: list[str]) -> str | None:
    """The usage message for a long option given with one dash (``-budget 80GiB``), when
    the error is click's of a short option it read out of that word; else None."""
    letter = getattr(exc, "option_name", None)
    command = getattr(getattr(exc, "ctx", None), "command", None)
    if not (isinstance(letter, str) and len(letter) == len("-x") and command is not None):
        return None
    spelled = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]}
    for arg in args:
        match = _ONE_DASH_WORD.match(arg)
        if match and f"--{match.group(1)}" in spelled and letter[1] in match.group(1):
            word = match.group(1)
            return f"No such option: -{word} (a long option takes two dashes: --{word})"
    return None


# The options that take a comma-separated list, per command: given twice, the user may
# have meant both lists, or an override (a wrapper's defaults, then their own).
LIST_OPTIONS = {
    "sweep": ("--tokens", "--vocab", "--batch", "--dtype", "--kernel", "--chunk-size", "--tp",
              "--cp", "--hidden"),
    "plan": ("--kernel", "--chunk-size", "--tp", "--cp", "--other-from"),
}  # fmt: skip


def _warn_repeated_lists(args: list[str]) -> None:
    """A list option given twice (``plan --kernel local_chunked --kernel unchunked``,
    ``sweep --tokens 4096 --tokens=20000``): click keeps the last without a word, and the
    plan or sweep ran one list where two were written. The last is still used (a script's
    defaults overridden is the same spelling), with a warning naming what was dropped."""
    lists = LIST_OPTIONS.get(args[0], ()) if args else ()
    seen: dict[str, str] = {}
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            return
        name, eq, value = arg.partition("=")
        if name not in lists:
            continue
        value = value if eq else next(rest, "")
        if name in seen and seen[name] != value:
            typer.echo(
                f"memprobe: warning: {name} given twice: the last, {quoted(value)}, is used "
                f"and {quoted(seen[name])} is not (for both, give one list: "
                f"{name} {seen[name]},{value})",
                err=True,
            )
        seen[name] = value


# What a newcomer asks `plan` with a flag of another command: plan answers the tokens.
_ELSEWHERE_HINTS = {
    ("plan", "--tokens"): "plan answers how many tokens fit; to check one count, run "
    "memprobe sweep --tokens N --vocab V --budget SIZE",
}


def _option_of_another_command(exc: typer.TyperException) -> str | None:
    """``No such option: --tokens`` for an option another memprobe command takes: click's
    guess (``Possible options: --kernel`` for ``plan --tokens``) named an option of no
    likeness; the line says which commands take it instead."""
    name = getattr(exc, "option_name", None)
    ctx = getattr(exc, "ctx", None)
    if not (isinstance(name, str) and name.startswith("--") and ctx is not None):
        return None
    this = ctx.command
    commands = getattr(ctx.find_root().command, "commands", {}) or {}
    takers = [
        cmd_name
        for cmd_name, cmd in commands.items()
        if cmd is not this
        and any(name in (*p.opts, *p.secondary_opts) for p in getattr(cmd, "params", []))
    ]
    if not takers:
        return None
    which = ", ".join(takers)
    message = f"No such option: {name} ({this.name} does not take it; {which} "
    message += "does)" if len(takers) == 1 else "do)"
    hint = _ELSEWHERE_HINTS.get((str(this.name), name))
    return f"{message}; {hint}" if hint else message


class _ReaderMayLeave:
    """Standard output or error whose reader may go away (`memprobe kernels | head -1`):
    from then on what the command prints goes nowhere, as with `>/dev/null`, and the
    command runs to its end and exits with its own status (a gate's verdict stands), rather
    than click's exit 1 at the first write. Every other write error passes through."""

    def __init__(self, stream: TextIO, *, errors_said: bool) -> None:
        self._stream = stream
        self._errors_said = errors_said  # False for stderr itself: nowhere to say them

    def write(self, text: str) -> int:
        try:
            try:
                return self._stream.write(text)
            except UnicodeEncodeError:
                # What the stream's encoding cannot hold, strictly (a file name's non-UTF-8
                # byte, read as a lone surrogate, in a UTF-8 locale): written as its escape.
                encoding = getattr(self._stream, "encoding", None) or "utf-8"
                self._stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
                return len(text)
        except OSError as exc:
            self._lost(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        # Standard error that cannot be written (`2>/dev/full`) has nowhere to say so: the
        # command goes on, its exit status says how it ended.
        if not isinstance(exc, BrokenPipeError) and self._errors_said:
            raise exc
        self._to_null()

    def settle(self) -> None:
        """Flush what is still buffered before the stream is handed back (print() in user
        code does not flush): a reader that left is quiet; a full device is one line."""
        try:
            self.flush()
        except OSError as exc:
            if self._errors_said:
                _output_lost(exc)

    def _to_null(self) -> None:
        # Python flushes the stream again at exit; pointed at /dev/null that cannot fail.
        with open(os.devnull, "w") as null:
            try:
                os.dup2(null.fileno(), self._stream.fileno())
            except (OSError, ValueError, AttributeError):
                pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# What writing standard output fails with: the reader went away (`| head`), the device is
# full (`> /dev/full`), the file is at the size limit (`ulimit -f`), an I/O error. Every
# file memprobe writes turns its own errors into a one-line UserError, so one of these
# reaching main is the output stream's.
_OUTPUT_ERRNOS = {errno.EPIPE, errno.ENOSPC, errno.EFBIG, errno.EIO, errno.EDQUOT, errno.EBADF}


def _output_lost(exc: OSError) -> None:
    """Standard output could not be written: a reader that went away ends the run quietly
    (as `yes | head` does); any other failure is one line on stderr and exit 2."""
    if exc.errno not in _OUTPUT_ERRNOS:
        raise exc
    # Python flushes stdout again at exit; pointed at /dev/null that flush cannot fail.
    with open(os.devnull, "w") as null:
        try:
            os.dup2(null.fileno(), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
    if exc.errno == errno.EPIPE:
        sys.exit(141)  # 128 + SIGPIPE, what the shell reports for a writer cut off
    sys.stderr.write(f"memprobe: error: cannot write the output: {exc.strerror or exc}\n")
    sys.exit(2)
