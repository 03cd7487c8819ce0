"""Reserved bytes where no CUDA allocator measured them: memprobe's model of the caching
allocator (:mod:`memprobe.allocator`) replaying a step's tracked allocations.

The one place the sweep and the planner get a modelled reserved peak from.
"""

from __future__ import annotations

from collections.abc import Iterable

from memprobe.allocator import AllocConf, parse_alloc_conf, simulate
from memprobe.records import Event
from memprobe.snapshot.synthesize import allocator_requests


def modelled_reserved_peak(events: Iterable[Event], conf: AllocConf | str | None = None) -> int:
    """The reserved peak the caching allocator would reach for these tracker events,
    under ``conf`` (``PYTORCH_ALLOC_CONF`` text or parsed; the defaults when None)."""
    settings = parse_alloc_conf(conf) if isinstance(conf, str) else conf
    requests, _ = allocator_requests(events)
    sim = simulate(((e.action, e.storage, e.nbytes) for e in requests), settings)
    return sim.reserved_peak_bytes
