"""The memprobe command line: parse, call one function, print. Nothing else."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from memprobe import __version__
from memprobe.errors import UserError

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
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    pass


@app.command()
def kernels() -> None:
    """List the kernels memprobe ships: one line each, name and what it is."""
    from memprobe.kernels import KERNELS

    width = max(len(n) for n in KERNELS)
    for name, spec in KERNELS.items():
        typer.echo(f"{name:<{width}}  {spec.summary}")


def fail(message: str) -> None:
    """Print one line to stderr and exit 2: how every user mistake ends."""
    typer.echo(f"memprobe: error: {message}", err=True)
    raise typer.Exit(2)


def main() -> None:
    try:
        app()
    except UserError as exc:
        typer.echo(f"memprobe: error: {exc.one_line()}", err=True)
        sys.exit(2)
