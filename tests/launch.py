"""How the multi-process tests start torchrun."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

# --standalone: each launch's rendezvous takes a free port, so two tests launching at
# once (pytest -n) never meet on torchrun's default port 29500.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def fork_ranks(fn: Callable[..., None], nprocs: int, args: tuple[Any, ...]) -> None:
    """Run ``fn(rank, *args)`` on ``nprocs`` processes forked from a clean server.

    A spawned rank imports torch, transformers and memprobe again (seconds of CPU each,
    most of a real-rank test's time on two cores); a rank forked from the test process
    would inherit its fake worlds and process-group registry. Forked from a forkserver
    that has imported them once (per pytest worker), a rank starts clean and at once.
    """
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(["torch", "transformers", "memprobe.profile.step"])
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")
