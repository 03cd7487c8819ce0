"""Case-sharded sweeps under torchrun: each rank measures its share of the cases.

``torchrun --nproc-per-node N -m memprobe sweep ... --shard`` starts N ranks, one
device each. They coordinate only through torchrun's key-value store, never
through a process group: a rank measures a case exactly as one process would (a
``--device meta --tp 8`` case still simulates one rank under a fake group), and
no rank ever waits inside a collective for a peer that failed.

The keys, under one prefix per job attempt:

* ``plan`` — rank 0's verdict on the command line (an error, or the cases still
  to run and the allocator settings), written once; every other rank waits for it.
* ``claimed`` — a counter. A rank takes the next case with ``add(1)``, so a fast
  rank takes more cases than a slow one and unequal cases balance out.
* ``row/<i>`` — case ``i`` measured by a rank other than 0: its Run (without the
  trace) and its allocator snapshot, pickled. Rank 0 takes it, writes it, deletes it.
* ``delivered`` — a counter of those rows, so rank 0 looks for new ones only when
  there are some.
* ``left`` — a counter of the ranks other than 0 that have delivered everything;
  rank 0 returns only when all of them have (it may host the store).

A rank that fails a case (out of memory, an error) records it as a row like any
other. A rank that dies outright ends the torchrun job (torchrun stops every
rank when one exits with an error); every row rank 0 wrote is on disk, and
``--resume`` runs the rest at any world size.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch.distributed as dist

from memprobe.errors import UserError
from memprobe.records import Case, Run

# How long a rank waits for rank 0's plan (rank 0 only creates the run directory).
PLAN_TIMEOUT = datetime.timedelta(minutes=5)
_POLL_FIRST_S = 0.001
_POLL_MAX_S = 0.2


@dataclass(frozen=True)
class Plan:
    """What rank 0 tells every rank before the first case."""

    cases: list[Case]
    alloc_conf: str | None


class ShardJob:
    """This rank's handle on the store of a ``--shard`` torchrun job."""

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size

    @property
    def lead(self) -> bool:
        return self.rank == 0

    # -- the plan -------------------------------------------------------------
    def publish_plan(self, plan: Plan) -> None:
        cases = [asdict(c) for c in plan.cases]
        self.store.set("plan", json.dumps({"cases": cases, "alloc_conf": plan.alloc_conf}))

    def publish_error(self, error: UserError) -> None:
        self.store.set("plan", json.dumps({"error": error.one_line()}))

    def receive_plan(self) -> Plan:
        """Rank 0's plan; rank 0's error as this rank's UserError."""
        payload = json.loads(self.store.get("plan"))
        if "error" in payload:
            raise UserError(payload["error"])
        return Plan([Case(**c) for c in payload["cases"]], payload["alloc_conf"])

    # -- the cases --------------------------------------------------------------
    def claims(self, count: int) -> Iterator[int]:
        """Indexes of the cases this rank runs, each taken when the last one is done."""
        while True:
            index = int(self.store.add("claimed", 1)) - 1
            if index >= count:
                return
            yield index

    def deliver(self, index: int, run: Run, snapshot: dict[str, Any] | None) -> None:
        """Hand case ``index`` to rank 0 (the trace stays here: rank 0 needs the row,
        and the snapshot, which is the trace in the format rank 0 writes)."""
        slim = replace(run, events=(), cuda_snapshot=None)
        self.store.set(f"row/{index}", pickle.dumps((slim, snapshot), protocol=4))
        self.store.add("delivered", 1)

    def delivered(self) -> int:
        """How many rows the other ranks have delivered so far."""
        return int(self.store.add("delivered", 0))

    def take(self, index: int) -> tuple[Run, dict[str, Any] | None] | None:
        """On rank 0: case ``index`` as delivered by another rank, once; None until then."""
        key = f"row/{index}"
        if not self.store.check([key]):
            return None
        # The store holds only what this job's own ranks wrote.
        run, snapshot = pickle.loads(self.store.get(key))  # noqa: S301
        self.store.delete_key(key)
        return run, snapshot

    def leave(self) -> None:
        """On a rank other than 0: nothing more from this rank."""
        self.store.add("left", 1)

    def others_left(self) -> bool:
        return int(self.store.add("left", 0)) >= self.world_size - 1


def poll_delays() -> Iterator[float]:
    """Sleeps between two looks at the store: short at first, then up to a fifth of a second."""
    delay = _POLL_FIRST_S
    while True:
        yield delay
        delay = min(2 * delay, _POLL_MAX_S)


def wait(delays: Iterator[float]) -> None:
    time.sleep(next(delays))


def join_shards() -> ShardJob:
    """Connect to the torchrun job's store (no process group is created)."""
    rendezvous = dist.rendezvous("env://", timeout=PLAN_TIMEOUT)
    store, rank, world_size = next(rendezvous)
    # A restarted attempt (torchrun --max-restarts) must not read the last one's keys.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return ShardJob(dist.PrefixStore(f"memprobe/shard/{attempt}/", store), rank, world_size)
