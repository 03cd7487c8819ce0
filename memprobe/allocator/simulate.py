"""Run a sequence of allocations and frees through the allocator model in one call.

This is the entry point for memprobe's own traces (the tracker's ``alloc``/``free`` events
keyed by storage): it answers "what would the CUDA caching allocator have reserved?" and
gives the segments and segment events for a synthesized snapshot.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from memprobe.allocator.config import AllocConf
from memprobe.allocator.model import AllocatorStats, CachingAllocatorModel


@dataclass(frozen=True, slots=True)
class Simulation:
    """The outcome of :func:`simulate`.

    ``addresses[i]``: the address event ``i`` got (its block's address for a free too), so a
    synthesized snapshot can place each tensor where the allocator would have.
    ``peak_segments``: the snapshot ``segments`` at the moment reserved bytes peaked (the
    first such moment); ``segments``: at the end. ``trace``: torch-format trace entries
    (``alloc``, ``free_requested``, ``free_completed``, ``segment_*``) in order, with
    ``event_index`` naming the event that caused each.
    """

    stats: AllocatorStats
    reserved_peak_bytes: int
    allocated_peak_bytes: int
    peak_event_index: int | None
    addresses: tuple[int | None, ...]
    peak_segments: tuple[dict[str, Any], ...]
    segments: tuple[dict[str, Any], ...]
    trace: tuple[dict[str, Any], ...]


def simulate(
    events: Iterable[tuple[str, Hashable, int]],
    conf: AllocConf | None = None,
    *,
    stream: int = 0,
    capacity_bytes: int | None = None,
    device: int = 0,
) -> Simulation:
    """Feed ``(action, key, nbytes)`` events (action ``"alloc"`` or ``"free"``; a free names the
    key of an earlier alloc, its nbytes is ignored) to a fresh model.

    Raises ``KeyError`` for a free of an unknown key, :class:`~memprobe.allocator.model.OutOfMemory`
    when ``capacity_bytes`` is exceeded.
    """
    model = CachingAllocatorModel(
        conf, capacity_bytes=capacity_bytes, device=device, record_trace=True
    )
    assert model.trace is not None
    live: dict[Hashable, int] = {}
    addresses: list[int | None] = []
    peak = model.reserved_peak
    peak_index: int | None = None
    peak_segments: list[dict[str, Any]] = model.snapshot_segments()
    for index, (action, key, nbytes) in enumerate(events):
        start = len(model.trace)
        if action == "alloc":
            if key in live:
                raise KeyError(f"key {key!r} allocated twice without a free")
            addr = model.malloc(nbytes, stream)
            live[key] = addr
        elif action == "free":
            addr = live.pop(key)
            model.free(addr)
        else:
            raise ValueError(f"unknown action {action!r}: expected 'alloc' or 'free'")
        addresses.append(addr)
        for entry in model.trace[start:]:
            entry["event_index"] = index
        if model.reserved_peak > peak:
            peak = model.reserved_peak
            peak_index = index
            peak_segments = model.snapshot_segments()
    return Simulation(
        stats=model.stats,
        reserved_peak_bytes=model.reserved_peak,
        allocated_peak_bytes=model.allocated_peak,
        peak_event_index=peak_index,
        addresses=tuple(addresses),
        peak_segments=tuple(peak_segments),
        segments=tuple(model.snapshot_segments()),
        trace=tuple(model.trace),
    )
