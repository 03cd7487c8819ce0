"""``memprobe gate``: run the gate (:func:`memprobe.gate.run_gate`: config, results or the
configured sweep, rules and baseline), write its reports, exit 0/1/2."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.commands.flags import user_errors
from memprobe.errors import UserError
from memprobe.gate import GateRequest, run_gate
from memprobe.io.text import foreign_digit
from memprobe.render.gate_text import format_verdict
from memprobe.render.junit import write_junit
from memprobe.render.markdown import append_step_summary

HELP = """Fail CI when a peak crosses a rule or regresses against a baseline.

Rules live in tool.memprobe.gate of pyproject.toml: a kernel glob, optional
filters (tokens, vocab, batch, dtype, chunk_size, tp, cp, device) and limits
(max_peak, max_peak_over_floor, max_big_fp32_blocks). Exit 0 when every
check passes, 1 on any violation, 2 on a config or usage error (a rule that
matches no case is one).
"""


@user_errors
def command(
    results: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Argument(help="Run directory or results.json (default: run tool.memprobe.sweep)."),
    ] = None,
    config: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="TOML file with tool.memprobe (default: nearest pyproject.toml)."),
    ] = None,
    baseline: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="results.json of an earlier run: fail on growth, loss, oom/error."),
    ] = None,
    max_regression: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(metavar="PCT", help="Peak growth allowed over the baseline, % (default: 0)."),
    ] = None,
    junit_xml: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Write a JUnit XML file: one testcase per rule x case."),
    ] = None,
    update_baseline: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Write these results as the new baseline (the checks still run)."),
    ] = None,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Run directory for the gate's own sweep (default: reports/gate/TIME)."),
    ] = None,
) -> None:
    from memprobe.render.console import Progress

    request = GateRequest(
        results=results,
        config=config,
        baseline=baseline,
        max_regression=_percent(max_regression),
        junit_xml=junit_xml,
        update_baseline=update_baseline,
        out=out,
        progress=Progress().case,
    )
    outcome = run_gate(request)
    verdict = outcome.verdict
    if verdict is None:  # a torchrun rank but 0: rank 0 reports
        return
    written = []
    if junit_xml is not None:
        write_junit(junit_xml, verdict)
        written.append(junit_xml)
    warning = append_step_summary(verdict, outcome.inputs, [*written, *outcome.written])
    if warning:
        typer.echo(f"memprobe: warning: {warning}", err=True)
    typer.echo(format_verdict(verdict, written=[*written, *outcome.written]))
    raise typer.Exit(outcome.exit_code)


def _percent(value: str | None) -> float | None:
    """--max-regression as a number of percent. "5%" is how a percentage is written (the
    flag's metavar is PCT), and was refused as "Input should be a valid number, unable to
    parse string as a number"; the sign is dropped, whatever else is no number is said so.
    A number that is no percentage (inf, nan, below 0, or past a float: 1e400 read as
    inf) is refused here, in the words it was typed in: the gate's own check could only
    echo the float ("--max-regression inf")."""
    if value is None:
        return None
    hint = "e.g. --max-regression 5 for 5%"
    digit = foreign_digit(value)
    if digit:
        raise UserError(f"--max-regression {value!r} is written with {digit}, not 0-9", hint)
    try:
        number = float(value.strip().removesuffix("%"))
    except ValueError:
        raise UserError(f"--max-regression {value!r} is not a percentage", hint) from None
    if not math.isfinite(number) or number < 0:
        raise UserError(f"--max-regression {value!r} is not a percentage of zero or more", hint)
    return number
