"""The CUDA caching allocator's size rules, for synthesizing segments and for matching.

A request of ``n`` bytes becomes a block of ``round_block_size(n)`` bytes carved from
a segment (one ``cudaMalloc``) of ``segment_size(n)`` bytes; a block keeps the whole
segment when the remainder is too small to split off. So a block can be larger than
the tensor that asked for it, and attribution has to allow for that slack.
(Defaults only: ``roundup_power2_divisions`` and expandable segments change the sizes.)
"""

from __future__ import annotations

MIN_BLOCK = 512  # every block is a multiple of this
SMALL_SIZE = 1 << 20  # requests up to 1 MiB come from the small pool
SMALL_BUFFER = 2 << 20  # small-pool segments are 2 MiB
MIN_LARGE_ALLOC = 10 << 20  # requests under 10 MiB get a 20 MiB segment
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20  # larger requests get a segment rounded up to 2 MiB


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def round_block_size(nbytes: int) -> int:
    """Bytes the allocator hands out for a request of ``nbytes``."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else round_up(nbytes, MIN_BLOCK)


def is_small(nbytes: int) -> bool:
    return round_block_size(nbytes) <= SMALL_SIZE


def segment_size(nbytes: int) -> int:
    """Bytes of the segment ``cudaMalloc``-ed when no cached block fits the request."""
    rounded = round_block_size(nbytes)
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return round_up(rounded, ROUND_LARGE)


def could_hold(block_bytes: int, nbytes: int) -> bool:
    """Whether a block of ``block_bytes`` can be what the allocator gave a request of
    ``nbytes``: the rounded size, or (large pool) up to 1 MiB more, because a cached
    block is split only when the remainder exceeds 1 MiB."""
    rounded = round_block_size(nbytes)
    if block_bytes < rounded:
        return False
    slack = 0 if is_small(nbytes) else SMALL_SIZE
    return block_bytes - rounded <= slack
