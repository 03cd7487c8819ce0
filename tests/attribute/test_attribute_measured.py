"""Attribution of memprobe's own runs: the tracker's trace → snapshot file → findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from memprobe.attribute import attribute_file
from memprobe.measure import measure
from memprobe.records import Case
from memprobe.snapshot import synthesize_snapshot, write_snapshot

B, S, V = 1, 20000, 131072
FP32_BSV = 4 * B * S * V  # 10485760000 bytes, 9.77 GiB


@pytest.fixture(scope="module")
def headline(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    case = Case("unchunked", B, S, V, dtype="bf16", device="meta")
    run = measure(case)
    assert run.status == "ok" and run.events
    path = tmp_path_factory.mktemp("snap") / f"{case.case_id}.pickle"
    return run, write_snapshot(synthesize_snapshot(run.events, case=case), path)


def test_unchunked_headline_names_its_float32_bsv_blocks(headline: tuple) -> None:
    run, path = headline
    findings = attribute_file(path)
    assert findings.peak_allocated_bytes == run.peak_bytes  # replay agrees with the tracker
    fp32 = [f for f in findings.findings if f.size == FP32_BSV]
    tracked = [e for e in run.events if e.action == "alloc" and e.nbytes == FP32_BSV]
    assert len(fp32) == len(tracked) >= 4
    for f in fp32:
        assert (f.dtype, f.shape) == ("float32", (B, S, V))
        assert f.explanations[0].describe() == "float32 [1, 20000, 131072]"
        assert f.phase in ("forward", "backward") and f.op and f.op.startswith("aten.")
    forward = [f for f in fp32 if f.phase == "forward"]
    backward = [f for f in fp32 if f.phase == "backward"]
    assert forward and backward
    # Forward blocks point at the kernel's own line, not at torch or the harness.
    for f in forward:
        assert f.frame is not None and f.frame.filename.endswith("kernels/autograd_reference.py")
    # The peak holds the logits plus three float32 [B,S,V] blocks (14·B·S·V bytes).
    live = [f for f in fp32 if f.live_at_peak]
    assert len(live) == 3
    assert sum(f.size for f in findings.findings if f.live_at_peak) == run.peak_bytes


def test_chunked_kernel_has_no_float32_bsv_block(tmp_path: Path) -> None:
    case = Case("local_chunked", B, 2048, 4096, dtype="bf16", chunk_size=256, device="meta")
    run = measure(case)
    path = write_snapshot(synthesize_snapshot(run.events, case=case), tmp_path / "c.pickle")
    findings = attribute_file(path, min_block_bytes=1)
    assert findings.peak_allocated_bytes == run.peak_bytes
    assert not [f for f in findings.findings if f.shape == (B, 2048, 4096) and f.dtype == "float32"]
    chunk = [f for f in findings.findings if f.shape == (B, 256, 4096) and f.dtype == "float32"]
    assert chunk and {f.phase for f in chunk} == {"forward", "backward"}
