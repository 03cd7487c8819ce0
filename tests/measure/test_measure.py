from __future__ import annotations

import pytest
import torch

from memprobe.errors import UserError
from memprobe.measure import measure, resolve_device
from memprobe.measure.cpu_backend import measure_cpu
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.measure.tracker import AllocationTracker
from memprobe.records import Case

B, S, V = 1, 20_000, 131_072
BSV = B * S * V
CHUNK = 1024
GIB = 2**30


def headline(kernel: str, **kw) -> Case:
    return Case(kernel, B, S, V, "bf16", CHUNK, device="meta", **kw)


def test_unchunked_headline_is_fourteen_bytes_per_element():
    run = measure(headline("unchunked"))
    # bf16 logits (2) + float32 log_softmax output (4) + gather's zero-filled
    # gradient (4) + its scatter result (4) = 14·B·S·V; the float32 [B, S]
    # log-probs returned by forward are the only other live tensor.
    assert run.peak_bytes == 14 * BSV + 4 * B * S
    assert round(run.peak_bytes / GIB, 2) == 34.18
    assert run.forward_peak_bytes == 10 * BSV  # logits + float32 copy + log_softmax output
    assert run.big_fp32_blocks == 3
    assert run.floor_bytes == 4 * BSV
    assert run.fwd_time_s is None and run.bwd_time_s is None  # meta measures no time


def test_local_chunked_headline():
    run = measure(headline("local_chunked"))
    chunk = 4 * B * CHUNK * V
    # logits + bf16 gradient + one float32 chunk, plus per-token float32
    # stats: log-probs and logsumexp [B, S] and one chunk's logsumexp [B, c].
    assert run.peak_bytes == 4 * BSV + chunk + 4 * B * S * 2 + 4 * B * CHUNK
    assert run.peak_bytes == 11_022_795_008
    assert run.peak_bytes <= 10.30 * GIB
    assert run.big_fp32_blocks == 0
    assert run.backward_peak_bytes == run.peak_bytes
    assert run.forward_peak_bytes < 2 * BSV + 2 * chunk


def test_local_chunked_inplace_headline_reaches_the_floor():
    run = measure(headline("local_chunked_inplace"))
    assert run.peak_bytes == 5_779_923_200
    assert run.peak_bytes <= 5.40 * GIB
    assert run.floor_bytes == 2 * BSV
    assert run.peak_bytes - run.floor_bytes < 4 * B * CHUNK * V * 1.01
    assert run.big_fp32_blocks == 0


def test_chunked_kernels_keep_one_float32_chunk_in_backward():
    tracker = simulate_tracker(headline("local_chunked"))
    backward = [e for e in tracker.events if e.action == "alloc" and e.phase == "backward"]
    big = [e for e in backward if e.nbytes >= 4 * CHUNK * V]
    assert {e.dtype for e in big} == {"torch.float32", "torch.bfloat16"}
    assert all(e.nbytes == 4 * B * CHUNK * V for e in big if e.dtype == "torch.float32")
    assert not any(e.dtype == "torch.int64" and e.nbytes >= CHUNK * V for e in tracker.events)


def test_naive_chunk_loop_bounds_nothing():
    naive = measure(headline("naive_chunked")).peak_bytes
    local = measure(headline("local_chunked")).peak_bytes
    assert naive > 2.5 * local


def test_tracker_records_ops_frames_and_phases():
    tracker = simulate_tracker(headline("unchunked"))
    allocs = [e for e in tracker.events if e.action == "alloc"]
    assert allocs[0].op == "input: logits" and allocs[0].phase == "setup"
    ops = {e.op for e in allocs}
    assert "aten._log_softmax.default" in ops and "aten._to_copy.default" in ops
    log_softmax = next(e for e in allocs if e.op == "aten._log_softmax.default")
    assert log_softmax.phase == "forward" and log_softmax.shape == (B, S, V)
    assert any("autograd_reference" in f.filename for f in log_softmax.frames)
    assert {e.phase for e in allocs} == {"setup", "forward", "backward"}
    assert [e.index for e in tracker.events] == list(range(len(tracker.events)))
    at_peak = tracker.live_at_peak()
    assert sum(e.nbytes for e in at_peak) == tracker.peak_bytes


def test_tracker_ignores_views_and_in_place_results():
    x = torch.empty(4, 8, device="meta")
    tracker = AllocationTracker()
    tracker.track(x)
    with tracker:
        x.view(8, 4).mul_(2)[0]
        y = x + 1
        del y
    assert [e.action for e in tracker.events] == ["alloc", "alloc", "free"]
    assert tracker.peak_bytes == 2 * 4 * 8 * 4


def test_cpu_backend_measures_real_tensors_and_times():
    case = Case("local_chunked", 1, 256, 512, "bf16", 64, device="cpu")
    run = measure_cpu(case, repeats=2)
    assert run.status == "ok"
    sim = measure(Case("local_chunked", 1, 256, 512, "bf16", 64, device="meta"))
    assert run.peak_bytes == sim.peak_bytes  # the simulation is exact
    assert run.fwd_time_s > 0 and run.bwd_time_s > 0


def test_cpu_backend_skips_what_would_not_fit():
    run = measure_cpu(headline("unchunked"), ram_bytes=24 * GIB)
    assert run.status == "skipped" and "safe share" in run.note and run.peak_bytes is None


def test_cuda_without_cuda_is_an_error_not_a_zero(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="CUDA is not available"):
        resolve_device("cuda")
    assert resolve_device("auto") == "meta"
    with pytest.raises(UserError, match="unknown device"):
        resolve_device("tpu")


def test_cuda_counts_big_blocks_from_its_allocator_history():
    # A synthesized snapshot stands in for torch.cuda.memory._snapshot() here.
    from memprobe.measure.cuda_backend import _big_fp32_blocks
    from memprobe.measure.meta_backend import simulate_tracker
    from memprobe.snapshot import synthesize_snapshot

    for kernel, expected in (("unchunked", 3), ("local_chunked", 0)):
        case = Case(kernel, 1, 2048, 32768, "bf16", 1024, device="meta")
        snapshot = synthesize_snapshot(simulate_tracker(case).events, case=case)
        assert _big_fp32_blocks(case, snapshot) == expected
    assert _big_fp32_blocks(case, None) is None
