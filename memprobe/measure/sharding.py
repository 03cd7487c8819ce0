"""Case-sharded sweeps under torchrun: each rank measures its share of the cases.

``torchrun --nproc-per-node N -m memprobe sweep ... --shard`` starts N ranks, one
device each. They coordinate through torchrun's key-value store, never through a
job-wide process group: a rank measures a one-rank case exactly as one process
would (a ``--device meta --tp 8`` case still simulates one rank under a fake group),
and no rank waits inside a collective for a rank outside its case.

A case that needs several ranks itself (``--tp``/``--cp`` above 1 on a real device)
runs on a *team*: for a layout of ``tp x cp = n`` ranks the job's ranks ``0..n-1``
are team 0, ``n..2n-1`` team 1, and so on (ranks left over sit that layout out). A
team's ranks meet in the store, then make a world of their own — a default process
group over the team's part of the store (:func:`memprobe.measure.parallel.join_world`)
— and run each case exactly as a torchrun job of ``n`` ranks without ``--shard`` does;
the team's rank 0 hands the merged row on. Outside a team no rank has a process group.

The keys, under one prefix per job attempt:

* ``plan`` — rank 0's verdict on the command line (an error, or the cases still
  to run and the allocator settings), written once; every other rank waits for it.
* ``claimed/<tp>x<cp>`` — a counter per layout (``1x1``: the one-rank cases). A rank,
  or a team's rank 0, takes the next case with ``add(1)``, so a fast rank takes more
  cases than a slow one and unequal cases balance out; ``claim/<i>`` names the ranks
  that took case ``i``.
* ``row/<i>`` — case ``i`` measured by a rank other than 0: its row and its allocator
  snapshot, pickled. Rank 0 takes it, writes it, deletes it.
* ``delivered`` — a counter of those rows, so rank 0 looks for new ones only when
  there are some.
* ``team/<tp>x<cp>/<t>/arrived`` — a counter of team ``t``'s ranks ready to start;
  ``team/<tp>x<cp>/<t>/world/`` — the store of that team's process group.
* ``stop`` — set by rank 0 when it gives up on the job (a rank went silent): every
  rank takes no more cases and leaves.
* ``left`` — a counter of the ranks other than 0 that have delivered everything;
  rank 0 returns only when all of them have (it may host the store).

A rank that fails a case (out of memory, an error) records it as a row like any
other. A rank that dies outright ends the torchrun job (torchrun stops every
rank when one exits with an error). A rank that hangs is found by rank 0: a case
taken more than ``--case-timeout`` seconds ago and not delivered gets an
``unfinished`` row naming its ranks, and the job stops. Either way every row rank 0
wrote is on disk, and ``--resume`` runs the rest at any world size.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch.distributed as dist

from memprobe.errors import UserError
from memprobe.measure.parallel import store_unreachable
from memprobe.records import Case

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
    def claim(self, layout: str, indexes: list[int], ranks: list[int]) -> int | None:
        """The next of ``indexes`` (cases of one layout) for ``ranks`` to run; None when
        all are taken or rank 0 has stopped the job."""
        if self.stopped():
            return None
        taken = int(self.store.add(f"claimed/{layout}", 1)) - 1
        if taken >= len(indexes):
            return None
        self.store.set(f"claim/{indexes[taken]}", json.dumps(ranks))
        return indexes[taken]

    def claimed(self, layout: str) -> int:
        """How many cases of ``layout`` have been taken so far (may exceed how many there are)."""
        return int(self.store.add(f"claimed/{layout}", 0))

    def claimant(self, index: int) -> list[int]:
        """The ranks that took case ``index`` (empty if its claim is not written yet)."""
        key = f"claim/{index}"
        return list(json.loads(self.store.get(key))) if self.store.check([key]) else []

    def deliver(self, index: int, row: dict[str, Any], snapshot: dict[str, Any] | None) -> None:
        """Hand case ``index``'s row and allocator snapshot to rank 0 (the trace stays here:
        the snapshot is the trace in the format rank 0 writes)."""
        self.store.set(f"row/{index}", pickle.dumps((row, snapshot), protocol=4))
        self.store.add("delivered", 1)

    def delivered(self) -> int:
        """How many rows the other ranks have delivered so far."""
        return int(self.store.add("delivered", 0))

    def take(self, index: int) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """On rank 0: case ``index`` as delivered by another rank, once; None until then."""
        key = f"row/{index}"
        if not self.store.check([key]):
            return None
        # The store holds only what this job's own ranks wrote.
        row, snapshot = pickle.loads(self.store.get(key))  # noqa: S301
        self.store.delete_key(key)
        return row, snapshot

    # -- teams ----------------------------------------------------------------
    def arrive(self, layout: str, team: int) -> None:
        self.store.add(f"team/{layout}/{team}/arrived", 1)

    def arrived(self, layout: str, team: int) -> int:
        return int(self.store.add(f"team/{layout}/{team}/arrived", 0))

    def team_store(self, layout: str, team: int) -> Any:
        """The store of team ``team``'s process group for ``layout``."""
        return dist.PrefixStore(f"team/{layout}/{team}/world/", self.store)

    # -- the end --------------------------------------------------------------
    def stop(self) -> None:
        """On rank 0: no rank takes another case."""
        self.store.set("stop", "1")

    def stopped(self) -> bool:
        return bool(self.store.check(["stop"]))

    def leave(self) -> None:
        """On a rank other than 0: nothing more from this rank."""
        self.store.add("left", 1)

    def left(self) -> int:
        """How many ranks other than 0 have left."""
        return int(self.store.add("left", 0))

    def others_left(self) -> bool:
        return self.left() >= self.world_size - 1


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
    try:
        store, rank, world_size = next(dist.rendezvous("env://", timeout=PLAN_TIMEOUT))
    except dist.DistError as exc:
        raise store_unreachable(exc) from None
    # A restarted attempt (torchrun --max-restarts) must not read the last one's keys.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return ShardJob(dist.PrefixStore(f"memprobe/shard/{attempt}/", store), rank, world_size)
