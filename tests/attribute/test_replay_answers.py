"""`attribute --replay` always answers: a trace without segment events is held to the
constant reserved figure its segments give (that constancy is the comparison)."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import corpus

from memprobe.allocator import replay_snapshot
from memprobe.allocator.snapshot_format import SEGMENT_GROW, SEGMENT_SHRINK
from memprobe.snapshot.write import write_snapshot

_SEGMENT_EVENTS = SEGMENT_GROW + SEGMENT_SHRINK


@functools.cache
def _two_iterations() -> dict[str, Any]:
    return corpus.BY_NAME["two_iterations"].snapshot()


def steady_window() -> dict[str, Any]:
    """Two training iterations, the trace cut after its last segment event: the second
    iteration runs in the cache the first one grew, so reserved never changes."""
    snap = copy.deepcopy(_two_iterations())
    trace = snap["device_traces"][0]
    last = max(i for i, e in enumerate(trace) if e["action"] in _SEGMENT_EVENTS)
    # Start the window at an allocation, as a ring buffer's would after its drops.
    start = next(i for i in range(last + 1, len(trace)) if trace[i]["action"] == "alloc")
    snap["device_traces"] = [trace[start:]]
    return snap


def test_no_segment_events_compares_with_the_constant_reserved() -> None:
    snap = steady_window()
    assert not any(e["action"] in _SEGMENT_EVENTS for e in snap["device_traces"][0])
    (r,) = replay_snapshot(snap, use_recorded_addresses=True)
    held = sum(s["total_size"] for s in snap["segments"])
    assert r.recorded_from == "constant"
    assert r.recorded_reserved_peak_bytes == held == r.predicted_reserved_peak_bytes
    assert r.requests > 100 and r.timeline_mismatches == 0 and r.error_pct == 0
    assert r.address_mismatches == 0


def test_the_constant_comparison_can_fail() -> None:
    """A request no cached block holds would need a new segment: the model's reserved
    leaves the constant, and the replay says after how many allocations."""
    snap = steady_window()
    trace = snap["device_traces"][0]
    big = 2 * sum(s["total_size"] for s in snap["segments"])
    trace.insert(1, {"action": "alloc", "addr": 1 << 50, "size": big, "stream": 0,
                     "time_us": trace[0]["time_us"], "frames": []})  # fmt: skip
    (r,) = replay_snapshot(snap, use_recorded_addresses=True)
    assert r.recorded_from == "constant"
    assert r.predicted_reserved_peak_bytes > r.recorded_reserved_peak_bytes  # type: ignore[operator]
    assert r.timeline_mismatches and r.first_mismatch_index == 1


def test_cli_says_reserved_held_throughout(run_cli, tmp_path: Path) -> None:
    path = write_snapshot(steady_window(), tmp_path / "steady.pickle")
    code, out, err = run_cli("attribute", str(path), "--replay")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("replay on device 0"))
    assert "held throughout (no segment events: reserved never changed) (+0.00%)" in line
    assert "the model's reserved equal to it after every allocation" in line
    code, out, err = run_cli("attribute", str(path), "--replay", "--json")
    replay = json.loads(out)["replay"]
    assert replay["recorded_from"] == "constant" and replay["timeline_mismatches"] == 0
    assert replay["predicted_reserved_peak_bytes"] == replay["recorded_reserved_peak_bytes"]


def test_an_allocation_away_from_its_address_is_named() -> None:
    snap = steady_window()
    trace = snap["device_traces"][0]
    first = next(i for i, e in enumerate(trace) if e["action"] == "alloc")
    old, new = trace[first]["addr"], 1 << 50  # no segment holds it
    for e in trace[first:]:
        if e.get("addr") == old:
            e["addr"] = new
    (r,) = replay_snapshot(snap, use_recorded_addresses=True)
    assert r.address_mismatches and r.first_address_mismatch is not None
    index, recorded, placed = r.first_address_mismatch
    assert (index, recorded) == (first, new) and placed != new
    note = next(n for n in r.notes if "away from their recorded address" in n)
    assert f"the first at entry #{first}: recorded at {new:#x}, placed at {placed:#x}" in note
