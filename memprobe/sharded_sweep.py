"""``memprobe sweep --shard`` under torchrun: the cases shared out across ranks, one run directory.

Each rank takes cases one at a time from the job's store and measures each alone,
on its own device, exactly as a one-process sweep would; rank 0 measures too, and
writes every rank's rows and snapshots into the one run directory, in the plan's
order, after every case (:mod:`memprobe.measure.sharding` says how the ranks talk).
So the run directory is the one-process sweep's, whatever the world size, and
``--resume`` continues it at any world size, with or without ``--shard``.

A case that needs several ranks itself (``--tp``/``--cp`` above 1 on a real device)
runs on a team of that many ranks, which make a process group of their own for it
and measure it as a torchrun job of that size without ``--shard`` would (same row,
the ranks' figures merged the same way). The one-rank cases go first, then each
layout's cases, smallest first. A case that needs more ranks than the job has is a
``skipped`` row that says so. Simulated cases (``--device meta``) need one process
each, whatever their tp and cp.

A rank that takes a case and sends nothing back within ``--case-timeout`` seconds
(it hangs) gets its case recorded as an ``unfinished`` error row naming it; rank 0
then stops the job and exits non-zero, and ``--resume`` runs that case again.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from memprobe import results
from memprobe.allocator import (
    AllocConf,
    alloc_conf_to_model,
    parse_alloc_conf,
    set_process_alloc_conf,
)
from memprobe.errors import UserError
from memprobe.io.text import exception_text, shell_word
from memprobe.measure.parallel import (
    gather_row,
    join_world,
    local_device_index,
    stop_ranks,
)
from memprobe.measure.rank_agreement import new_world
from memprobe.measure.sharding import Plan, ShardJob, join_shards, poll_delays, wait
from memprobe.measure.torchrun_env import under_torchrun
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
)

# How long rank 0, failing, waits for the other ranks to read its verdict and let go
# of the store it may host, before it exits anyway.
_LEAVE_GRACE_S = 10.0

# (case index, its row, its allocator snapshot): a finished case handed on.
Deliver = Callable[[int, dict[str, Any], dict[str, Any] | None], None]


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
        _run_share(job, plan.cases, request, conf, job.deliver, lambda: None)
    finally:
        job.leave()
    return SweepOutcome(results.frame_of([]), run_dir, lead=False)


# -- who runs what ------------------------------------------------------------
def ranks_needed(case: Case) -> tuple[int, int]:
    """(tp, cp) of the ranks a case runs on: (1, 1) unless it is a real parallel case."""
    return (case.tp, case.cp) if case.device != "meta" else (1, 1)


def shares(cases: list[Case], world_size: int) -> tuple[dict[str, list[int]], list[int]]:
    """The case indexes per layout ``"<tp>x<cp>"``, one-rank cases first, then by size; and
    the indexes of cases that need more ranks than ``world_size``."""
    by_layout: dict[tuple[int, int, int], list[int]] = {}
    too_big = []
    for index, case in enumerate(cases):
        tp, cp = ranks_needed(case)
        if tp * cp > world_size:
            too_big.append(index)
        else:
            by_layout.setdefault((tp * cp, tp, cp), []).append(index)
    layouts = {f"{tp}x{cp}": by_layout[(n, tp, cp)] for n, tp, cp in sorted(by_layout)}
    return layouts, too_big


def _run_share(
    job: ShardJob,
    cases: list[Case],
    request: SweepRequest,
    conf: AllocConf | None,
    deliver: Deliver,
    tick: Callable[[], None],
) -> None:
    """This rank's part: one-rank cases while there are any, then each layout's cases
    with its team (``tick`` runs while this rank waits for its team)."""
    layouts, _ = shares(cases, job.world_size)
    for key, indexes in layouts.items():
        tp, cp = (int(n) for n in key.split("x"))
        if tp * cp == 1:
            while (index := job.claim(key, indexes, [job.rank])) is not None:
                run = _measure(cases[index], request, conf, layout=None)
                snapshot = snapshot_of(run, conf) if request.snapshots else None
                deliver(index, run.row(), snapshot)
        elif job.rank < job.world_size // (tp * cp) * (tp * cp):
            _run_team(job, (tp, cp), indexes, cases, request, conf, deliver, tick)


def _run_team(
    job: ShardJob,
    layout: tuple[int, int],
    indexes: list[int],
    cases: list[Case],
    request: SweepRequest,
    conf: AllocConf | None,
    deliver: Deliver,
    tick: Callable[[], None],
) -> None:
    """With the other ranks of this rank's team: one process group, the layout's cases
    taken one at a time by the team's rank 0, each run as a torchrun job of ``tp x cp``."""
    tp, cp = layout
    key, size = f"{tp}x{cp}", tp * cp
    team, member = divmod(job.rank, size)
    ranks = list(range(team * size, (team + 1) * size))
    job.arrive(key, team)
    delays = poll_delays()
    while job.arrived(key, team) < size:
        if job.stopped():
            return
        tick()
        wait(delays)
    # Longer than rank 0's wait for a silent rank, so that rank 0 reports it first.
    timeout = datetime.timedelta(seconds=2 * request.case_timeout_s)
    device = cases[indexes[0]].device
    index: int | None = None
    try:
        rank_layout = join_world(job.team_store(key, team), member, tp, cp, device, timeout)
    except RuntimeError as exc:  # a rank arrived, then hung before its group formed
        if not job.lead:
            raise
        raise _TeamLost(None, [r for r in ranks if r != job.rank], _one_line(exc)) from None
    new_world()
    try:
        while True:
            index = _team_index(job.claim(key, indexes, ranks) if member == 0 else None)
            if index is None:
                return
            run = _measure(cases[index], request, conf, layout=rank_layout)
            snapshot = snapshot_of(run, conf) if request.snapshots and member == 0 else None
            row = gather_row(run.row())  # the team's rank 0 gets the merged row
            if row is not None:
                deliver(index, row, snapshot)
    except RuntimeError as exc:  # a collective of the team failed or timed out
        if not job.lead or index is None:
            raise
        raise _TeamLost(index, [r for r in ranks if r != job.rank], _one_line(exc)) from None
    finally:
        stop_ranks()


def _team_index(index: int | None) -> int | None:
    """The team's rank 0's case, on every rank of the team."""
    box = [index]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _one_line(exc: BaseException) -> str:
    return exception_text(exc, name=False)


class _TeamLost(Exception):
    """On rank 0: a peer of its team stopped answering during case ``index`` (None: while
    the team was forming its process group, before any case)."""

    def __init__(self, index: int | None, ranks: list[int], detail: str) -> None:
        super().__init__(detail)
        self.index = index
        self.ranks = ranks


# -- rank 0 -------------------------------------------------------------------
def _lead(
    job: ShardJob, request: SweepRequest, run_dir: Path, progress: OnCase | None
) -> SweepOutcome:
    resume = request.resume is not None
    try:
        conf = _requested_conf(request)
        cases = [] if resume else plan_cases(request.grid)
        planned, rows, todo = open_run(
            cases, run_dir, request.command, resume, conf, request.budget
        )
    except UserError as exc:
        job.publish_error(exc)
        _wait_for_others(job, grace_s=_LEAVE_GRACE_S)
        raise
    conf_text = conf.to_string() if conf is not None else None
    job.publish_plan(Plan(todo, conf_text))
    _apply_conf(conf_text, todo)
    writer = _Writer(run_dir, planned, rows, todo, progress)
    layouts, too_big = shares(todo, job.world_size)
    for index in too_big:
        writer.add(index, _too_big(todo[index], job.world_size), None)
    watch = _Watch(job, writer, layouts, request.case_timeout_s)
    finished = False
    try:
        try:
            _run_share(job, todo, request, conf, watch.deliver, watch.tick)
        except _TeamLost as team:
            what = "the case's collectives" if team.index is not None else "its team's forming"
            taken = [team.index] if team.index is not None else []
            watch.give_up(taken, team.ranks, f"stopped answering {what} ({team})")
        delays = poll_delays()
        while writer.written < len(todo) and not job.others_left() and not job.stopped():
            wait(delays)
            watch.tick()
        watch.collect()  # what the last rank delivered just before it left
        finished = not job.stopped()
    finally:
        if finished:
            _wait_for_others(job, grace_s=None)
        else:  # the ranks still answering finish their case (within the timeout) and leave
            grace = max(_LEAVE_GRACE_S, request.case_timeout_s) if watch.silent else _LEAVE_GRACE_S
            _wait_for_others(job, grace_s=grace, silent=len(watch.silent), collect=watch.collect)
    lost = len(todo) - writer.written
    if watch.silent:
        raise UserError(
            f"rank {_names(watch.silent)} of this --shard job went silent (--case-timeout "
            f"{request.case_timeout_s:g} s): {watch.unfinished} case(s) it took are recorded "
            f"as unfinished in {run_dir}"
            + (f"; {lost} other case(s) were not run" if lost else ""),
            f"continue with --resume {shell_word(run_dir)}",
        )
    if lost:
        raise UserError(
            f"{lost} case(s) of {run_dir} were not measured: a rank left without delivering them",
            f"continue with --resume {shell_word(run_dir)}",
        )
    return SweepOutcome(results.frame_of(writer.rows), run_dir, lead=True)


def _names(ranks: set[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _too_big(case: Case, world_size: int) -> dict[str, Any]:
    tp, cp = ranks_needed(case)
    note = (
        f"needs {tp * cp} ranks (--tp {tp} x --cp {cp}) and this --shard job has {world_size}: "
        f"run it with torchrun --nproc-per-node {tp * cp} or more"
    )
    return Run(case, "skipped", note=note).row()


class _Writer:
    """Rank 0's rows: each case's row and snapshot written as it arrives, in plan order."""

    def __init__(
        self,
        run_dir: Path,
        planned: list[Case],
        rows: list[dict[str, Any]],
        todo: list[Case],
        progress: OnCase | None,
    ) -> None:
        self.run_dir = run_dir
        self.positions = results.plan_positions(planned)
        self.rows = rows
        self.todo = todo
        self.progress = progress
        self.written = 0
        self.pending: set[int] = set(range(len(todo)))
        self.delivered = 0  # how many rows the other ranks had delivered at the last look

    def add(self, index: int, row: dict[str, Any], snapshot: dict[str, Any] | None) -> None:
        from memprobe.snapshot import write_snapshot

        self.pending.discard(index)
        case = self.todo[index]
        if snapshot is not None:
            row = {**row, "snapshot": results.snapshot_relpath(case)}
            write_snapshot(snapshot, self.run_dir / row["snapshot"])
        self.rows = results.in_plan_order([*self.rows, row], self.positions)
        results.write_results(self.run_dir, self.rows)
        self.written += 1
        if self.progress is not None:
            run = Run(case, row["status"], peak_bytes=row["peak_bytes"], note=row["note"])
            self.progress(self.written, len(self.todo), case, run)


class _Watch:
    """Rank 0 between two cases: the rows the other ranks delivered, and the cases taken
    longer than the timeout ago that have not come back (their ranks went silent)."""

    def __init__(
        self, job: ShardJob, writer: _Writer, layouts: dict[str, list[int]], timeout_s: float
    ) -> None:
        self.job = job
        self.writer = writer
        self.layouts = layouts
        self.timeout_s = timeout_s
        self.seen = dict.fromkeys(layouts, 0)  # claims of each layout seen so far
        self.taken_at: dict[int, float] = {}  # when rank 0 first saw the case taken
        self.silent: set[int] = set()
        self.unfinished = 0  # cases recorded as unfinished

    def deliver(self, index: int, row: dict[str, Any], snapshot: dict[str, Any] | None) -> None:
        self.writer.add(index, row, snapshot)
        self.tick()

    def collect(self) -> None:
        """Write every row the other ranks have delivered since the last look."""
        count = self.job.delivered()
        if count == self.writer.delivered:
            return
        self.writer.delivered = count
        for index in sorted(self.writer.pending):
            delivered = self.job.take(index)
            if delivered is not None:
                self.writer.add(index, *delivered)

    def tick(self) -> None:
        self.collect()
        if self.job.stopped():
            return
        now = time.monotonic()
        for key, indexes in self.layouts.items():
            count = min(self.job.claimed(key), len(indexes))
            for index in indexes[self.seen[key] : count]:
                self.taken_at[index] = now
            self.seen[key] = count
        late = [
            i
            for i in sorted(self.writer.pending)
            if i in self.taken_at and now - self.taken_at[i] > self.timeout_s
        ]
        for index in late:
            self.give_up([index], self.job.claimant(index))

    def give_up(self, indexes: list[int], ranks: list[int], why: str | None = None) -> None:
        """Record ``indexes`` as unfinished by ``ranks``, and stop the job."""
        who = f"rank {_names(set(ranks))}" if ranks else "a rank"
        why = why or f"sent no result within {self.timeout_s:g} s (--case-timeout)"
        for index in indexes:
            note = f"{results.UNFINISHED}{who} {why}; --resume runs it again"
            self.writer.add(index, Run(self.writer.todo[index], "error", note=note).row(), None)
            self.unfinished += 1
        self.silent |= set(ranks) - {0}
        self.job.stop()


def _measure(case: Case, request: SweepRequest, conf: AllocConf | None, layout: Any) -> Run:
    return with_reserved(measure_one(case, verify=request.verify, layout=layout), conf)


def _wait_for_others(
    job: ShardJob,
    *,
    grace_s: float | None,
    silent: int = 0,
    collect: Callable[[], None] | None = None,
) -> None:
    """Rank 0 may host the store: it lets go only when every other rank (but ``silent``
    of them) has left, or after ``grace_s``; ``collect`` takes their last rows meanwhile."""
    deadline = None if grace_s is None else time.monotonic() + grace_s
    delays = poll_delays()
    while job.left() < job.world_size - 1 - silent:
        if deadline is not None and time.monotonic() > deadline:
            break
        wait(delays)
        if collect is not None:
            collect()
    if collect is not None:
        collect()


def _requested_conf(request: SweepRequest) -> AllocConf | None:
    if request.resume is not None:
        # A resumed run keeps the allocator settings it started with (held to what a
        # sweep runs under, as a one-process resume holds them).
        return results.recorded_alloc_conf(request.resume)
    return alloc_conf_to_model(request.alloc_conf)


def _apply_conf(conf_text: str | None, cases: list[Case]) -> AllocConf | None:
    """This rank's allocator settings and device, set before its first CUDA allocation."""
    if conf_text is not None:
        set_process_alloc_conf(conf_text)
    if any(c.device == "cuda" for c in cases):
        torch.cuda.set_device(local_device_index())  # one device per rank
    return parse_alloc_conf(conf_text) if conf_text is not None else None
