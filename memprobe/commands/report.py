"""``memprobe report``: re-render a run's page and plots from its results."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.commands.flags import budget_less_other, user_errors, warn_on_size
from memprobe.errors import UserError
from memprobe.io.text import printable

HELP = """Re-render a run's self-contained report.html and PNG plots from its results."""


@user_errors
def command(
    run_dir: Annotated[Path, typer.Argument(help="Run directory made by `memprobe sweep`.")],
    out: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Page to write, or a folder for its report.html (default: "
            "RUN_DIR/report.html); PNGs go beside it."
        ),
    ] = None,
    budget: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Memory budget to mark, e.g. 80GiB (default: the sweep's --budget less its "
            "--other, as run.json records them; else a cuda run's GPU capacity)."
        ),
    ] = None,
    other: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="With --budget: what the rest of the job holds on that GPU, e.g. 54GiB; "
            "cases must fit BUDGET - OTHER, as in `memprobe sweep`."
        ),
    ] = None,
) -> None:
    from memprobe.io.files import file_in_the_way, guard_outputs
    from memprobe.io.sizes import parse_budget
    from memprobe.render import REPORT_NAME, write_report
    from memprobe.results import run_inputs

    warn_on_size(budget, "--budget")  # `--budget 80` (bytes) or 80GB, as sweep and plan warn
    warn_on_size(other, "--other")
    budget_bytes = parse_budget(budget) if budget is not None else None
    source = None
    if other is not None:
        budget_bytes, source = _less_other(budget, budget_bytes, other)
    page_path = Path(out) if out is not None else None
    if out is not None and out.endswith(("/", os.sep)) and not Path(out).is_dir():
        # Path() drops the trailing slash: "DIR/" would otherwise become a file named DIR.
        blocked = file_in_the_way(Path(out) / REPORT_NAME)
        if blocked is not None:  # "create it first" cannot be done where a file stands
            raise UserError(
                f"--out {out}: {blocked} is a file, not a folder",
                "choose another --out, or move that file",
            )
        raise UserError(f"--out {out}: no such folder", "create it first, or name a page file")
    if page_path is not None:
        guard_outputs({"--out": page_path}, run_inputs(run_dir))
    page = write_report(run_dir, page_path, budget_bytes=budget_bytes, budget_source=source)
    typer.echo(f"report: {printable(str(page))}")


def _less_other(budget: str | None, budget_bytes: int | None, other: str) -> tuple[int, str]:
    """--budget less --other, checked as sweep checks them, and the words the page names
    the figure with (the sweep's own page says the same)."""
    from memprobe.report.headline import budget_words

    with_other = budget_less_other(budget, budget_bytes, other)
    return with_other.limit_bytes, budget_words(with_other.budget_bytes, with_other.other_bytes)
