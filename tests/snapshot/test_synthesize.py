"""Synthesized snapshots: torch's format, self-consistent, and readable by torch's own tools."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import pytest
import snapshot_fixtures as fx
import torch.cuda._memory_viz as memory_viz

from memprobe.allocator.model import MIN_BLOCK
from memprobe.records import Event
from memprobe.snapshot import load_snapshot, synthesize_snapshot, write_snapshot
from memprobe.snapshot.labels import parse_label

SNAPSHOTS = {
    "unchunked": fx.unchunked_snapshot,
    "oom": fx.oom_snapshot,
    "real_style": fx.real_style_snapshot,
    "ring_buffer": fx.ring_buffer_snapshot,
    "empty_trace": fx.empty_trace_snapshot,
}


def _identity(text: str) -> str:
    # torch's default flamegraph formatter downloads a Perl script: keep it offline.
    return text


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_torch_memory_viz_reads_it(name: str, tmp_path: Path) -> None:
    snap = SNAPSHOTS[name]()
    # Through a file, as a user would hand it to torch's tools.
    snap = pickle.loads(write_snapshot(snap, tmp_path / "s.pickle").read_bytes())
    summary = memory_viz.segsum(snap)  # asserts the segments' accounting itself
    assert f"segments: {len(snap['segments'])}" in summary
    text = memory_viz.trace(snap)
    if snap["device_traces"][0]:
        assert f"{len(snap['device_traces'][0])} entries" in text
    assert "<html>" in memory_viz.trace_plot(copy.deepcopy(snap))
    assert "<html>" in memory_viz.trace_plot(copy.deepcopy(snap), plot_segments=True)
    assert "<html>" in memory_viz.trace_plot(copy.deepcopy(snap), filter_freed=True)
    assert "<html>" in memory_viz.segment_plot(copy.deepcopy(snap))
    assert isinstance(memory_viz.segments(snap, format_flamegraph=_identity), str)
    assert isinstance(memory_viz.memory(snap, format_flamegraph=_identity), str)


def test_trace_shape_and_labels() -> None:
    snap = fx.unchunked_snapshot()
    trace = snap["device_traces"][0]
    events = fx.unchunked_events()
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert len(allocs) == sum(e.action == "alloc" for e in events)
    assert sum(e["action"] == "free_completed" for e in trace) == sum(
        e.action == "free" for e in events
    )
    for e in trace:
        assert set(e) >= {"action", "addr", "size", "stream", "frames", "time_us", "user_metadata"}
        assert isinstance(e["time_us"], int) and e["stream"] == 0
    times = [e["time_us"] for e in trace]
    assert times == sorted(times)
    # Distinct addresses for blocks live at the same time; a freed block's address is
    # reused, as the caching allocator reuses its cached blocks.
    live: dict[int, int] = {}
    for e in trace:
        if e["action"] == "alloc":
            assert e["addr"] not in live
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            live.pop(e["addr"])
    addrs = [e["addr"] for e in allocs]
    assert len(set(addrs)) < len(addrs) and all(a % 512 == 0 for a in addrs)
    first = parse_label(allocs[1]["user_metadata"])
    assert first == {
        "case": fx.HEADLINE.case_id,
        "phase": "forward",
        "op": "aten._to_copy.default",
        "dtype": "torch.float32",
        "shape": "1x20000x131072",
    }
    assert allocs[1]["frames"][2] == {
        "name": "unchunked_logprobs",
        "filename": fx.KERNEL,
        "line": 24,
    }
    assert snap["allocator_settings"]["expandable_segments"] is False
    assert snap["external_annotations"] == []


def test_segments_describe_what_is_live_at_the_end() -> None:
    snap = fx.unchunked_snapshot()
    # Logits (setup) and the bf16 gradient are never freed in the fixture trace.
    live = sorted(
        b["requested_size"]
        for s in snap["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    )
    assert live == [fx.BF16_BSV, fx.BF16_BSV]
    # Every segment the trace allocated is still cached (nothing called empty_cache),
    # with the freed float32 [B,S,V] blocks as inactive, reusable space.
    made = [e for e in snap["device_traces"][0] if e["action"] == "segment_alloc"]
    assert len(snap["segments"]) == len(made)
    assert sum(s["total_size"] for s in snap["segments"]) == sum(e["size"] for e in made)
    inactive = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "inactive"]
    assert any(b["size"] >= fx.FP32_BSV for b in inactive)
    for seg in snap["segments"]:
        blocks = seg["blocks"]
        assert sum(b["size"] for b in blocks) == seg["total_size"]
        assert blocks[0]["address"] == seg["address"]
        active = [b for b in blocks if b["state"] == "active_allocated"]
        assert seg["allocated_size"] == sum(b["size"] for b in active)
        assert seg["segment_type"] in ("small", "large") and seg["is_expandable"] is False
    assert snap["memprobe"]["clock"] == "simulation"  # meta: the times are not measured


def test_small_tensors_get_small_pool_blocks() -> None:
    ev = Event(
        0, 0.0, "alloc", 9, 1000, (250,), "torch.float32", "aten.empty.memory_format", "forward"
    )
    snap = synthesize_snapshot([ev])
    (seg,) = snap["segments"]
    assert seg["segment_type"] == "small" and seg["total_size"] == 2 << 20
    assert seg["blocks"][0]["size"] == 2 * MIN_BLOCK  # 1000 rounded up to 512s
    assert seg["blocks"][1]["state"] == "inactive"


def test_free_of_an_untracked_storage_and_empty_storages() -> None:
    events = [
        Event(0, 0.0, "free", 77, 4096, (1024,), "torch.float32", "x", "forward"),
        Event(1, 1.0, "alloc", 78, 0, (0,), "torch.float32", "y", "forward"),
        Event(2, 2.0, "free", 78, 0, (0,), "torch.float32", "y", "forward"),
    ]
    trace = synthesize_snapshot(events)["device_traces"][0]
    # As in a ring-buffer-truncated CUDA trace: the free of a block made before the
    # window, its segment still cached (no segment_free).
    assert [e["action"] for e in trace] == ["free_requested", "free_completed"]


def test_device_index_places_the_trace(tmp_path: Path) -> None:
    snap = synthesize_snapshot(fx.unchunked_events(), device=2)
    assert [len(t) for t in snap["device_traces"][:2]] == [0, 0] and snap["device_traces"][2]
    assert {s["device"] for s in snap["segments"]} == {2}
    loaded = load_snapshot(write_snapshot(snap, tmp_path / "d2.pickle"))
    assert loaded["device_traces"][2] == snap["device_traces"][2]


def test_rejects_unknown_actions() -> None:
    bad: Any = Event(0, 0.0, "resize", 1, 8, (2,), "torch.float32", "x", "forward")
    with pytest.raises(ValueError, match="resize"):
        synthesize_snapshot([bad])
