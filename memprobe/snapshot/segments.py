"""A segment's bytes, read one way by every figure memprobe prints.

torch lists a segment's blocks so that they partition it: inactive blocks cover its free
space. Other tools (and hand-written files) may list only the live blocks, leave gaps
between them, or give a ``total_size`` larger than the blocks. memprobe reads such a
segment as torch would have listed it: it reserves its ``total_size`` bytes, and bytes
that no block covers are free space of that segment, as if an inactive block were there.
Free neighbours coalesce in the allocator, so a free run is every byte between two live
blocks (or a live block and the segment's ends), whatever the file lists there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memprobe.allocator.snapshot_format import LIVE_STATES


def reserved_bytes(segments: Iterable[dict[str, Any]]) -> int:
    """Bytes the ``segments`` (normalised) reserve: their ``total_size``, blocks or not."""
    return sum(s["total_size"] for s in segments)


def free_runs(start: int, size: int, live: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(address, bytes) of each free run of the segment at ``start`` of ``size`` bytes:
    the bytes outside the ``live`` (address, bytes) blocks, coalesced. A live block
    reaching outside the segment is clipped (the loader refuses such files)."""
    runs: list[tuple[int, int]] = []
    cursor, end = start, start + size
    for addr, nbytes in sorted(live) + [(end, 0)]:
        if addr > cursor:
            runs.append((cursor, min(addr, end) - cursor))
        cursor = max(cursor, addr + nbytes)
        if cursor >= end:
            break
    return [r for r in runs if r[1] > 0]


def segment_free_runs(segment: dict[str, Any]) -> list[tuple[int, int]]:
    """The free runs of one normalised segment (see :func:`free_runs`)."""
    live = [(b["address"], b["size"]) for b in segment["blocks"] if b["state"] in LIVE_STATES]
    return free_runs(segment["address"], segment["total_size"], live)
