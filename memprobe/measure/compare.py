"""How closely a measured CUDA peak can match the exact simulation, and why.

The caching allocator rounds every block up to a multiple of 512 bytes; the tracker
and the meta simulation count the bytes each storage asks for. So the allocator's
``max_memory_allocated`` over a step exceeds the simulated peak by at most 511 bytes
for every block live at that moment, and never falls below it.
"""

from __future__ import annotations

from collections.abc import Iterable

from memprobe.allocator.model import MIN_BLOCK
from memprobe.records import Event


def max_live_blocks(events: Iterable[Event]) -> int:
    """The most storages live at once in a tracker trace."""
    live = most = 0
    for event in events:
        live += 1 if event.action == "alloc" else -1
        most = max(most, live)
    return most


def rounding_slack(events: Iterable[Event]) -> int:
    """Bytes a real allocator's peak may exceed the simulated one by: (512 − 1) per block
    live at once, at most."""
    return (MIN_BLOCK - 1) * max_live_blocks(events)
