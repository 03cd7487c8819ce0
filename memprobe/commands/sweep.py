"""``memprobe sweep``: parse the flags, run the sweep job (:func:`memprobe.sweep.run_sweep_job`),
write the report, print."""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.commands.flags import (
    CpOption,
    TpOption,
    answer,
    budget_less_other,
    check_temp_dir,
    given_flags,
    int_list,
    name_list,
    positive_ints,
    user_errors,
    warn_on_size,
)
from memprobe.errors import UserError
from memprobe.io.sizes import parse_budget
from memprobe.io.text import foreign_digit, printable, shell_word
from memprobe.measure.torchrun_env import check_team
from memprobe.records import Grid
from memprobe.results import default_run_dir, read_run_meta

# torch (measure, sweep) and matplotlib (the report) are imported when a sweep
# runs, not when the CLI starts: `memprobe attribute` must not pay for them.


def check_resume_flags(given: list[str]) -> None:
    """--resume takes its cases from the run directory: any flag that shapes them would
    be ignored, so naming one is a mistake to report, not to drop silently."""
    if given:
        raise UserError(
            f"--resume takes its cases from the run directory; {', '.join(given)} would be ignored",
            "drop them, or start a new run without --resume",
        )


# --case-timeout's bounds: a millisecond, and 11 days (a timedelta of twice it fits).
MIN_CASE_TIMEOUT, MAX_CASE_TIMEOUT = 0.001, 1e6


HELP = """Peak memory of each kernel across sequence lengths and vocabularies.

Simulated exactly with meta tensors where there is no GPU, measured on one
where there is. Writes results.csv, results.json, run.json and a report
into the run directory.
"""


@user_errors
def command(
    ctx: typer.Context,
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
    tp: TpOption = "1",
    cp: CpOption = "1",
    device: Annotated[
        str,
        typer.Option(
            help="auto (cuda when available, else meta), meta (exact simulation), cpu, cuda."
        ),
    ] = "auto",
    hidden: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Hidden sizes H, comma list: runs the hidden family (kernels fed hidden "
            "states [B,S,H] and the lm_head weight [V,H], e.g. fused_linear_chunked) "
            "instead of the logits kernels."
        ),
    ] = None,
    grid: Annotated[
        bool, typer.Option("--grid", help="Run the full tokens x vocab product, not the cross.")
    ] = False,
    ladder: Annotated[
        bool,
        typer.Option(
            help="A single --tokens or --vocab value N becomes a x2 ladder ending at N; "
            "--no-ladder runs exactly the values given."
        ),
    ] = True,
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
    report: Annotated[
        bool,
        typer.Option(
            help="Write report.html and its PNG plots into the run directory; with "
            "--no-report only the results and snapshots (`memprobe report RUN` writes the "
            "report later)."
        ),
    ] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a machine-readable summary on stdout.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress, no table: just the run directory.")
    ] = False,
    alloc_conf: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Caching-allocator settings in PYTORCH_ALLOC_CONF syntax, e.g. "
            "expandable_segments:True: the allocator model's on meta/cpu (reserved_peak_bytes), "
            "the real allocator's on cuda. Default: PYTORCH_CUDA_ALLOC_CONF (else "
            "PYTORCH_ALLOC_CONF) from the environment, as torch reads it; else torch's "
            "defaults. run.json records the settings used."
        ),
    ] = None,
    shard: Annotated[
        bool,
        typer.Option(
            "--shard",
            help="Under torchrun: share the cases out across the ranks (one device each); "
            "rank 0 writes the one run directory.",
        ),
    ] = False,
    case_timeout: Annotated[
        str,
        typer.Option(
            # Bounded (below, NaN too): a team's rendezvous waits twice this as a
            # timedelta, which overflows at inf or 1e300 (a traceback on every rank of a
            # tp/cp team). Text, read by _seconds: a float option handed on 1e400 as inf.
            metavar="SECONDS",
            help="With --shard: seconds rank 0 waits for a case another rank took; a rank "
            "still silent then (hung) gets the case recorded as unfinished, and the job "
            "stops with a non-zero exit (--resume runs the case again).",
        ),
    ] = "600",
    budget: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="One GPU's memory, e.g. 80GiB: a `fits` column per case, which kernels fit "
            "in the answer, a line in the report (default: the GPU's capacity on cuda)."
        ),
    ] = None,
    other: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="With --budget: what the rest of the job holds on that GPU (weights, "
            "optimizer...), e.g. 54GiB; cases must fit BUDGET - OTHER, as in `memprobe plan`."
        ),
    ] = None,
) -> None:
    from memprobe.render import REPORT_NAME
    from memprobe.render.console import Progress, show
    from memprobe.render.terminal import answer_lines, json_summary, sweep_table

    timeout_s = _seconds(case_timeout)
    if not shard and "--case-timeout" in given_flags(ctx):
        raise UserError(
            "--case-timeout is how long a --shard job waits for a rank; without --shard "
            "it would be ignored",
            "add --shard (under torchrun), or drop --case-timeout",
        )

    # Parsed before the sweep runs: a typo must not cost a whole sweep.
    warn_on_size(budget, "--budget")
    warn_on_size(other, "--other")
    budget_bytes = parse_budget(budget) if budget is not None else None
    if budget_bytes is not None and resume is None:
        from memprobe.allocator import alloc_conf_setting
        from memprobe.allocator.config import refuse_fraction_under_budget

        refuse_fraction_under_budget(alloc_conf_setting(alloc_conf), budget_bytes)
    recorded = None if budget_bytes is None else (budget_bytes, 0)
    if other is not None:
        with_other = budget_less_other(budget, budget_bytes, other)
        recorded = (with_other.budget_bytes, with_other.other_bytes)
    if resume is not None:
        check_resume_flags(
            given_flags(
                ctx,
                exclude=("resume", "verify", "report", "as_json", "quiet", "shard", "case_timeout"),
            )
        )
        if report:
            from memprobe.render.html import refuse_foreign_page

            refuse_foreign_page(Path(resume))
    elif out is None:
        out = default_run_dir()
    tp_list = positive_ints(tp, "--tp", example="1,2,4")
    cp_list = positive_ints(cp, "--cp", example="1,2,4")
    if not shard:
        # A torchrun job of the wrong size fails here, before its ranks import torch.
        check_team(device, tp_list, cp_list)
    # What runs_torch checks, here: after the checks above, which need no torch (the
    # check imports it, seconds a refused rank or typo need not pay).
    check_temp_dir()
    from memprobe.sweep import SweepRequest, run_sweep_job

    if shard:
        from memprobe.sharded_sweep import run_sharded_job as run_job
    else:
        run_job = run_sweep_job
    request = SweepRequest(
        grid=Grid(
            tokens=tuple(positive_ints("20000" if tokens is None else tokens, "--tokens")),
            vocab=tuple(positive_ints("131072" if vocab is None else vocab, "--vocab")),
            batch=tuple(positive_ints(batch, "--batch", example="1,2")),
            dtype=tuple(name_list(dtype, "--dtype")),
            kernel=None if kernel is None else tuple(name_list(kernel, "--kernel")),
            chunk_size=tuple(int_list(chunk_size, "--chunk-size", allow_none=True)),
            tp=tuple(tp_list),
            cp=tuple(cp_list),
            device=device,
            grid=grid,
            ladder=ladder,
            hidden=None if hidden is None else tuple(positive_ints(hidden, "--hidden")),
        ),
        out=out,
        resume=resume,
        verify=verify,
        alloc_conf=alloc_conf,
        command="memprobe " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        case_timeout_s=timeout_s,
        budget=recorded,
    )
    try:
        outcome = run_job(request, Progress(enabled=not quiet and not as_json).case)
    except KeyboardInterrupt:
        where = resume or out
        typer.echo(
            f"interrupted: finished cases are in {where}; continue with --resume "
            f"{shell_word(where)}",
            err=True,
        )
        raise typer.Exit(130) from None
    if not outcome.lead:
        return
    # The budget run.json records (a resume's too, which takes no --budget): the page,
    # the table and a later `memprobe report` all mark the same one.
    from memprobe.report.headline import given_budget
    from memprobe.results_errors import recorded_budget

    meta = read_run_meta(outcome.run_dir)
    budget_bytes, _ = given_budget(meta, None)
    page = None
    if report:
        from memprobe.render import write_report  # matplotlib: only for the page

        page = write_report(outcome.run_dir)
    if not report and (outcome.run_dir / REPORT_NAME).exists():
        # A resumed run's old page would show fewer rows than the run now holds.
        typer.echo(
            f"note: {outcome.run_dir / REPORT_NAME} was written before this resume; "
            f"`memprobe report {shell_word(outcome.run_dir)}` brings it up to date",
            err=True,
        )
    if as_json:
        answer(json.dumps(json_summary(outcome.frame, str(outcome.run_dir)), indent=1))
        return
    if not quiet:
        show(sweep_table(outcome.frame, budget_bytes=budget_bytes))
        typer.echo("")
        kept = recorded_budget(meta)
        if kept is not None and kept[1]:
            from memprobe.plan import make_budget
            from memprobe.render.plan_text import budget_line

            typer.echo(budget_line(make_budget(*kept)))
        for line in answer_lines(outcome.frame, meta, budget_bytes=None):
            typer.echo(line)
        if page is not None:
            typer.echo(f"report: {printable(str(page))}")
    typer.echo(f"run directory: {printable(str(outcome.run_dir))}")


def _seconds(text: str) -> float:
    """--case-timeout's seconds, refused in the words they were typed in. Checked here, not
    by typer's float and min/max: NaN passed under those as "should be less than or equal
    to 1000000", which it is not more than, and a number past a float (1e400) or below
    one (1e-400) was echoed as the float it became, "--case-timeout inf" or "0.0"."""
    try:
        # Only 0-9: float() reads any script's digits (see foreign_digit).
        seconds = math.nan if foreign_digit(text) else float(text)
    except ValueError:
        seconds = math.nan
    if not MIN_CASE_TIMEOUT <= seconds <= MAX_CASE_TIMEOUT:
        raise UserError(
            f"--case-timeout {text!r} is not a number of seconds from "
            f"{MIN_CASE_TIMEOUT:g} to {MAX_CASE_TIMEOUT:,.0f} (11 days)",
            "e.g. --case-timeout 600",
        )
    return seconds
