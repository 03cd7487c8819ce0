"""The block loops of the tiled kernels, and how a meta simulation shortens them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memprobe.kernels._checks import carries_values


def block_starts(stop: int, step: int, like: torch.Tensor) -> Sequence[int]:
    """``range(0, stop, step)``; for a tensor without values (meta, or the fake tensors
    of the sharded step's simulation), only its first two starts and its last.

    A meta or fake run computes nothing, and every full block after the first allocates
    and frees the same shapes as the second (the kernels write their results
    into tensors made before the loop), so the middle blocks add nothing to the
    peak, to what is live at it, or to the allocator's steady state: leaving
    them out keeps the simulation exact at a cost that does not grow with the
    shape. The last block stays, for its narrower edge.
    """
    starts = range(0, stop, step)
    if carries_values(like) or len(starts) <= 3:
        return starts
    return (starts[0], starts[1], starts[-1])
