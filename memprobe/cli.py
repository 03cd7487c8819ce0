"""The memprobe command line: assembles the commands in :mod:`memprobe.commands`.

Nothing imports this module; only the console script and ``python -m memprobe`` run it.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

try:  # typer ≥ 0.20 vendors click; older ones use the click package
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import UsageError

    NoArgsIsHelpError = ()  # type: ignore[assignment,misc]

from memprobe import __version__
from memprobe.commands import attribute, diff, gate, kernels, plan, profile, report, step, sweep

app = typer.Typer(
    name="memprobe",
    help=(
        "Memory profiling and regression gates for the kernels that turn LLM logits "
        "[B, S, V] into per-token log-probabilities.\n\n"
        "Plan: `memprobe sweep` (simulated exactly on any machine, measured on a GPU). "
        "Diagnose: `memprobe attribute SNAPSHOT`, or `memprobe profile pkg.mod:step` for your "
        "own training step. Guard: `memprobe gate`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"memprobe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],  # noqa: UP045 - typer needs Optional on py3.10
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = None,
) -> None:
    pass


app.command("kernels")(kernels.command)
app.command("sweep")(sweep.command)
app.command("gate")(gate.command)
app.command("attribute")(attribute.command)
app.command("diff")(diff.command)
app.command("report")(report.command)
app.command("plan")(plan.command)
app.command("profile")(profile.command)
app.command("step")(step.command)


def main() -> None:
    """Run the CLI. A usage mistake (unknown option, bad value) is one line and exit 2,
    like every other user mistake, not a framed box."""
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(2)
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "memprobe"
        message = " ".join(exc.format_message().split())
        typer.echo(f"memprobe: error: {message} (see `{where} --help`)", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
