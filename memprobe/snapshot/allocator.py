"""The CUDA caching allocator's size rules under torch's default settings, for
synthesizing segments and for matching a snapshot's blocks to the requests behind them.

A request of ``n`` bytes becomes a block of ``round_block_size(n)`` bytes carved from
a segment (one ``cudaMalloc``) of ``segment_size(n)`` bytes; a block keeps the whole
segment when the remainder is too small to split off. So a block can be larger than
the tensor that asked for it, and attribution has to allow for that slack.
The rules are :mod:`memprobe.allocator.model`'s (``round_size``, ``allocation_size``)
at the defaults; ``roundup_power2_divisions`` and expandable segments change the sizes.
"""

from __future__ import annotations

from memprobe.allocator.config import AllocConf
from memprobe.allocator.model import SMALL_SIZE, allocation_size, round_size

_DEFAULTS = AllocConf()


def round_block_size(nbytes: int) -> int:
    """Bytes the allocator hands out for a request of ``nbytes``."""
    return round_size(nbytes, _DEFAULTS)


def is_small(nbytes: int) -> bool:
    return round_block_size(nbytes) <= SMALL_SIZE


def segment_size(nbytes: int) -> int:
    """Bytes of the segment ``cudaMalloc``-ed when no cached block fits the request."""
    return allocation_size(round_block_size(nbytes), _DEFAULTS)


def could_hold(block_bytes: int, nbytes: int) -> bool:
    """Whether a block of ``block_bytes`` can be what the allocator gave a request of
    ``nbytes``: the rounded size, or (large pool) up to 1 MiB more, because a cached
    block is split only when the remainder exceeds 1 MiB."""
    rounded = round_block_size(nbytes)
    if block_bytes < rounded:
        return False
    slack = 0 if is_small(nbytes) else SMALL_SIZE
    return block_bytes - rounded <= slack
