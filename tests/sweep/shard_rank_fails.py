"""``memprobe sweep --shard`` under torchrun, with rank 1 failing on purpose.

Run by tests/sweep/test_sharded_sweep.py as ``torchrun ... shard_rank_fails.py ARGS`` with
``SHARD_TEST_FAIL`` set to

* ``exit`` — rank 1 measures one case, takes the next one, and dies (``os._exit(1)``)
  before delivering it, as a rank killed mid-case does;
* ``oom`` — rank 1's first case runs out of memory, as a real rank's does when its
  case does not fit;
* ``hang`` — rank 1 measures one case, takes the next one, and hangs in it (sleeps
  until torchrun stops it), as a rank stuck in a kernel does;
* ``hang-team`` — for a grid of two-rank cases: rank 1 hangs in the first one, which
  it runs with rank 0, leaving rank 0 waiting at the case's first collective;
* ``hang-join`` — for a grid of two-rank cases: rank 1 arrives for its team and hangs
  before the team's process group forms, leaving rank 0 waiting in the rendezvous.

Which rank takes which case is a race; so that rank 1 surely takes one, rank 0 holds
its first case until rank 1 has delivered one (but for ``hang-team``). For ``exit``,
rank 1 dies only once rank 0 has written two rows, so what is on disk when torchrun
stops the job is known.
For ``hang``, rank 1's second case is surely one of the four: rank 1 takes it as soon
as it has delivered its first, and rank 0 has taken only one by then.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from memprobe import cli, sharded_sweep, sweep

_jobs: list[Any] = []
_measured = 0


def _until(ready: Any) -> None:
    deadline = time.monotonic() + 120
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError("the other rank never got there")
        time.sleep(0.05)


def _rows_written(out: Path) -> int:
    try:
        return len(json.loads((out / "results.json").read_text())["rows"])
    except (OSError, ValueError):
        return 0


def main() -> None:
    mode = os.environ["SHARD_TEST_FAIL"]
    rank = os.environ["RANK"]
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    real_join, real_measure, real_backend = (
        sharded_sweep.join_shards,
        sharded_sweep._measure,
        sweep.measure,
    )

    def join():  # type: ignore[no-untyped-def]
        _jobs.append(real_join())
        return _jobs[0]

    def measure_case(*args, **kwargs):  # type: ignore[no-untyped-def]
        global _measured
        _measured += 1
        if rank == "1" and mode == "hang-team":
            time.sleep(600)
        if rank == "0" and _measured == 1 and mode != "hang-team":
            _until(lambda: _jobs[0].delivered() >= 1)
        if rank == "1" and mode == "exit" and _measured == 2:
            _until(lambda: _rows_written(out) >= 2)
            os._exit(1)
        if rank == "1" and mode == "hang" and _measured == 2:
            time.sleep(600)
        return real_measure(*args, **kwargs)

    def oom_first(case, **kwargs):  # type: ignore[no-untyped-def]
        if _measured == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_backend(case, **kwargs)

    def join_world_hung(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(600)

    sharded_sweep.join_shards = join  # type: ignore[assignment]
    if mode == "hang-join" and rank == "1":
        sharded_sweep.join_world = join_world_hung  # type: ignore[assignment]
    sharded_sweep._measure = measure_case  # type: ignore[assignment]
    if mode == "oom" and rank == "1":
        sweep.measure = oom_first  # type: ignore[assignment]
    sys.argv = ["memprobe", *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
