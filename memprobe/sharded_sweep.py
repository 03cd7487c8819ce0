"""``memprobe sweep --shard`` under torchrun: the cases shared out across ranks, one run directory.

Each rank takes cases one at a time from the job's store and measures each alone,
on its own device, exactly as a one-process sweep would; rank 0 measures too, and
writes every rank's rows and snapshots into the one run directory, in the plan's
order, after every case (:mod:`memprobe.measure.sharding` says how the ranks talk).
So the run directory is the one-process sweep's, whatever the world size, and
``--resume`` continues it at any world size, with or without ``--shard``.

A case that needs several ranks itself (``--tp``/``--cp`` above 1 on a real device)
is refused here: run those in a torchrun job of their own without ``--shard``.
Simulated ones (``--device meta``) need one process each, and are shared out.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from memprobe import results
from memprobe.allocator import AllocConf, parse_alloc_conf
from memprobe.errors import UserError
from memprobe.measure.parallel import local_device_index, under_torchrun
from memprobe.measure.sharding import Plan, ShardJob, join_shards, poll_delays, wait
from memprobe.records import Case, Run
from memprobe.sweep import (
    OnCase,
    SweepOutcome,
    SweepRequest,
    measure_one,
    open_run,
    plan_cases,
    snapshot_of,
    with_reserved,
    with_snapshot_written,
)

# How long rank 0, failing, waits for the other ranks to read its verdict and let go
# of the store it may host, before it exits anyway.
_LEAVE_GRACE_S = 10.0


def run_sharded_job(request: SweepRequest, progress: OnCase | None = None) -> SweepOutcome:
    """Join the torchrun job's store, agree on the plan, and run this rank's share."""
    if not under_torchrun():
        raise UserError(
            "--shard shares the cases out across torchrun ranks, and this is one process",
            "launch it with torchrun --nproc-per-node N -m memprobe sweep ... --shard, "
            "or drop --shard",
        )
    job = join_shards()
    run_dir = request.resume or request.out or results.default_run_dir()
    if job.lead:
        return _lead(job, request, run_dir, progress)
    try:
        plan = job.receive_plan()
        conf = _apply_conf(plan.alloc_conf, plan.cases)
        for index in job.claims(len(plan.cases)):
            run, snapshot = _measure(plan.cases[index], request, conf)
            job.deliver(index, run, snapshot)
    finally:
        job.leave()
    return SweepOutcome(results.frame_of([]), run_dir, lead=False)


def _lead(
    job: ShardJob, request: SweepRequest, run_dir: Path, progress: OnCase | None
) -> SweepOutcome:
    resume = request.resume is not None
    try:
        conf = _requested_conf(request)
        cases = [] if resume else plan_cases(request.grid)
        _check_one_rank_each(cases)
        planned, rows, todo = open_run(cases, run_dir, request.command, resume, conf)
        _check_one_rank_each(todo)
    except UserError as exc:
        job.publish_error(exc)
        _wait_for_others(job, grace_s=_LEAVE_GRACE_S)
        raise
    conf_text = conf.to_string() if conf is not None else None
    job.publish_plan(Plan(todo, conf_text))
    _apply_conf(conf_text, todo)
    writer = _Writer(run_dir, planned, rows, len(todo), progress)
    finished = False
    try:
        for index in job.claims(len(todo)):
            run, snapshot = _measure(todo[index], request, conf)
            writer.add(index, todo[index], run, snapshot)
            _collect(job, todo, writer)
        delays = poll_delays()
        while writer.written < len(todo) and not job.others_left():
            wait(delays)
            _collect(job, todo, writer)
        _collect(job, todo, writer)  # what the last rank delivered just before it left
        finished = True
    finally:
        _wait_for_others(job, grace_s=None if finished else _LEAVE_GRACE_S)
    lost = len(todo) - writer.written
    if lost:
        raise UserError(
            f"{lost} case(s) of {run_dir} were not measured: a rank left without delivering them",
            f"continue with --resume {run_dir}",
        )
    return SweepOutcome(results.frame_of(writer.rows), run_dir, lead=True)


class _Writer:
    """Rank 0's rows: each case's row and snapshot written as it arrives, in plan order."""

    def __init__(
        self,
        run_dir: Path,
        planned: list[Case],
        rows: list[dict[str, Any]],
        todo: int,
        progress: OnCase | None,
    ) -> None:
        self.run_dir = run_dir
        self.planned = planned
        self.positions = results.plan_positions(planned)
        self.rows = rows
        self.todo = todo
        self.progress = progress
        self.written = 0
        self.pending: set[int] = set(range(todo))
        self.delivered = 0  # how many rows the other ranks had delivered at the last look

    def add(self, index: int, case: Case, run: Run, snapshot: dict[str, Any] | None) -> None:
        self.pending.discard(index)
        run = with_snapshot_written(run, snapshot, self.run_dir)
        self.rows = results.in_plan_order([*self.rows, run.row()], self.positions)
        results.write_results(self.run_dir, self.rows)
        self.written += 1
        if self.progress is not None:
            self.progress(self.written, self.todo, case, run)


def _collect(job: ShardJob, todo: list[Case], writer: _Writer) -> None:
    """Write every row the other ranks have delivered since the last look."""
    count = job.delivered()
    if count == writer.delivered:
        return
    writer.delivered = count
    for index in sorted(writer.pending):
        delivered = job.take(index)
        if delivered is not None:
            writer.add(index, todo[index], *delivered)


def _measure(case: Case, request: SweepRequest, conf: AllocConf | None) -> tuple[Run, Any]:
    run = with_reserved(measure_one(case, verify=request.verify, layout=None), conf)
    return run, snapshot_of(run, conf) if request.snapshots else None


def _wait_for_others(job: ShardJob, *, grace_s: float | None) -> None:
    """Rank 0 may host the store: it lets go only when every other rank has."""
    deadline = None if grace_s is None else time.monotonic() + grace_s
    delays = poll_delays()
    while not job.others_left():
        if deadline is not None and time.monotonic() > deadline:
            return
        wait(delays)


def _requested_conf(request: SweepRequest) -> AllocConf | None:
    if request.resume is not None:
        # A resumed run keeps the allocator settings it started with.
        recorded = results.read_run_meta(request.resume).get("alloc_conf")
        return parse_alloc_conf(recorded) if isinstance(recorded, str) else None
    return parse_alloc_conf(request.alloc_conf) if request.alloc_conf is not None else None


def _apply_conf(conf_text: str | None, cases: list[Case]) -> AllocConf | None:
    """This rank's allocator settings and device, set before its first CUDA allocation."""
    if conf_text is not None:
        os.environ["PYTORCH_ALLOC_CONF"] = conf_text
    if any(c.device == "cuda" for c in cases):
        torch.cuda.set_device(local_device_index())  # one device per rank
    return parse_alloc_conf(conf_text) if conf_text is not None else None


def _check_one_rank_each(cases: list[Case]) -> None:
    """A real tensor/context-parallel case needs a group of ranks: not a shard's job."""
    for case in cases:
        if case.device != "meta" and case.tp * case.cp > 1:
            raise UserError(
                f"--shard runs each case on one rank, and a --device {case.device} case with "
                f"--tp {case.tp} --cp {case.cp} needs {case.tp * case.cp}",
                f"run those without --shard (torchrun --nproc-per-node {case.tp * case.cp} "
                "-m memprobe sweep --tp ... --cp ...), or simulate them with --device meta",
            )
