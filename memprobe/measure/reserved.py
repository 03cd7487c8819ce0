"""Reserved bytes where no CUDA allocator measured them: memprobe's model of the caching
allocator (:mod:`memprobe.allocator`) replaying a step's tracked allocations.

The one place the sweep and the planner get a modelled reserved peak from.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from memprobe.allocator import AllocConf, CachingAllocatorModel, parse_alloc_conf
from memprobe.records import Event
from memprobe.snapshot.synthesize import allocator_requests


def modelled_reserved_peak(events: Iterable[Event], conf: AllocConf | str | None = None) -> int:
    """The reserved peak the caching allocator would reach for these tracker events,
    under ``conf`` (``PYTORCH_ALLOC_CONF`` text or parsed; the defaults when None).

    The model runs bare: no trace entries, no segment events and no copy of the
    segments at each new peak (what :func:`memprobe.allocator.simulate` keeps for a
    snapshot). The same mallocs and frees, so the same peak; at a whole training
    step's 10^4 events the copies took most of the time."""
    settings = parse_alloc_conf(conf) if isinstance(conf, str) else conf
    requests, _ = allocator_requests(events)
    model = CachingAllocatorModel(settings, keep_segment_events=False)
    live: dict[Hashable, int] = {}
    for event in requests:
        if event.action == "alloc":
            live[event.storage] = model.malloc(event.nbytes, 0)
        else:
            model.free(live.pop(event.storage))
    return model.reserved_peak
