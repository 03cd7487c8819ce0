"""What every command shares: comma-list flags parsed into typed values, and user
mistakes turned into one line and exit 2."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, ParamSpec, TextIO

import typer

from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes, parse_size
from memprobe.io.text import foreign_digit, long_words_clipped, lookalikes_shown, printable
from memprobe.records import MAX_COUNT

if TYPE_CHECKING:
    from memprobe.plan import Budget

P = ParamSpec("P")

# The parallel layout flags, worded once for every command that takes them.
TpOption = Annotated[
    str, typer.Option(help="Tensor-parallel sizes (vocabulary shards), comma list.")
]
CpOption = Annotated[str, typer.Option(help="Context-parallel sizes (token shards), comma list.")]


def user_errors(command: Callable[P, None]) -> Callable[P, None]:
    """Every user mistake ends the same way: one line on stderr, exit 2.

    Done in each command rather than around ``app()`` so that it holds however
    the command is invoked (the console script, ``python -m``, typer's CliRunner).
    """

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            _check_mplbackend()
            with answer_alone() if kwargs.get("as_json") else contextlib.nullcontext():
                command(*args, **kwargs)
        except UserError as exc:
            # printable: a message can quote a file's text (a TOML line, a frame name).
            line = long_words_clipped(lookalikes_shown(printable(exc.one_line())))
            typer.echo(f"memprobe: error: {line}", err=True)
            raise typer.Exit(2) from None
        except OSError as exc:
            # A path the file system refuses to even look at: a name past 255 bytes
            # (ENAMETOOLONG) raises from pathlib's exists() and is_dir(), which most
            # checks of a user's path begin with. An error with no file (standard output
            # gone) is not this: it passes through to the CLI's own handling.
            if exc.filename is None:
                raise
            reason = exc.strerror or type(exc).__name__
            typer.echo(
                f"memprobe: error: cannot use {long_words_clipped(printable(str(exc.filename)))}: "
                f"{reason} "
                "(give a path the file system accepts)",
                err=True,
            )
            raise typer.Exit(2) from None

    return run


# Where the command's answer goes while answer_alone() holds standard output for it.
_ANSWER: list[TextIO] = []


@contextlib.contextmanager
def answer_alone() -> Iterator[None]:
    """With ``--json``, standard output holds the JSON object alone: whatever else prints
    while the command runs goes to standard error, and the command writes its object with
    :func:`answer`. Not only user code prints (its calls are guarded): a finalizer it left
    on a tensor (``weakref.finalize(logits, print, ...)``), or an object's ``__del__``, ran
    in memprobe's own work after the call and printed into the object a program reads."""
    _ANSWER.append(sys.stdout)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = _ANSWER.pop()


def answer(text: str) -> None:
    """The command's answer, on standard output (see :func:`answer_alone`)."""
    typer.echo(text, file=_ANSWER[-1] if _ANSWER else None)


def runs_torch(command: Callable[P, None]) -> Callable[P, None]:
    """A command that runs torch's ops (a kernel's meta simulation, a step): checks first
    what torch needs of the process to start them. Put below :func:`user_errors`."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        check_temp_dir()
        command(*args, **kwargs)

    return run


def check_temp_dir() -> None:
    """torch imports torch._dynamo at its first autograd op, and that import asks tempfile
    for a writable temporary directory: with none (TMPDIR unwritable or gone and /tmp read-
    only, or ``ulimit -f 0``), every kernel and step failed there, and the one line blamed
    the kernel ("unchunked failed in the meta simulation") or meta ("try --device cpu")."""
    try:
        tempfile.gettempdir()  # found once, then cached for the process
    except FileNotFoundError:
        tmpdir = os.environ.get("TMPDIR")
        given = f"TMPDIR={tmpdir!r}, " if tmpdir else ""
        raise UserError(
            f"no usable temporary directory, which torch needs to start: {given}/tmp, "
            "/var/tmp, /usr/tmp and the current directory take no file (missing, read-only, "
            "or ulimit -f)",
            "set TMPDIR to a directory you can write to, e.g. TMPDIR=$HOME/tmp",
        ) from None
    _check_torch_cache_dir()


def _check_torch_cache_dir() -> None:
    """The same import makes torch's cache directory (TORCHINDUCTOR_CACHE_DIR, else one in
    the temporary directory): where it cannot be made (a path under a file, a file of that
    name), every case of a sweep was an error row "NotADirectoryError", and a step's line
    blamed meta ("try --device cpu"). Made here, as torch would, so the line names it."""
    try:
        # Importing it may make the directory already (torch._inductor's own import does).
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        cache_dir()
    except ImportError:  # a torch without it makes none
        return
    except OSError as exc:
        given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        where = f"TORCHINDUCTOR_CACHE_DIR={given!r}" if given else f"{exc.filename!r}"
        raise UserError(
            f"torch's cache directory {where} cannot be made, which torch needs to start: "
            f"{exc.strerror or type(exc).__name__}",
            "set TORCHINDUCTOR_CACHE_DIR to a directory you can write to, or unset it",
        ) from None


def _check_mplbackend() -> None:
    """matplotlib validates ``$MPLBACKEND`` as it is imported: a name it does not know
    ended every command that draws (report, sweep, plan --out, attribute --html) in its
    traceback, halfway, though memprobe draws on Agg whatever it names. Checked before the
    command starts, and only when it is set (else matplotlib's import is not paid here)."""
    backend = os.environ.get("MPLBACKEND")
    if not backend:
        return
    try:
        import matplotlib  # noqa: F401
    except ValueError:
        raise UserError(
            f"MPLBACKEND={backend!r} in the environment is not a matplotlib backend",
            "unset it or name one, e.g. MPLBACKEND=Agg; memprobe draws with Agg whatever it names",
        ) from None


def int_list(
    text: str, flag: str, *, allow_none: bool = False, example: str = "1024,2048"
) -> list[int | None]:
    """``"1024,2048"`` → ``[1024, 2048]``; every item a positive integer, each value once
    (in the order first given). ``example`` is
    the value a mistake's hint shows (one value for a flag that takes one)."""
    _refuse_grouped_number(text, flag)
    values: list[int | None] = []
    for item in text.split(","):
        item = item.strip().replace("_", "")
        if allow_none and item.lower() == "none":
            values.append(None)
            continue
        digit = foreign_digit(item)
        if digit:
            raise UserError(
                f"{flag} {text!r}: {item!r} is written with {digit}, not the digits 0-9",
                f"e.g. {flag} {example}",
            )
        try:
            value = int(item)
        except ValueError:
            raise UserError(
                f"{flag} {text!r}: {item!r} is not a whole number", f"e.g. {flag} {example}"
            ) from None
        if value <= 0:
            raise UserError(f"{flag} {text!r}: {value} must be positive", f"e.g. {flag} {example}")
        if value > MAX_COUNT:
            shown = item if len(item) <= 20 else f"a number of {len(item)} digits"
            raise UserError(
                f"{flag}: {shown} is beyond the largest count memprobe simulates "
                f"({MAX_COUNT:,} = 2^40)",
                f"e.g. {flag} {example}",
            )
        values.append(value)
    # A value given twice is one value (``--tp 2,2,1`` plans tp 2 once).
    return list(dict.fromkeys(values))


# A number written with thousands separators, as memprobe prints counts ("131,072
# tokens/GPU"): in a comma list each group is a value of its own.
_GROUPED = re.compile(r"\s*[0-9]{1,3}(?:,[0-9]{3})+\s*")


def grouped_number(text: str) -> str | None:
    """The number ``text`` spells with thousands separators (``"131,072"`` → ``"131072"``),
    or None when it is not written so."""
    return text.replace(",", "").strip() if _GROUPED.fullmatch(text) else None


def _refuse_grouped_number(text: str, flag: str) -> None:
    """``--tokens 1,024`` (a count copied from memprobe's own output): the list 1, 24, run
    as two values without a word, and ``--batch 1,000`` was "0 must be positive". A group
    after a comma that starts with 0 is no value anyone writes in a list, so the text is
    read as the one number it spells and refused with how to write it."""
    grouped = grouped_number(text)
    groups = text.split(",")[1:]
    if grouped is None or not any(g.strip().startswith("0") for g in groups):
        return
    raise UserError(
        f"{flag} {text!r}: a comma separates values here, so this is the list "
        f"{', '.join(str(int(g)) for g in text.split(','))}, not one number",
        f"for the number write {flag} {grouped}, without separators",
    )


def positive_ints(text: str, flag: str, *, example: str = "1024,2048") -> list[int]:
    return [v for v in int_list(text, flag, example=example) if v is not None]


def name_list(text: str, flag: str) -> list[str]:
    """``"a, b"`` → ``["a", "b"]``, each name once; an empty item (``",,"``, ``""``) is a
    mistake, not "default"."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise UserError(f"{flag} {text!r} has an empty item", f"e.g. {flag} a,b (no empty names)")
    return list(dict.fromkeys(items))


def given_flags(ctx: typer.Context, *, exclude: tuple[str, ...] = ()) -> list[str]:
    """The options the user typed (not defaulted), as ``--flag`` names."""
    given = []
    for param in ctx.command.params:
        if param.name in exclude or param.name is None:
            continue
        source = ctx.get_parameter_source(param.name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            # A --x/--no-x switch is named as typed.
            negative = getattr(param, "secondary_opts", None)
            if negative and ctx.params.get(param.name) is False:
                given.append(negative[0])
            else:
                given.append(max(param.opts, key=len))
    return given


# A GPU's memory (or the job's share of it) typed as a bare number below this is
# almost surely meant in GiB: "--other 58" is 58 bytes.
_PLAUSIBLE_BYTES = 2**20


def warn_on_size(text: str | None, flag: str) -> None:
    """Warn on stderr when a memory size probably is not what its writer meant: a bare
    number below 1 MiB (``--other 58`` is 58 bytes), or a ``--budget`` in decimal GB where
    a GPU's memory is binary (an "80GB" card holds 80 GiB; ``80GB`` is 74.51 GiB)."""
    if text is None:
        return
    decimal = re.fullmatch(r"\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([KMGT]B)\s*", text, flags=re.I)
    if not (decimal and flag == "--budget") and not re.fullmatch(
        r"\s*[0-9][0-9_,]*(\.[0-9]+)?\s*", text
    ):
        return
    try:
        value = parse_size(text, what=flag)
    except (UserError, OverflowError, ValueError):
        return  # not a size memprobe reads: the command's own parsing says so
    if decimal:
        number, unit = decimal.groups()
        typer.echo(
            f"memprobe: warning: {flag} {text.strip()} is {format_bytes(value)} "
            f"({unit.upper()} counts powers of ten); a GPU sold as {number}{unit.upper()} "
            f"holds {number}{unit[0].upper()}iB: write that if you mean the card",
            err=True,
        )
    elif 0 < value < _PLAUSIBLE_BYTES:
        typer.echo(
            f"memprobe: warning: {flag} {text.strip()} has no unit, so it is "
            f"{format_bytes(value)}; for gibibytes write {text.strip()}GiB",
            err=True,
        )


def budget_less_other(budget: str | None, budget_bytes: int | None, other: str) -> Budget:
    """``--budget`` less ``--other``, checked alike by every command that takes both
    (sweep, report; plan through its own :func:`memprobe.plan.make_budget` call)."""
    if budget is None or budget_bytes is None:
        raise UserError("--other needs --budget", "e.g. --budget 80GiB --other 54GiB")
    from memprobe.plan import make_budget

    with_other = make_budget(budget_bytes, other)  # the plan's checks and wording
    if with_other.limit_bytes <= 0:
        raise UserError(
            f"--other {other!r} leaves nothing of --budget {budget!r}",
            "--other is the part of the GPU the rest of the job holds",
        )
    return with_other
