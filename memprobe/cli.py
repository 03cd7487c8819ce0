"""The memprobe command line: assembles the commands in :mod:`memprobe.commands`.

Nothing imports this module; only the console script and ``python -m memprobe`` run it.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from memprobe import __version__
from memprobe.commands import attribute, gate, kernels, plan, report, sweep

app = typer.Typer(
    name="memprobe",
    help=(
        "Memory profiling and regression gates for the kernels that turn LLM logits "
        "[B, S, V] into per-token log-probabilities.\n\n"
        "Plan: `memprobe sweep` (simulated exactly on any machine, measured on a GPU). "
        "Diagnose: `memprobe attribute SNAPSHOT`. Guard: `memprobe gate`."
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
app.command("report")(report.command)
app.command("plan")(plan.command)


def main() -> None:
    app()
