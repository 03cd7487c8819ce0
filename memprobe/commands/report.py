"""``memprobe report``: re-render a run's page and plots from its results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.commands.flags import user_errors


@user_errors
def command(
    run_dir: Annotated[Path, typer.Argument(help="Run directory made by `memprobe sweep`.")],
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Page to write (default: RUN_DIR/report.html); PNGs go beside it."),
    ] = None,
    budget: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Memory budget to mark, e.g. 80GiB (default: a cuda run's GPU capacity)."
        ),
    ] = None,
) -> None:
    """Re-render a run's self-contained report.html and PNG plots from its results."""
    from memprobe.io.files import guard_outputs
    from memprobe.io.sizes import parse_size
    from memprobe.render import write_report
    from memprobe.results import run_inputs

    budget_bytes = parse_size(budget, what="--budget") if budget is not None else None
    if out is not None:
        guard_outputs({"--out": out}, run_inputs(run_dir))
    page = write_report(run_dir, out, budget_bytes=budget_bytes)
    typer.echo(f"report: {page}")
