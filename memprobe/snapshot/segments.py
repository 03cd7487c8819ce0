"""A segment's bytes, read one way by every figure memprobe prints.

torch lists a segment's blocks so that they partition it: inactive blocks cover its free
space. Other tools (and hand-written files) may list only the live blocks, leave gaps
between them, or give a ``total_size`` larger than the blocks. memprobe reads such a
segment as torch would have listed it: it reserves its ``total_size`` bytes, and bytes
that no block covers are free space of that segment, as if an inactive block were there.
Free neighbours coalesce in the allocator, so a free run is every byte between two live
blocks (or a live block and the segment's ends), whatever the file lists there.

The trace's ``segment_alloc`` of a segment still held at snapshot time reserved that
segment: its bytes are the segment's ``total_size``, the figure the segments report.
Attribution's reserved bytes over the trace and the allocator replay's recorded ones both
add the trace's segment events, so a file whose ``segment_alloc`` says fewer bytes than
the segment read 4 MiB reserved in one and "2 MiB recorded" in the other.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

from memprobe.allocator.snapshot_format import (
    LIVE_STATES,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
)
from memprobe.io.text import quoted

# The pools torch writes a segment as of: small (requests up to 1 MiB) and large.
SEGMENT_TYPES = ("small", "large")
# torch's small pool allocates 2 MiB segments; larger ones are the large pool's.
_SMALL_SEGMENT = 2 << 20


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


def reconcile_segment_allocs(segments: list[dict[str, Any]], traces: list[list[dict]]) -> None:
    """Give each trace's ``segment_alloc`` of a segment still held at its end that
    segment's ``total_size`` (in place; an entry is copied before it changes, so a shared
    one stays as the file had it). An expandable segment grows by ``segment_map`` and has
    no ``segment_alloc`` to match."""
    for device, trace in enumerate(traces):
        held = {
            s["address"]: s["total_size"]
            for s in segments
            if s["device"] == device and not s["is_expandable"]
        }
        seen: set[int] = set()  # addresses a later segment event names
        for pos in range(len(trace) - 1, -1, -1):
            e = trace[pos]
            action = e["action"]
            if action not in (SEGMENT_ALLOC, SEGMENT_FREE):
                continue
            addr = e["addr"]
            if action == SEGMENT_ALLOC and addr not in seen and addr in held:
                if e["size"] != held[addr]:
                    trace[pos] = {**e, "size": held[addr]}
            seen.add(addr)


def check_segment_kinds(
    segments: list[dict[str, Any]],
    traces: list[list[dict]],
    refuse: Callable[[str, str], Exception],
) -> None:
    """Refuse a trace that makes a segment the other kind than the snapshot lists it.

    torch writes ``segment_alloc`` for a cudaMalloc segment and ``segment_map`` for the
    pages of an expandable one (its range reserved without an entry). A segment listed
    expandable whose range a ``segment_alloc`` still held at the end made (or one listed
    plain that a ``segment_map`` grew after it was made) was counted twice by the
    allocator replay, whose start state reads the kind from the segment and whose events
    add the bytes again: "34.18 GiB recorded" beside attribute's "peak reserved 17.09
    GiB", and ``--what-if`` predicted 44 GiB reserved for a 10 GiB step (not fitting a
    40 GiB --budget). ``refuse(where, problem)`` makes the one-line error."""
    for device, trace in enumerate(traces):
        listed = sorted(
            (s["address"], s["total_size"], i, s["is_expandable"])
            for i, s in enumerate(segments)
            if s["device"] == device
        )
        starts = [a for a, *_ in listed]
        freed: set[int] = set()  # addresses a later segment_free names
        made: set[int] = set()  # plain segments whose segment_alloc comes later
        for pos in range(len(trace) - 1, -1, -1):
            e = trace[pos]
            action = e["action"]
            if action == SEGMENT_FREE:
                freed.add(e["addr"])
                continue
            if action not in (SEGMENT_ALLOC, SEGMENT_MAP):
                continue
            k = bisect.bisect_right(starts, e["addr"]) - 1
            if k < 0 or e["addr"] >= listed[k][0] + listed[k][1]:
                continue  # in no segment listed: made and given back within the trace
            start, _, index, expandable = listed[k]
            entry = f"device_traces[{device}][{pos}]"
            if action == SEGMENT_ALLOC and expandable and e["addr"] not in freed:
                raise refuse(
                    f"segments[{index}]",
                    f"is expandable, but {entry} makes it with segment_alloc, which torch "
                    "writes for cudaMalloc segments only (an expandable one grows by "
                    "segment_map)",
                )
            if action == SEGMENT_ALLOC and e["addr"] == start:
                made.add(start)
            elif action == SEGMENT_MAP and not expandable and start not in made:
                raise refuse(
                    f"segments[{index}]",
                    f"is not expandable, but {entry} maps pages into it with segment_map, "
                    "which torch writes for expandable segments only (a cudaMalloc "
                    "segment is made by segment_alloc)",
                )


def segment_kind(seg: dict[str, Any], size: int, refuse: Callable[[str], Exception]) -> str:
    """The segment's ``segment_type``, its ``segment_pool_id`` checked beside it; a file
    without the type (other tools write none) gets it from the segment's size.

    torch writes "small" or "large" and a pair of pool ids ((0, 0): the default pools).
    Anything else is no segment torch has: a ``segment_pool_id`` of 5 ended ``attribute
    --replay`` in a TypeError traceback, "ab" or a list of three ids read as a private
    pool, and a type "huge" was counted as neither large nor small ("1 segment (0 large,
    0 small)"). ``refuse`` makes the one-line error from what is wrong."""
    pool = seg.get("segment_pool_id")
    ids = pool if isinstance(pool, (tuple, list)) else ()
    if pool is not None and not (len(ids) == 2 and all(type(i) is int for i in ids)):
        raise refuse(f"has segment_pool_id {quoted(pool)}, not a pair of pool ids")
    kind = seg.get("segment_type")
    if not isinstance(kind, str):
        return "small" if size <= _SMALL_SEGMENT else "large"
    if kind not in SEGMENT_TYPES:
        raise refuse(f"has segment_type {quoted(kind)}, which torch never writes")
    return kind
