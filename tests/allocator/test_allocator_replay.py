"""Replaying snapshots: a hand-derived trace, and model-made snapshots that must replay exactly."""

from __future__ import annotations

import random

import pytest

from memprobe.allocator.config import parse_alloc_conf
from memprobe.allocator.model import CachingAllocatorModel
from memprobe.allocator.snapshot_replay import conf_from_snapshot, replay_snapshot
from memprobe.snapshot.load import normalize_snapshot

MiB = 1 << 20
S0, S1, S2 = 0x10000000, 0x20000000, 0x30000000


def entry(action: str, addr: int, size: int, stream: int = 0) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": stream, "frames": []}


def block(addr: int, size: int, state: str, requested: int | None = None) -> dict:
    req = size if requested is None else requested
    return {"address": addr, "size": size, "requested_size": req, "state": state, "frames": []}


def segment(addr: int, kind: str, blocks: list[dict], expandable: bool = False) -> dict:
    return {
        "device": 0,
        "address": addr,
        "total_size": sum(b["size"] for b in blocks),
        "stream": 0,
        "segment_type": kind,
        "segment_pool_id": (0, 0),
        "is_expandable": expandable,
        "frames": [],
        "blocks": blocks,
    }


def hand_made() -> dict:
    """A trace whose outcome follows from torch's rules by hand.

    Before the trace: one 20 MiB segment S0 with a 2 MiB block X live at its start.
    1. alloc 3 MiB       -> best fit is S0's free 18 MiB; split: block at S0 + 2 MiB
    2. free X            -> X is free; its neighbour is live, nothing merges
    3. alloc 0.5 MiB     -> small pool, empty: cudaMalloc 2 MiB at S1
    4. alloc 16 MiB      -> free large blocks are 2 and 15 MiB: cudaMalloc 16 MiB at S2
    5. free the 3 MiB    -> merges with X and the 15 MiB tail: S0 is whole again
    6. alloc 18 MiB      -> best fit S0 (20 MiB); 2 MiB remain (> 1 MiB): split
    Reserved: 20 -> 22 -> 38 MiB.
    """
    trace = [
        entry("alloc", S0 + 2 * MiB, 3 * MiB),
        entry("free_requested", S0, 2 * MiB - 100),
        entry("free_completed", S0, 2 * MiB - 100),
        entry("segment_alloc", S1, 2 * MiB),
        entry("alloc", S1, MiB // 2),
        entry("segment_alloc", S2, 16 * MiB),
        entry("alloc", S2, 16 * MiB),
        entry("free_requested", S0 + 2 * MiB, 3 * MiB),
        entry("free_completed", S0 + 2 * MiB, 3 * MiB),
        entry("alloc", S0, 18 * MiB),
    ]
    segments = [
        segment(
            S0,
            "large",
            [block(S0, 18 * MiB, "active_allocated"), block(S0 + 18 * MiB, 2 * MiB, "inactive")],
        ),
        segment(
            S1,
            "small",
            [
                block(S1, MiB // 2, "active_allocated"),
                block(S1 + MiB // 2, 3 * MiB // 2, "inactive"),
            ],
        ),
        segment(S2, "large", [block(S2, 16 * MiB, "active_allocated")]),
    ]
    return normalize_snapshot({"segments": segments, "device_traces": [trace]})


@pytest.mark.parametrize("recorded_addresses", [False, True])
def test_hand_made_trace_replays_exactly(recorded_addresses):
    (r,) = replay_snapshot(hand_made(), use_recorded_addresses=recorded_addresses)
    assert r.predicted_reserved_peak_bytes == r.recorded_reserved_peak_bytes == 38 * MiB
    assert r.predicted_reserved_final_bytes == r.recorded_reserved_final_bytes == 38 * MiB
    assert r.predicted_segments == r.recorded_segments == 3
    assert r.timeline_mismatches == 0
    assert r.error_pct == 0.0
    assert r.requests == 4
    assert r.address_mismatches == (0 if recorded_addresses else None)
    assert r.notes == ()


def test_what_if_expandable_segments():
    snap = hand_made()
    (r,) = replay_snapshot(snap, conf=parse_alloc_conf("expandable_segments:True"))
    assert r.alloc_conf == "expandable_segments:True"
    assert r.recorded_reserved_peak_bytes == 38 * MiB
    # S0 stays a plain segment; the 0.5 MiB maps one 2 MiB page, the 16 MiB one 20 MiB page
    assert r.predicted_reserved_peak_bytes == 20 * MiB + 2 * MiB + 20 * MiB
    assert any("what-if" in n for n in r.notes)


def test_without_segment_events_reserved_held_constant_is_the_comparison():
    snap = hand_made()
    snap["device_traces"][0] = [e for e in snap["device_traces"][0] if e["action"] == "alloc"][:1]
    snap["segments"][0]["blocks"] = [
        block(S0, 2 * MiB, "active_allocated"),
        block(S0 + 2 * MiB, 3 * MiB, "active_allocated"),
        block(S0 + 5 * MiB, 15 * MiB, "inactive"),
    ]
    del snap["segments"][1:]
    (r,) = replay_snapshot(snap)
    assert r.recorded_from == "constant"
    assert r.recorded_reserved_peak_bytes == 20 * MiB == r.predicted_reserved_peak_bytes
    assert r.timeline_mismatches == 0
    # Neither segments nor segment events: nothing was recorded to compare with.
    del snap["segments"][:]
    (r,) = replay_snapshot(snap)
    assert r.recorded_from is None and r.recorded_reserved_peak_bytes is None
    assert r.timeline_mismatches is None


def test_pending_free_stays_live_and_empty_cache_is_inferred():
    trace = [
        entry("alloc", S2, 16 * MiB),
        entry("free_requested", S2, 16 * MiB),  # completes after the snapshot: still pending
        entry("free_requested", S0, 16 * MiB),
        entry("free_completed", S0, 16 * MiB),
        entry("segment_free", S0, 16 * MiB),  # empty_cache(): nothing allocated after it
    ]
    segments = [segment(S2, "large", [block(S2, 16 * MiB, "active_pending_free")])]
    snap = normalize_snapshot({"segments": segments, "device_traces": [trace]})
    (r,) = replay_snapshot(snap)
    # S0 (16 MiB, live before the trace) and S2 exist at the peak; S0 is then given back
    assert r.recorded_reserved_peak_bytes == r.predicted_reserved_peak_bytes == 32 * MiB
    assert r.predicted_reserved_final_bytes == r.recorded_reserved_final_bytes == 16 * MiB
    assert r.predicted_segments == r.recorded_segments == 1
    assert any("empty_cache" in n for n in r.notes)


def test_expandable_trace_places_the_segment_at_its_recorded_address():
    base = 0x40000000
    trace = [
        entry("segment_map", base, 20 * MiB),
        entry("alloc", base, 16 * MiB),
        entry("segment_map", base + 20 * MiB, 20 * MiB),
        entry("alloc", base + 16 * MiB, 16 * MiB),
    ]
    blocks = [
        block(base, 16 * MiB, "active_allocated"),
        block(base + 16 * MiB, 16 * MiB, "active_allocated"),
        block(base + 32 * MiB, 8 * MiB, "inactive"),
    ]
    snap = normalize_snapshot(
        {
            "segments": [segment(base, "large", blocks, expandable=True)],
            "device_traces": [trace],
            "allocator_settings": {"expandable_segments": True},
        }
    )
    assert conf_from_snapshot(snap).expandable_segments
    for recorded in (False, True):
        (r,) = replay_snapshot(snap, use_recorded_addresses=recorded)
        assert r.predicted_reserved_peak_bytes == r.recorded_reserved_peak_bytes == 40 * MiB
        assert r.predicted_segments == r.recorded_segments == 1
        assert r.timeline_mismatches == 0
    assert r.address_mismatches == 0


def model_snapshot(text: str, seed: int, window: int) -> dict:
    """A snapshot the model itself recorded: a mixed random workload with two empty_cache
    calls, whose trace keeps only the last ``window`` entries (a ring buffer)."""
    rng = random.Random(seed)
    m = CachingAllocatorModel(parse_alloc_conf(text), record_trace=True)
    live: list[int] = []
    for i in range(1500):
        if live and rng.random() < 0.45:
            m.free(live.pop(rng.randrange(len(live))))
            continue
        kind = rng.random()
        if kind < 0.4:
            size = rng.randint(1, 4096)
        elif kind < 0.6:
            size = rng.randint(1, MiB)
        elif kind < 0.9:
            size = rng.randint(MiB, 12 * MiB)
        else:
            size = rng.randint(12 * MiB, 300 * MiB)
        live.append(m.malloc(size))
        if i in (700, 1100):
            m.empty_cache()
    assert m.trace is not None
    return {
        "segments": m.snapshot_segments(),
        "device_traces": [m.trace[-window:]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": text},
    }


@pytest.mark.parametrize(
    "text",
    [
        "",
        "expandable_segments:True",
        "max_split_size_mb:64",
        "roundup_power2_divisions:[1:2,64:8,>:1],max_split_size_mb:100",
    ],
)
@pytest.mark.parametrize("recorded_addresses", [False, True])
def test_model_made_snapshots_replay_to_themselves(text, recorded_addresses):
    snap = model_snapshot(text, seed=3, window=1200)
    (r,) = replay_snapshot(snap, use_recorded_addresses=recorded_addresses)
    assert r.predicted_reserved_peak_bytes == r.recorded_reserved_peak_bytes
    assert r.predicted_reserved_final_bytes == r.recorded_reserved_final_bytes
    assert r.predicted_segments == r.recorded_segments
    assert r.timeline_mismatches == 0
    if recorded_addresses:
        assert r.address_mismatches == 0


def test_every_device_of_a_multi_device_file():
    one = hand_made()
    two = model_snapshot("", seed=3, window=800)
    for s in two["segments"]:
        s["device"] = 1
    snap = {
        "segments": one["segments"] + two["segments"],
        "device_traces": [one["device_traces"][0], two["device_traces"][0]],
    }
    results = replay_snapshot(snap)
    assert [r.device for r in results] == [0, 1]
    for r in results:
        assert r.predicted_reserved_peak_bytes == r.recorded_reserved_peak_bytes
        assert r.predicted_segments == r.recorded_segments


def test_empty_cache_then_an_allocation_that_needs_a_new_segment():
    # The trace opens with empty_cache() giving back a cached 20 MiB segment S0, then asks
    # for 16 MiB: S0 would have served it, so this was no OOM retry; it was empty_cache().
    trace = [
        entry("segment_free", S0, 20 * MiB),
        entry("segment_alloc", S2, 16 * MiB),
        entry("alloc", S2, 16 * MiB),
    ]
    segments = [segment(S2, "large", [block(S2, 16 * MiB, "active_allocated")])]
    snap = normalize_snapshot({"segments": segments, "device_traces": [trace]})
    (r,) = replay_snapshot(snap, use_recorded_addresses=True)
    assert r.predicted_reserved_peak_bytes == r.recorded_reserved_peak_bytes == 20 * MiB
    assert r.timeline_mismatches == 0
    assert r.address_mismatches == 0
    assert any("empty_cache" in n for n in r.notes)


def test_oom_retry_frees_the_cache_like_the_trace_shows():
    # S0 (20 MiB, split: a 2 MiB block live) and S1 (30 MiB, free) are cached; a 40 MiB
    # request finds the device full: S1 is freed, then the cudaMalloc succeeds.
    s1 = 0x50000000
    trace = [
        entry("segment_free", s1, 30 * MiB),
        entry("segment_alloc", S2, 40 * MiB),
        entry("alloc", S2, 40 * MiB),
    ]
    segments = [
        segment(
            S0,
            "large",
            [block(S0, 2 * MiB, "active_allocated"), block(S0 + 2 * MiB, 18 * MiB, "inactive")],
        ),
        segment(S2, "large", [block(S2, 40 * MiB, "active_allocated")]),
    ]
    snap = normalize_snapshot({"segments": segments, "device_traces": [trace]})
    (r,) = replay_snapshot(snap, use_recorded_addresses=True)
    assert r.recorded_reserved_peak_bytes == r.predicted_reserved_peak_bytes == 60 * MiB
    assert r.predicted_segments == r.recorded_segments == 2
    assert r.timeline_mismatches == 0
    assert r.address_mismatches == 0
    assert any("found the device full" in n for n in r.notes)
