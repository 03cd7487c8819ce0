"""Hostile inputs, round 20, files a user hands memprobe: snapshots of one process that
drove several GPUs (a model spread over them with ``device_map="auto"``, pipeline stages
in one process), where the loss is on one device and not on the others. Each table is a
variant of a defect class the pass found: a sane answer whose every number the file
supports, or one line and exit 2 that names what is wrong."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, swept

BASE = 0x7E00_0000_0000
MIB = 1 << 20


@pytest.fixture(scope="module")
def step_snapshot(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An unchunked loss step as memprobe records it (a trace --what-if can cut)."""
    run = swept(
        tmp_path_factory.mktemp("r20") / "run",
        *("--tokens", "64", "--vocab", "512", "--no-ladder", "--kernel", "unchunked"),
        *("--device", "meta", "-q", "--no-verify", "--no-report"),
    )
    row = json.loads((run / "results.json").read_text())["rows"][0]
    snap: dict[str, Any] = pickle.loads((run / row["snapshot"]).read_bytes())
    return snap


def _stage(entries: int) -> list[dict[str, Any]]:
    """A pipeline stage without the loss: ``entries`` rounds of four 1 MiB matmul
    outputs made and freed (more trace entries than the loss stage, on purpose)."""
    frames = [{"filename": "??", "line": 0, "name": "at::_ops::mm::call"}]
    frames.append({"filename": "/home/u/train.py", "line": 10, "name": "stage0"})
    seg = {"action": "segment_alloc", "addr": BASE, "size": 4 * MIB, "stream": 0, "frames": []}
    trace: list[dict[str, Any]] = [seg]
    for _ in range(entries):
        for i in range(4):
            e = {"addr": BASE + i * MIB, "size": MIB, "stream": 0, "frames": frames}
            trace.append({**e, "action": "alloc"})
        for i in range(4):
            e = {"addr": BASE + i * MIB, "size": MIB, "stream": 0, "frames": []}
            trace += [{**e, "action": "free_requested"}, {**e, "action": "free_completed"}]
    return trace


def _segment(device: int) -> dict[str, Any]:
    block = {"address": BASE, "size": 4 * MIB, "requested_size": 0, "state": "inactive"}
    return {
        "device": device, "address": BASE, "total_size": 4 * MIB, "allocated_size": 0,
        "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
        "blocks": [{**block, "frames": []}],
    }  # fmt: skip


def _spread(step: dict[str, Any], tmp_path: Path, loss_on: int, devices: int = 2) -> str:
    """``step``'s trace on device ``loss_on``; a longer loss-free stage on every other."""
    traces: list[list[dict[str, Any]]] = []
    segments: list[dict[str, Any]] = []
    for d in range(devices):
        if d == loss_on:
            traces.append(step["device_traces"][0])
            segments += [{**s, "device": d} for s in step["segments"]]
        else:
            traces.append(_stage(8))
            segments.append(_segment(d))
    path = tmp_path / f"spread-{loss_on}-of-{devices}.pickle"
    path.write_bytes(pickle.dumps({**step, "device_traces": traces, "segments": segments}))
    return str(path)


# -- a snapshot of one process on several GPUs whose loss is not on the device with the
# longest trace: --what-if and plan --other-from read only that device (the one
# `attribute` picks by trace length) and said "no loss over [N, V] logits found in the
# snapshot" of a file whose other device holds one; where they did find it, the what-if
# lines followed every device's findings without naming the device they were about. Now
# the first device whose loss step is found is read, and the what-if names it.

SPREADS = {
    "loss on the last of two": (1, 2),
    "loss on the middle of three": (1, 3),
    "loss on the last of four": (3, 4),
}


@pytest.mark.parametrize(("loss_on", "devices"), SPREADS.values(), ids=SPREADS.keys())
def test_what_if_finds_the_loss_on_whichever_device_holds_it(
    run_cli: Any, step_snapshot: dict[str, Any], tmp_path: Path, loss_on: int, devices: int
) -> None:
    path = _spread(step_snapshot, tmp_path, loss_on, devices)
    code, out, err = run_cli("attribute", path, "--what-if", "local_chunked")
    assert code == 0, err
    assert f"what-if local_chunked on device {loss_on}: the loss step" in out, out
    code, out, err = run_cli("attribute", path, "--what-if", "local_chunked", "--json")
    assert code == 0 and json.loads(out)["what_if"]["device"] == loss_on, (out, err)


@pytest.mark.parametrize(("loss_on", "devices"), SPREADS.values(), ids=SPREADS.keys())
def test_other_from_reads_the_device_that_holds_the_loss(
    run_cli: Any, step_snapshot: dict[str, Any], tmp_path: Path, loss_on: int, devices: int
) -> None:
    path = _spread(step_snapshot, tmp_path, loss_on, devices)
    flags = ("--budget", "1GiB", "--vocab", "512", "--kernel", "local_chunked")
    code, out, err = run_cli("plan", *flags, "--other-from", path, "--reserved")
    assert code == 0, err
    assert "other: 0 B, read from 1 snapshot" in out, out


def test_a_device_asked_for_is_still_the_one_read(
    run_cli: Any, step_snapshot: dict[str, Any], tmp_path: Path
) -> None:
    path = _spread(step_snapshot, tmp_path, 1)
    line = one_line(*run_cli("attribute", path, "--what-if", "local_chunked", "--device", "0"))
    assert "no loss over [N, V] logits found in the snapshot" in line, line


def test_one_device_names_no_device(
    run_cli: Any, step_snapshot: dict[str, Any], tmp_path: Path
) -> None:
    path = _spread(step_snapshot, tmp_path, 0, devices=1)
    code, out, err = run_cli("attribute", path, "--what-if", "local_chunked")
    assert code == 0 and "what-if local_chunked: the loss step" in out, (out, err)


def test_no_device_with_a_loss_is_still_refused(run_cli: Any, tmp_path: Path) -> None:
    traces = [_stage(2), _stage(3)]
    path = tmp_path / "stages.pickle"
    snap = {"segments": [_segment(0), _segment(1)], "device_traces": traces}
    path.write_bytes(pickle.dumps(snap))
    line = one_line(*run_cli("attribute", str(path), "--what-if", "local_chunked"))
    assert "no loss over [N, V] logits found in the snapshot" in line, line


# -- diff of a several-GPU snapshot: each file's lead device (an OOM's, else the largest
# peak) was compared, and the lines said which of its devices nowhere ("A: a.pickle",
# "peak: 64.00 MiB -> 437.50 MiB"). A file with several devices now names the one read.


@pytest.mark.parametrize(("loss_on", "devices"), SPREADS.values(), ids=SPREADS.keys())
def test_diff_names_the_device_of_a_several_gpu_file(
    run_cli: Any, step_snapshot: dict[str, Any], tmp_path: Path, loss_on: int, devices: int
) -> None:
    spread = _spread(step_snapshot, tmp_path, loss_on, devices)
    one = _spread(step_snapshot, tmp_path, 0, devices=1)
    code, out, err = run_cli("diff", one, spread)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"A: {one}", out
    # The lead is the largest peak: a loss-free stage's 4 MiB here, the lowest numbered.
    lead = min(d for d in range(devices) if d != loss_on)
    said = f"B: {spread} (device {lead}, the lead of its {devices} devices with a trace"
    assert lines[1].startswith(said), out
    code, out, err = run_cli("diff", spread, one, "--device", "0")
    assert code == 0 and out.splitlines()[0] == f"A: {spread}", (out, err)
