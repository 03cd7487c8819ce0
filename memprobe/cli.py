"""The memprobe command line: parse, call one function, print. Nothing else."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe import __version__
from memprobe.errors import UserError
from memprobe.units import format_bytes

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


@app.command()
def sweep(
    tokens: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Sequence lengths, comma list. One value N means a x2 ladder ending at N. [default: 20000]"),
    ] = None,
    vocab: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Vocabulary sizes, comma list. One value N means a x2 ladder ending at N. [default: 131072]"),
    ] = None,
    batch: Annotated[str, typer.Option(help="Batch sizes, comma list.")] = "1",
    dtype: Annotated[str, typer.Option(help="Logits dtypes, comma list of bf16, fp16, fp32.")] = "bf16",
    kernel: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Kernels, comma list (see `memprobe kernels`). [default: every single-device kernel]"),
    ] = None,
    chunk_size: Annotated[str, typer.Option(help="Chunk sizes for chunked kernels, comma list.")] = "1024",
    tp: Annotated[str, typer.Option(help="Tensor-parallel sizes (vocabulary shards), comma list.")] = "1",
    cp: Annotated[str, typer.Option(help="Context-parallel sizes (token shards), comma list.")] = "1",
    device: Annotated[
        str, typer.Option(help="auto (cuda when available, else meta), meta (exact simulation), cpu, cuda.")
    ] = "auto",
    grid: Annotated[bool, typer.Option("--grid", help="Run the full tokens x vocab product, not the cross.")] = False,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Run directory to create. [default: reports/<run-id>/]"),
    ] = None,
    resume: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Finish an interrupted run: runs only its missing cases."),
    ] = None,
    verify: Annotated[bool, typer.Option(help="Check each kernel x dtype against float64 at a small CPU shape.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress, no table: just the run directory.")] = False,
) -> None:
    """Peak memory of each kernel across sequence lengths and vocabularies.

    Simulated exactly with meta tensors where there is no GPU, measured on one
    where there is. Writes results.csv, results.json, run.json and a report
    into the run directory.
    """
    from memprobe.cli_parse import int_list, name_list, positive_ints
    from memprobe.summary import json_summary, table_lines
    from memprobe.sweep import plan_cases, run_sweep

    command = "memprobe " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if resume is not None:
        if tokens is not None or vocab is not None or kernel is not None or out is not None:
            fail("--resume takes its cases from the run directory; drop --tokens/--vocab/--kernel/--out")
        cases, run_dir = [], resume
    else:
        cases = plan_cases(
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
        )
        run_dir = out
    show = not quiet and not as_json

    def progress(i: int, n: int, case: object, run: object) -> None:
        if show:
            c, r = case, run
            peak = format_bytes(r.peak_bytes) if r.peak_bytes is not None else r.status  # type: ignore[attr-defined]
            typer.echo(
                f"[{i}/{n}] {c.kernel} tokens={c.tokens} vocab={c.vocab} {c.dtype}: {peak}",  # type: ignore[attr-defined]
                err=True,
            )

    from memprobe.sweep import default_run_dir

    run_dir = run_dir if run_dir is not None else default_run_dir()
    try:
        frame = run_sweep(
            cases, run_dir, verify=verify, progress=progress, command=command, resume=resume is not None
        )
    except KeyboardInterrupt:
        typer.echo(f"interrupted: finished cases are in {run_dir}; continue with --resume {run_dir}", err=True)
        raise typer.Exit(130) from None
    if as_json:
        typer.echo(json.dumps(json_summary(frame, str(run_dir)), indent=1))
        return
    if not quiet:
        for line in table_lines(frame):
            typer.echo(line)
    typer.echo(f"run directory: {run_dir}")


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
