"""The ranks of a torchrun sweep agree on each case: to run it, through it, and on its outcome.

A vocabulary-parallel kernel issues collectives mid-step. When one rank fails inside
the step (an out-of-memory error on its shard), its peers are already waiting in, or
about to enter, a collective that rank will never join: NCCL would hang them until its
watchdog kills the job, gloo until its timeout. So, per case:

1. **before** — every rank says whether it can run the case (no sticky CUDA error);
   if one cannot, none runs it, and every rank records why;
2. **through** — before each collective a rank checks in on the job's key-value store
   (not a collective, so it never blocks on a missing peer) and waits until every rank
   has checked in for that collective, or one has posted a failure; then it raises
   :class:`PeerFailed` instead of entering a collective its peer will not join;
3. **after** — every rank learns every rank's status, so all of them take the same
   path next (numerics check or not) and the merged row names each rank's part.

A failure after a rank has checked in for a collective but before it entered it
(an allocation of the collective itself) is not covered: the collective's own timeout
(``parallel.COLLECTIVE_TIMEOUT``, or the layout's own) ends that wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from memprobe.errors import Unwind
from memprobe.measure.parallel import COLLECTIVE_TIMEOUT, RankLayout
from memprobe.records import Case, Run

# Namespaces of the c10d collective ops, and ops there that are not collectives.
_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional"})
_NOT_COLLECTIVES = frozenset({"wait_tensor", "wait", "barrier", "monitored_barrier"})
_POLL_FIRST_S = 0.0005
_POLL_MAX_S = 0.05

_case_number = 0  # the same on every rank: every rank runs the same cases in order


def new_world() -> None:
    """Count cases afresh: this process has just joined a new world (a ``--shard`` job's
    group for a parallel case), whose ranks may each have run a different number before."""
    global _case_number
    _case_number = 0


class PeerFailed(Unwind):
    """Another rank failed this case; this rank stops it before the next collective.

    A BaseException, like KeyboardInterrupt: it must unwind the whole case through the
    backends' ``except Exception`` handlers (it is not this rank's error), running
    their clean-up on the way.
    """

    def __init__(self, status: str, rank: int, note: str) -> None:
        super().__init__(f"rank {rank}: {note}")
        self.status = status
        self.rank = rank
        self.note = note


class _CheckIn(TorchDispatchMode):
    """Before each collective: check in, and wait for every rank (or a failure)."""

    def __init__(self, store: Any, prefix: str, world: int, timeout_s: float) -> None:
        super().__init__()
        self.store = store
        self.prefix = prefix
        self.world = world
        self.timeout_s = timeout_s
        self.count = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = func.__name__.split(".")[0]
        if func.namespace in _COLLECTIVE_NAMESPACES and name not in _NOT_COLLECTIVES:
            self._wait_for_peers()
        return func(*args, **(kwargs or {}))

    def _wait_for_peers(self) -> None:
        key = f"{self.prefix}/collective{self.count}"
        self.count += 1
        self.store.add(key, 1)
        deadline = time.monotonic() + self.timeout_s
        delay = _POLL_FIRST_S
        while True:
            failure = read_failure(self.store, self.prefix)
            if failure is not None:
                raise PeerFailed(*failure).issued()
            if self.store.add(key, 0) >= self.world:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"waited {self.timeout_s:.0f} s for every rank to reach collective "
                    f"{self.count} of the case"
                )
            time.sleep(delay)
            delay = min(2 * delay, _POLL_MAX_S)


def _failure_key(prefix: str) -> str:
    return f"{prefix}/failed"


def post_failure(store: Any, prefix: str, status: str, rank: int, note: str) -> None:
    if read_failure(store, prefix) is None:  # the first failure is the one to report
        store.set(_failure_key(prefix), f"{status}\n{rank}\n{note}")


def read_failure(store: Any, prefix: str) -> tuple[str, int, str] | None:
    key = _failure_key(prefix)
    if not store.check([key]):
        return None
    status, rank, note = store.get(key).decode().split("\n", 2)
    return status, int(rank), note


def run_agreed(
    case: Case,
    measure: Callable[[Case], Run],
    unfit: Callable[[Case], str | None],
    layout: RankLayout | None,
) -> tuple[Run, bool]:
    """``(run, every rank ok)``: ``measure(case)`` on every rank, agreed as above.

    ``measure`` turns this rank's own failures into a Run; ``unfit`` says why this rank
    cannot run the case at all (or None). Outside torchrun it is ``measure(case)``.
    """
    global _case_number
    if layout is None:
        run = measure(case)
        return run, run.status == "ok"
    _case_number += 1
    prefix = f"memprobe/case{_case_number}"
    reasons = _all_ranks(unfit(case))
    refusals = [(r, why) for r, why in enumerate(reasons) if why]
    if refusals:
        note = "; ".join(f"rank {r}: {why}" for r, why in refusals)
        return Run(case=case, status="error", note=f"not run: {note}"), False
    store = dist.distributed_c10d._get_default_store()
    timeout = layout.timeout or COLLECTIVE_TIMEOUT
    check_in = _CheckIn(store, prefix, layout.world_size, timeout.total_seconds())
    try:
        with check_in:
            run = measure(case)
    except PeerFailed as peer:
        run = Run(
            case=case,
            status=peer.status,
            note=f"stopped: rank {peer.rank} failed the case ({peer.note})",
        )
    else:
        if run.status != "ok":
            post_failure(store, prefix, run.status, layout.rank, run.note)
    statuses = _all_ranks(run.status)
    return run, all(s == "ok" for s in statuses)


def _all_ranks(value: Any) -> list[Any]:
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values
