"""`memprobe attribute --replay`: the allocator model re-runs a snapshot's trace and is
held to what the (here: modelled) allocator recorded, on every device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprobe.snapshot.load import load_snapshot
from memprobe.snapshot.write import write_snapshot


def sweep_snapshot(run_cli, tmp_path: Path, *extra: str, kernel: str = "naive_chunked") -> Path:
    out = tmp_path / ("run" + kernel + "".join(e.replace(":", "") for e in extra))
    code, _, err = run_cli(
        "sweep", "--no-report", "--tokens", "4096", "--vocab", "32768", "--no-ladder", "--kernel",
        kernel, "--device", "meta", "--no-verify", "-q", "--out", str(out), *extra,
    )  # fmt: skip
    assert code == 0, err
    (snap,) = (out / "snapshots").glob("*.pickle")
    return snap


@pytest.mark.parametrize("settings", [(), ("--alloc-conf", "expandable_segments:True")])
def test_replay_reproduces_the_recorded_reserved_peak(run_cli, tmp_path, settings) -> None:
    snap = sweep_snapshot(run_cli, tmp_path, *settings)
    code, out, err = run_cli("attribute", str(snap), "--replay", "--json")
    assert code == 0, err
    replay = json.loads(out)["replay"]
    assert replay["recorded_reserved_peak_bytes"] is not None
    assert replay["predicted_reserved_peak_bytes"] == replay["recorded_reserved_peak_bytes"]
    assert replay["predicted_segments"] == replay["recorded_segments"] > 0
    assert replay["error_pct"] == 0 and replay["address_mismatches"] == 0
    assert set(replay) >= {
        "predicted_reserved_peak_bytes",
        "recorded_reserved_peak_bytes",
        "predicted_segments",
        "recorded_segments",
        "error_pct",
        "alloc_conf",
    }


def test_what_if_expandable_segments(run_cli, tmp_path) -> None:
    snap = sweep_snapshot(run_cli, tmp_path)
    code, out, err = run_cli(
        "attribute", str(snap), "--replay", "--alloc-conf", "expandable_segments:True"
    )
    assert code == 0, err
    lines = out.splitlines()
    replay = next(line for line in lines if line.startswith("replay on device 0"))
    assert "(+0.00%)" in replay and "every allocation at its recorded address" in replay
    what_if = next(line for line in lines if line.startswith("what-if"))
    assert "expandable_segments:True: this job would have reserved" in what_if
    code, out, _ = run_cli(
        "attribute", str(snap), "--replay", "--alloc-conf", "expandable_segments:True", "--json"
    )
    replay = json.loads(out)["replay"]
    # The naive loop fragments the default cache; expandable segments reserve less.
    assert replay["predicted_reserved_peak_bytes"] < replay["recorded_reserved_peak_bytes"]
    assert replay["alloc_conf"] == "expandable_segments:True"


def test_every_device_of_a_multi_device_file_is_replayed(run_cli, tmp_path) -> None:
    one = load_snapshot(sweep_snapshot(run_cli, tmp_path))
    two = load_snapshot(sweep_snapshot(run_cli, tmp_path, kernel="precast_chunked"))
    # Device 1 holds the second run, its segments relabelled.
    merged = {
        "segments": one["segments"] + [{**s, "device": 1} for s in two["segments"]],
        "device_traces": [one["device_traces"][0], two["device_traces"][0]],
        "allocator_settings": {},
    }
    path = write_snapshot(merged, tmp_path / "two.pickle")
    code, out, err = run_cli("attribute", str(path), "--replay", "--json")
    assert code == 0, err
    found = json.loads(out)
    for device in (found, *found["other_devices"]):
        r = device["replay"]
        assert r["predicted_segments"] == r["recorded_segments"]
        assert r["predicted_reserved_peak_bytes"] == r["recorded_reserved_peak_bytes"]
    assert found["replay"] != found["other_devices"][0]["replay"]


def test_alloc_conf_needs_replay(run_cli, tmp_path) -> None:
    snap = sweep_snapshot(run_cli, tmp_path)
    code, _, err = run_cli("attribute", str(snap), "--alloc-conf", "expandable_segments:True")
    assert code == 2 and "--alloc-conf applies to --replay" in err
    code, _, err = run_cli("attribute", str(snap), "--replay", "--alloc-conf", "bogus:1")
    assert code == 2 and "bogus" in err


def test_a_chunked_kernels_own_snapshot_reads_the_whole_sequence(run_cli, tmp_path) -> None:
    """A chunk loop's loss blocks are one chunk each: the run's record and --tokens fix S."""
    snap = sweep_snapshot(run_cli, tmp_path)  # naive_chunked, 4096 tokens, chunk 1024
    code, out, err = run_cli("attribute", str(snap))
    assert code == 0, err
    shapes = next(line for line in out.splitlines() if line.startswith("shapes:"))
    assert "[B=1, S=4,096, V=32,768]" in shapes
    snap_dict = load_snapshot(snap)
    snap_dict.pop("memprobe")  # a stranger's file: the flags fix it
    path = write_snapshot(snap_dict, tmp_path / "bare.pickle")
    code, out, err = run_cli(
        "attribute", str(path), "--vocab", "32768", "--tokens", "4096", "--batch", "1"
    )
    assert code == 0, err
    assert "[B=1, S=4,096, V=32,768]" in out
