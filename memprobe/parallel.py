"""Process-group helpers for simulating and counting vocabulary/context parallelism.

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

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CollectiveCount", "count_collectives", "fake_process_group", "run_ranks"]


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


# Namespaces of the c10d collective ops (eager and functional).
_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional"})
# Ops in those namespaces that are not collectives themselves.
_NOT_COLLECTIVES = frozenset({"wait_tensor", "wait", "barrier", "monitored_barrier"})


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
        name = func.__name__.split(".")[0]
        if func.namespace in _COLLECTIVE_NAMESPACES and name not in _NOT_COLLECTIVES:
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
) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes.

    Each process joins a fresh default process group of ``backend`` before
    ``fn`` runs and leaves it afterwards. ``fn`` must be importable by name
    (a module-level function), as ``spawn`` requires. An exception in any
    rank is re-raised here and the other ranks are terminated; a run still
    going after ``timeout_s`` seconds is terminated with ``TimeoutError``.
    Collectives inside time out after ``timeout_s`` as well.
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
            start_method="spawn",
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
