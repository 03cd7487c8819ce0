"""``memprobe sweep`` under torchrun, with rank 1 out of memory mid-forward in the first case.

Run by tests/measure/test_rank_agreement.py as ``torchrun ... oom_on_rank_one.py ARGS``:
rank 1's first all_reduce raises the allocator's OutOfMemoryError instead of joining
the collective, as a real rank does when its shard's next buffer does not fit.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from memprobe import cli

_real_all_reduce = dist.all_reduce
_failed = False


def all_reduce_failing_once_on_rank_one(*args, **kwargs):  # type: ignore[no-untyped-def]
    global _failed
    if dist.get_rank() == 1 and not _failed:
        _failed = True
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
    return _real_all_reduce(*args, **kwargs)


if __name__ == "__main__":
    dist.all_reduce = all_reduce_failing_once_on_rank_one
    sys.argv = ["memprobe", *sys.argv[1:]]
    cli.main()
