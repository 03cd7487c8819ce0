"""The memprobe command line: parse, call one function, print. Nothing else."""

from __future__ import annotations

import functools
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional, ParamSpec

import typer

from memprobe import __version__
from memprobe.errors import UserError

P = ParamSpec("P")

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


def user_errors(command: Callable[P, None]) -> Callable[P, None]:
    """Every user mistake ends the same way: one line on stderr, exit 2.

    Done in each command rather than around ``app()`` so that it holds however
    the command is invoked (the console script, ``python -m``, typer's CliRunner).
    """

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except UserError as exc:
            typer.echo(f"memprobe: error: {exc.one_line()}", err=True)
            raise typer.Exit(2) from None

    return run


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


@app.command()
def kernels() -> None:
    """List the kernels memprobe ships: one line each, name and what it is."""
    from memprobe.kernels import KERNELS

    width = max(len(n) for n in KERNELS)
    for name, spec in KERNELS.items():
        typer.echo(f"{name:<{width}}  {spec.summary}")


@app.command()
@user_errors
def sweep(
    tokens: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Sequence lengths, comma list; one value N is a x2 ladder to N. (default: 20000)"
        ),
    ] = None,
    vocab: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Vocabulary sizes, comma list; one value N is a x2 ladder to N. (default: 131072)"
        ),
    ] = None,
    batch: Annotated[str, typer.Option(help="Batch sizes, comma list.")] = "1",
    dtype: Annotated[
        str, typer.Option(help="Logits dtypes, comma list of bf16, fp16, fp32.")
    ] = "bf16",
    kernel: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Kernels, comma list (`memprobe kernels`). (default: all single-device kernels)"
        ),
    ] = None,
    chunk_size: Annotated[
        str, typer.Option(help="Chunk sizes for chunked kernels, comma list.")
    ] = "1024",
    tp: Annotated[
        str, typer.Option(help="Tensor-parallel sizes (vocabulary shards), comma list.")
    ] = "1",
    cp: Annotated[
        str, typer.Option(help="Context-parallel sizes (token shards), comma list.")
    ] = "1",
    device: Annotated[
        str,
        typer.Option(
            help="auto (cuda when available, else meta), meta (exact simulation), cpu, cuda."
        ),
    ] = "auto",
    grid: Annotated[
        bool, typer.Option("--grid", help="Run the full tokens x vocab product, not the cross.")
    ] = False,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Run directory to create. (default: reports/<run-id>/)"),
    ] = None,
    resume: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Finish an interrupted run: runs only its missing cases."),
    ] = None,
    verify: Annotated[
        bool, typer.Option(help="Check each kernel x dtype against float64 at a small CPU shape.")
    ] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a machine-readable summary on stdout.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress, no table: just the run directory.")
    ] = False,
    budget: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Budget the report marks, e.g. 80GiB (default: the GPU's capacity)."),
    ] = None,
) -> None:
    """Peak memory of each kernel across sequence lengths and vocabularies.

    Simulated exactly with meta tensors where there is no GPU, measured on one
    where there is. Writes results.csv, results.json, run.json and a report
    into the run directory.
    """
    from memprobe.cli_parse import int_list, name_list, positive_ints
    from memprobe.render.progress import CaseProgress
    from memprobe.render.terminal import json_summary, table_lines
    from memprobe.results import default_run_dir
    from memprobe.sweep_job import SweepRequest, check_resume_flags, run_sweep_job
    from memprobe.units import parse_size

    # Parsed before the sweep runs: a typo must not cost a whole sweep.
    budget_bytes = parse_size(budget, what="--budget") if budget is not None else None
    if resume is not None:
        check_resume_flags({"--tokens": tokens, "--vocab": vocab, "--kernel": kernel, "--out": out})
    elif out is None:
        out = default_run_dir()
    request = SweepRequest(
        tokens=positive_ints(tokens or "20000", "--tokens"),
        vocab=positive_ints(vocab or "131072", "--vocab"),
        batch=positive_ints(batch, "--batch"),
        dtype=name_list(dtype),
        kernel=name_list(kernel) if kernel else None,
        chunk_size=int_list(chunk_size, "--chunk-size", allow_none=True),
        tp=positive_ints(tp, "--tp"),
        cp=positive_ints(cp, "--cp"),
        device=device,
        grid=grid,
        out=out,
        resume=resume,
        verify=verify,
        budget_bytes=budget_bytes,
        command="memprobe " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    )
    try:
        outcome = run_sweep_job(request, CaseProgress(enabled=not quiet and not as_json))
    except KeyboardInterrupt:
        where = resume or out
        typer.echo(
            f"interrupted: finished cases are in {where}; continue with --resume {where}", err=True
        )
        raise typer.Exit(130) from None
    if not outcome.lead:
        return
    if as_json:
        typer.echo(json.dumps(json_summary(outcome.frame, str(outcome.run_dir)), indent=1))
        return
    if not quiet:
        for line in table_lines(outcome.frame):
            typer.echo(line)
        typer.echo(f"report: {outcome.report}")
    typer.echo(f"run directory: {outcome.run_dir}")


@app.command()
@user_errors
def gate(
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
        Optional[float],  # noqa: UP045
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
    """Fail CI when a peak crosses a rule or regresses against a baseline.

    Rules live in tool.memprobe.gate of pyproject.toml: a kernel glob, optional
    filters (tokens, vocab, batch, dtype, chunk_size, tp, cp, device) and limits
    (max_peak, max_peak_over_floor, max_big_fp32_blocks). Exit 0 when every
    check passes, 1 on any violation, 2 on a config or usage error (a rule that
    matches no case is one).
    """
    from memprobe.gate import GateRequest, run_gate
    from memprobe.render.progress import CaseProgress

    request = GateRequest(
        results=results,
        config=config,
        baseline=baseline,
        max_regression=max_regression,
        junit_xml=junit_xml,
        update_baseline=update_baseline,
        out=out,
        progress=CaseProgress(),
    )
    outcome = run_gate(request)
    for warning in outcome.warnings:
        typer.echo(f"memprobe: warning: {warning}", err=True)
    typer.echo(outcome.text)
    raise typer.Exit(outcome.exit_code)


@app.command()
@user_errors
def attribute(
    snapshot: Annotated[
        Path, typer.Argument(help="CUDA allocator snapshot (.pickle from torch or memprobe).")
    ],
    vocab: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="Vocabulary size V: narrows the [B,S,V] explanations."),
    ] = None,
    tokens: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="Sequence length S (tokens per sequence)."),
    ] = None,
    batch: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="Batch size B."),
    ] = None,
    top: Annotated[int, typer.Option(min=1, help="Blocks listed at the peak and each OOM.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    html: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Also write a self-contained HTML page of the findings."),
    ] = None,
) -> None:
    """Name the big blocks of a snapshot: peak, [B,S,V] fits, op, frame, phase, OOMs."""
    from memprobe.attribute_text import attribute_command

    text = attribute_command(
        snapshot, vocab=vocab, tokens=tokens, batch=batch, top=top, as_json=as_json, html_path=html
    )
    typer.echo(text)


@app.command()
@user_errors
def report(
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
    from memprobe.render import write_report
    from memprobe.units import parse_size

    budget_bytes = parse_size(budget, what="--budget") if budget is not None else None
    page = write_report(run_dir, out, budget_bytes=budget_bytes)
    typer.echo(f"report: {page}")


def main() -> None:
    app()
