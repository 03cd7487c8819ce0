"""The caching allocator's side of a snapshot: segments, reserved-but-free bytes, splits,
the largest free block, the settings; and, at an OOM, fragmentation or exhaustion.

Segment figures are what ``segments`` holds when the snapshot was taken (torch records
no segment layout over time). Trace figures (reserved at the peak or an OOM) come from
replaying ``segment_*`` events. Allocated bytes in the trace are the *requested* sizes;
blocks round up to 512 B, so reserved − allocated includes that rounding.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from memprobe.allocator.model import SMALL_SIZE
from memprobe.allocator.snapshot_format import LIVE_STATES, SEGMENT_GROW, SEGMENT_SHRINK
from memprobe.io.sizes import format_bytes
from memprobe.io.text import printable
from memprobe.snapshot.allocator import round_block_size
from memprobe.snapshot.segments import free_runs, reserved_bytes, segment_free_runs

# Settings worth a line of their own (the rest are printed only when not default).
_KEY_SETTINGS = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments", "max_split_size")


@dataclass(frozen=True)
class AllocatorView:
    segments: int
    large_segments: int
    small_segments: int
    expandable_segments: int
    reserved_bytes: int  # at snapshot time
    active_bytes: int  # at snapshot time (block sizes, rounded)
    inactive_split_bytes: int  # free blocks inside segments that also hold live blocks
    largest_free_block: int
    reserved_at_peak_bytes: int | None
    free_in_reserved_at_peak_bytes: int | None  # reserved − allocated at the peak
    settings: tuple[tuple[str, str], ...]


def allocator_view(
    segments: list[dict[str, Any]],
    settings: dict[str, Any],
    *,
    reserved_at_peak: int | None,
    allocated_at_peak: int,
) -> AllocatorView:
    inactive_split = largest_free = active = 0
    for seg in segments:
        live = sum(b["size"] for b in seg["blocks"] if b["state"] in LIVE_STATES)
        active += live
        # Free space is every byte no live block covers, listed as inactive or not at all
        # (memprobe.snapshot.segments): the replay and the OOM verdict read it so too.
        for _, size in segment_free_runs(seg):
            largest_free = max(largest_free, size)
            if live:
                inactive_split += size
    return AllocatorView(
        segments=len(segments),
        large_segments=sum(s.get("segment_type") == "large" for s in segments),
        small_segments=sum(s.get("segment_type") == "small" for s in segments),
        expandable_segments=sum(bool(s.get("is_expandable")) for s in segments),
        reserved_bytes=reserved_bytes(segments),
        active_bytes=active,
        inactive_split_bytes=inactive_split,
        largest_free_block=largest_free,
        reserved_at_peak_bytes=reserved_at_peak,
        free_in_reserved_at_peak_bytes=None
        if reserved_at_peak is None
        else max(0, reserved_at_peak - allocated_at_peak),
        settings=_settings(settings),
    )


def _settings(settings: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    out = []
    for key, value in settings.items():
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if v}  # roundup divisions: 0 is default
            if not value:
                continue
        if key in _KEY_SETTINGS or value not in (None, "", 0, 0.0, False, -1, {}):
            # The file's own text (PYTORCH_ALLOC_CONF as recorded) reaches the terminal:
            # an escape sequence in it is shown, not run.
            out.append((_shown(key), _shown(value)))
    return tuple(out)


def _shown(value: Any) -> str:
    """A settings key or value as printed. str() of an int past Python's 4,300 digits
    raises (alone or inside a divisions table): `attribute` ended in a ValueError
    traceback for such a file; it is said by its size instead."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"(an integer of {value.bit_length():,} bits)"
    try:
        return printable(str(value))
    except ValueError:
        return f"(a {type(value).__name__} holding an integer of over 4,300 digits)"


def segments_at(
    entries: list[dict[str, Any]], pos: int, segments: list[dict[str, Any]]
) -> dict[int, int] | None:
    """The segments (address -> bytes) that existed right after trace entry ``pos``: the
    snapshot's final segments walked back through the segment events after ``pos``.

    An expandable segment is one address range that grows and shrinks at its end by
    ``segment_map``/``segment_unmap``. None when nothing is known: no segments and no
    segment events. Without segment events the final segments held all along (torch
    records every cudaMalloc and cudaFree while it records history).
    """
    if not segments and not any(e["action"] in SEGMENT_GROW + SEGMENT_SHRINK for e in entries):
        return None
    held = {s["address"]: s["total_size"] for s in segments}
    expandable = sorted(s["address"] for s in segments if s.get("is_expandable"))
    for e in reversed(entries[pos + 1 :]):
        action = e["action"]
        if action == "segment_alloc":
            held.pop(e["addr"], None)
        elif action == "segment_free":
            held[e["addr"]] = e["size"]
        elif action in ("segment_map", "segment_unmap"):
            i = bisect.bisect_right(expandable, e["addr"]) - 1
            base = expandable[i] if i >= 0 else e["addr"]
            grow = e["size"] if action == "segment_unmap" else -e["size"]
            held[base] = held.get(base, 0) + grow
            if held[base] <= 0:
                del held[base]
    return held


def largest_free_block_at(held: dict[int, int], live: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """(bytes not in live blocks, the largest gap between them) over the ``held`` segments.

    ``live`` is (address, block bytes) of what was allocated then. A gap between two live
    blocks of one segment is one free block: free neighbours always coalesce.
    """
    starts = sorted(held)
    inside: dict[int, list[tuple[int, int]]] = {a: [] for a in starts}
    for addr, size in live:
        i = bisect.bisect_right(starts, addr) - 1
        if i >= 0 and addr < starts[i] + held[starts[i]]:
            inside[starts[i]].append((addr, size))
    runs = [size for base in starts for _, size in free_runs(base, held[base], inside[base])]
    return sum(runs), max(runs, default=0)


def block_bytes(requested: int, segment_block: dict[str, Any] | None) -> int:
    """A live block's size in its segment: the recorded one, else the 512 B rounding."""
    if segment_block is not None and isinstance(segment_block.get("size"), int):
        return int(segment_block["size"])
    return round_block_size(requested)


@dataclass(frozen=True)
class OomVerdict:
    kind: str  # "fragmentation" | "exhaustion" | "unknown"
    reserved_bytes: int | None
    free_in_reserved_bytes: int | None
    largest_free_block: int | None
    text: str


def oom_verdict(
    requested: int,
    allocated: int,
    reserved: int | None,
    device_free: int | None,
    largest_free_block: int | None,
    expandable: bool,
    *,
    expandable_ignored: bool = False,
) -> OomVerdict:
    """Would the failed request have fit in memory the allocator already held?"""
    if reserved is None:
        return OomVerdict(
            "unknown", None, None, largest_free_block,
            "reserved bytes unknown (no segment events or segments): cannot tell "
            "fragmentation from exhaustion",
        )  # fmt: skip
    free_reserved = max(0, reserved - allocated)
    headroom = free_reserved + (device_free or 0)
    if requested <= free_reserved or requested <= headroom and free_reserved >= requested / 2:
        if expandable:
            hint = "expandable segments are already on: try max_split_size_mb or freeing earlier"
        elif expandable_ignored:
            hint = (
                "expandable segments were asked for but not run (the file records "
                "expandable_segments False: torch ignores them where the platform has none, "
                "e.g. Windows or ROCm): try max_split_size_mb or freeing earlier"
            )
        else:
            hint = "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        text = (
            "fragmentation: the request would have fit in reserved-but-free memory, but no "
            f"single free block was large enough; {hint}"
        )
        if largest_free_block is not None and largest_free_block >= round_block_size(requested):
            # "No single free block was large enough" beside a largest free block that is:
            # a block the allocator could not give this request (the other pool's, another
            # stream's, one max_split_size keeps whole), or a trace that is not the
            # allocator's own; the verdict says which is possible, not what it cannot be.
            text = (
                f"free but not usable: the largest free block ({format_bytes(largest_free_block)})"
                " could hold the request, so it was one the allocator does not give it: in the "
                f"other pool (requests up to {format_bytes(SMALL_SIZE)} and larger ones use "
                "separate segments), on another stream, or kept whole by max_split_size; check "
                "the trace if none applies"
            )
        return OomVerdict("fragmentation", reserved, free_reserved, largest_free_block, text)
    text = (
        "real exhaustion: live tensors plus the request exceed what the device has; "
        "reduce what is live at this moment (see 'live then')"
    )
    return OomVerdict("exhaustion", reserved, free_reserved, largest_free_block, text)
