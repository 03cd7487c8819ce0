"""`memprobe sweep` as one function: plan (or resume), join ranks, run, report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from memprobe.errors import UserError
from memprobe.measure import resolve_device
from memprobe.ranks import current_layout, start_ranks, stop_ranks, under_torchrun
from memprobe.render import write_report
from memprobe.results import default_run_dir
from memprobe.sweep import Progress, plan_cases, run_sweep


@dataclass(frozen=True)
class SweepRequest:
    tokens: list[int]
    vocab: list[int]
    batch: list[int]
    dtype: list[str]
    kernel: list[str] | None
    chunk_size: list[int | None]
    tp: list[int]
    cp: list[int]
    device: str = "auto"
    grid: bool = False
    out: Path | None = None
    resume: Path | None = None
    verify: bool = True
    budget_bytes: int | None = None  # marked on the report's plots
    command: str = ""


@dataclass(frozen=True)
class SweepOutcome:
    frame: pd.DataFrame
    run_dir: Path
    # False on every torchrun rank but 0: they measure, rank 0 reports.
    lead: bool
    report: Path | None


def run_sweep_job(request: SweepRequest, progress: Progress | None = None) -> SweepOutcome:
    if under_torchrun():
        start_ranks(resolve_device(request.device), request.tp, request.cp)
    try:
        if request.resume is not None:
            cases, run_dir = [], request.resume
        else:
            cases = plan_cases(
                tokens=request.tokens,
                vocab=request.vocab,
                batch=request.batch,
                dtype=request.dtype,
                kernel=request.kernel,
                chunk_size=request.chunk_size,
                tp=request.tp,
                cp=request.cp,
                device=request.device,
                grid=request.grid,
            )
            run_dir = request.out if request.out is not None else default_run_dir()
        layout = current_layout()
        lead = layout is None or layout.rank == 0
        frame = run_sweep(
            cases,
            run_dir,
            verify=request.verify,
            progress=progress if lead else None,
            command=request.command,
            resume=request.resume is not None,
        )
        report = write_report(run_dir, budget_bytes=request.budget_bytes) if lead else None
        return SweepOutcome(frame, run_dir, lead, report)
    finally:
        if under_torchrun():
            stop_ranks()


def check_resume_flags(request_flags: dict[str, object]) -> None:
    """--resume takes its cases from the run directory: shape flags would be ignored."""
    given = [flag for flag, value in request_flags.items() if value is not None]
    if given:
        raise UserError(
            f"--resume takes its cases from the run directory; {', '.join(given)} would be ignored",
            "drop them, or start a new run without --resume",
        )
