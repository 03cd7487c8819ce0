"""The modelled reserved peak (the bare allocator model the sweep and planner use) equals
what the full simulation for a snapshot reaches on the same events."""

from __future__ import annotations

import pytest

from memprobe.allocator import parse_alloc_conf, simulate
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.measure.reserved import modelled_reserved_peak
from memprobe.records import Case
from memprobe.snapshot.synthesize import allocator_requests


@pytest.mark.parametrize(
    "conf",
    [None, "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4"],
)
@pytest.mark.parametrize("kernel", ["unchunked", "local_chunked"])
def test_bare_replay_equals_the_full_simulation(kernel: str, conf: str | None) -> None:
    case = Case(kernel=kernel, batch=1, tokens=2000, vocab=8000, chunk_size=256, device="meta")
    events = simulate_tracker(case, capture_frames=False).events
    requests, _ = allocator_requests(events)
    settings = parse_alloc_conf(conf) if conf else None
    full = simulate(((e.action, e.storage, e.nbytes) for e in requests), settings)
    assert modelled_reserved_peak(events, conf) == full.reserved_peak_bytes > 0
    assert modelled_reserved_peak(events, settings) == full.reserved_peak_bytes
