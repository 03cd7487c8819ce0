"""Everything about running as several ranks, simulated or real.

Simulated (one process):

* :func:`fake_process_group` — initialise torch's ``fake`` backend as the
  default process group for one representative rank of a ``world_size``-rank
  job, in this single process. Its collectives return at once and leave the
  tensors as they are (values are meaningless, shapes and allocations are
  exact), and they accept ``meta`` tensors, so the distributed kernels can be
  simulated per rank on meta tensors without any other process.
* :func:`count_collectives` — count the c10d collectives issued inside a
  block, by op, whatever Python API issued them.
* :func:`run_ranks` — run a function on ``world_size`` local processes joined
  in a real (gloo by default) process group, with a deadline, so a failing
  or stuck rank cannot hang the caller.

The kernels (``memprobe.kernels``) never set up process groups themselves.

Real (torchrun, one process per rank, rank 0 writes the run):

``torchrun --nproc-per-node N -m memprobe sweep --tp T --cp C ...`` with
N = T × C. Rank r holds vocabulary shard ``r % T`` and token shard ``r // T``;
the T ranks of one token shard form a tensor-parallel group. Every rank
measures every case; rank 0 gathers the rows and keeps, per case, the
largest rank's figures. Under ``--shard`` a team of ``T x C`` ranks of a larger job
makes such a world of its own for its parallel cases (:func:`join_world`).

Everything that can fail on bad input is decided from the command line alone,
so every rank reaches the same verdict without a collective and none is left
waiting for a peer that exited.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from memprobe.errors import UserError
from memprobe.io.text import exception_text
from memprobe.measure.torchrun_env import check_team, env_count
from memprobe.measure.tracker import collective_name

__all__ = [
    "CollectiveCount",
    "RankLayout",
    "agree",
    "count_collectives",
    "fake_process_group",
    "gather_row",
    "join_world",
    "run_ranks",
    "share_cases",
    "start_ranks",
    "stop_ranks",
]


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[Any]:
    """Run the block as ``rank`` of a ``world_size``-rank job on the fake backend.

    Yields the default group (``torch.distributed.group.WORLD``) and destroys
    it on exit, also on error. Refuses to start while another default process
    group is initialised (it would be replaced, and the caller's group lost).
    """
    if isinstance(world_size, bool) or int(world_size) < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if isinstance(rank, bool) or not 0 <= int(rank) < int(world_size):
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed support")
    if dist.is_initialized():
        raise RuntimeError(
            "a default process group is already initialised; the fake one would replace it"
        )
    try:
        # Importing this module registers the "fake" backend (torch ships it
        # for exactly this kind of single-process estimation).
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as exc:  # pragma: no cover - depends on the torch build
        raise RuntimeError(f"this torch build has no fake process group backend: {exc}") from exc
    dist.init_process_group("fake", store=FakeStore(), rank=int(rank), world_size=int(world_size))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@dataclass
class CollectiveCount:
    """Collectives seen inside :func:`count_collectives`, by op name."""

    by_op: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())


class _CollectiveCounter(TorchDispatchMode):
    def __init__(self, count: CollectiveCount) -> None:
        super().__init__()
        self.count = count

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = collective_name(func)
        if name is not None:
            self.count.by_op[name] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_collectives() -> Iterator[CollectiveCount]:
    """Count collectives dispatched inside the block (forward or backward).

    Works at the dispatcher level, so it sees ``dist.all_reduce`` as well as
    functional collectives, on real, fake and meta tensors. It composes with
    other dispatch modes (an allocation tracker) in either nesting order.
    """
    count = CollectiveCount()
    with _CollectiveCounter(count):
        yield count


def _rank_entry(
    rank: int,
    fn: Callable[..., None],
    world_size: int,
    store_path: str,
    backend: str,
    timeout_s: float,
    args: tuple[Any, ...],
) -> None:
    # A file store needs no free port, so there is no race between picking a
    # port and binding it.
    dist.init_process_group(
        backend,
        init_method=f"file://{store_path}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        fn(rank, world_size, *args)
        # Without this barrier a rank that finishes first tears the group
        # down under a peer still in a collective, and the peer aborts.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(
    fn: Callable[..., None],
    world_size: int,
    args: tuple[Any, ...] = (),
    *,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    start_method: str = "spawn",
) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes.

    Each process joins a fresh default process group of ``backend`` before
    ``fn`` runs and leaves it afterwards. ``fn`` must be importable by name
    (a module-level function), as ``spawn`` requires. An exception in any
    rank is re-raised here and the other ranks are terminated; a run still
    going after ``timeout_s`` seconds is terminated with ``TimeoutError``.
    Collectives inside time out after ``timeout_s`` as well. ``start_method="forkserver"``
    starts the ranks in moments once ``multiprocessing.set_forkserver_preload`` names torch
    (a spawned rank imports it again: seconds each).
    """
    if isinstance(world_size, bool) or int(world_size) < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    with tempfile.TemporaryDirectory(prefix="memprobe-ranks-") as tmp:
        store_path = os.path.join(tmp, "store")
        context = mp.start_processes(
            _rank_entry,
            args=(fn, int(world_size), store_path, backend, float(timeout_s), tuple(args)),
            nprocs=int(world_size),
            join=False,
            start_method=start_method,
        )
        deadline = time.monotonic() + timeout_s
        try:
            # join() raises as soon as one rank fails (and terminates the rest).
            while not context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} ranks still running after {timeout_s:.0f} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                    process.join(5)


# -- real ranks under torchrun ------------------------------------------------


@dataclass(frozen=True)
class RankLayout:
    rank: int
    world_size: int
    tp: int
    cp: int
    tp_group: Any
    # A group of this rank alone: lets one rank run a whole-vocabulary check
    # (the numerics verify step) inside a multi-rank job.
    solo_group: Any = None
    # How long a rank waits for its peers at a collective (None: COLLECTIVE_TIMEOUT).
    timeout: datetime.timedelta | None = None

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def cp_rank(self) -> int:
        return self.rank // self.tp


def start_ranks(device: str, tp: list[int], cp: list[int]) -> RankLayout:
    """Join the torchrun job and build the tensor-parallel groups."""
    check_team(device, tp, cp)
    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(local_device_index())
        try:
            dist.init_process_group(backend, **init_options(device))
        except dist.DistError as exc:
            raise store_unreachable(exc) from None
    return _layout(tp[0], cp[0])


def store_unreachable(exc: BaseException) -> UserError:
    """torchrun's store at MASTER_ADDR:MASTER_PORT could not be reached (no rank 0 there, a
    port taken): one line, not torch's traceback after the wait."""
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    rank = f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}"
    return UserError(
        f"{rank} cannot reach torchrun's store at {where} ({exception_text(exc)})",
        "start every rank with torchrun, or unset WORLD_SIZE and RANK to run in one process",
    )


def join_world(
    store: Any, rank: int, tp: int, cp: int, device: str, timeout: datetime.timedelta
) -> RankLayout:
    """Make ``tp x cp`` ranks that share ``store`` a world of their own, as a torchrun job of
    that size would be (this process's default group, rank ``rank``): how a ``--shard`` job
    runs a parallel case on a few of its ranks. Leave it with :func:`stop_ranks`."""
    backend = "nccl" if device == "cuda" else "gloo"
    options = {**init_options(device), "timeout": timeout}
    dist.init_process_group(backend, store=store, rank=rank, world_size=tp * cp, **options)
    return _layout(tp, cp, timeout)


def _layout(tp: int, cp: int, timeout: datetime.timedelta | None = None) -> RankLayout:
    """This rank's place in the default group's world of ``tp x cp`` ranks, its groups made."""
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group(list(range(c * tp, (c + 1) * tp))) for c in range(cp)]
    # new_group is collective: every rank makes every singleton, keeps its own.
    solos = [dist.new_group([r]) for r in range(world)]
    # Handed to the sweep and down to each measurement: no module keeps it.
    return RankLayout(rank, world, tp, cp, groups[rank // tp], solos[rank], timeout)


# How long a collective may wait for its peers before it fails (torch's default is
# 10 min for NCCL, 30 min for gloo): a stuck case ends the job in bounded time.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)


def local_device_index() -> int:
    """This rank's GPU: LOCAL_RANK, wrapped by the devices this node has."""
    local = env_count("LOCAL_RANK", least=0) if "LOCAL_RANK" in os.environ else 0
    return local % max(1, torch.cuda.device_count())


def init_options(device: str) -> dict[str, Any]:
    """Keywords for ``init_process_group``: a timeout, and on cuda the rank's device, so
    NCCL binds its communicator to it at once instead of guessing at the first collective."""
    options: dict[str, Any] = {"timeout": COLLECTIVE_TIMEOUT}
    if device == "cuda":
        options["device_id"] = torch.device("cuda", local_device_index())
    return options


def stop_ranks() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def agree(error: str | None) -> str | None:
    """Share rank 0's verdict (an error message or None) with every rank."""
    box = [error]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def share_cases(cases: list[Any]) -> list[Any]:
    """Rank 0's list of cases, on every rank."""
    box = [cases]
    dist.broadcast_object_list(box, src=0)
    return box[0]


_MAX_FIELDS = (
    "peak_bytes",
    "forward_peak_bytes",
    "backward_peak_bytes",
    "reserved_peak_bytes",
    "fwd_time_s",
    "bwd_time_s",
    "max_abs_err_fwd",
    "max_abs_err_bwd",
    "big_fp32_blocks",
)
_STATUS_ORDER = ("error", "oom", "skipped", "ok")


def gather_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """On rank 0: one row for the case, each figure the largest rank's; None elsewhere."""
    rows: list[dict[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    if dist.get_rank() != 0:
        return None
    return merge_rows([r for r in rows if r is not None])


def merge_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    merged = dict(rows[0])
    for key in _MAX_FIELDS:
        values = [r[key] for r in rows if r.get(key) is not None]
        merged[key] = max(values) if values else None
    merged["status"] = min((r["status"] for r in rows), key=_STATUS_ORDER.index)
    notes = dict.fromkeys(
        f"rank {i}: {r['note']}" if r["status"] != "ok" else r["note"]
        for i, r in enumerate(rows)
        if r.get("note")
    )
    merged["note"] = "; ".join(notes)
    return merged
