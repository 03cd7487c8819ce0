"""Attribution: the peak, the blocks live there, their [B,S,V] fits, op, frame, phase, OOMs."""

from __future__ import annotations

import json

import pytest
import snapshot_fixtures as fx

from memprobe.attribute import Findings, attribute
from memprobe.attribute.diff import diff_findings
from memprobe.attribute.frames import (
    is_internal,
    op_from_frames,
    phase_from_frames,
    user_chain,
)
from memprobe.commands.attribute import attribute_command
from memprobe.errors import UserError
from memprobe.io.codec import from_json, to_json
from memprobe.records import Frame
from memprobe.render.findings_text import render_findings
from memprobe.snapshot import write_snapshot

FP32_OPS_FORWARD = {"aten._to_copy.default", "aten._log_softmax.default"}
FP32_OPS_BACKWARD = {
    "aten.new_zeros.default",
    "aten.scatter_add.default",
    "aten._log_softmax_backward_data.default",
}


def _fp32_bsv(findings: Findings) -> list:
    return [f for f in findings.findings if f.size == fx.FP32_BSV]


def test_headline_names_every_float32_bsv_block() -> None:
    findings = attribute(fx.unchunked_snapshot())
    assert findings.source == "trace"
    assert findings.peak_allocated_bytes == fx.HEADLINE_PEAK
    # Two moments tie at 14·B·S·V + 4·B·S; the first is reported: the scatter_add grad's alloc.
    peak_entry = fx.unchunked_snapshot()["device_traces"][0][findings.peak_index]
    assert peak_entry["action"] == "alloc"
    assert "op=aten.scatter_add.default" in peak_entry["user_metadata"]
    # A meta run's clock timed the simulation: its times are never reported.
    assert findings.times == "simulated" and findings.peak_time_us is None

    blocks = _fp32_bsv(findings)
    assert {f.op for f in blocks} == FP32_OPS_FORWARD | FP32_OPS_BACKWARD
    for f in blocks:
        assert f.dtype == "float32" and f.shape == (fx.B, fx.S, fx.V) and f.dtype_source == "label"
        assert f.explanations[0].shape == (1, 20000, 131072) and f.explanations[0].exact
        assert f.phase == ("forward" if f.op in FP32_OPS_FORWARD else "backward")
        assert f.lifetime_us is None and f.lifetime_entries and f.lifetime_entries > 0
    by_op = {f.op: f for f in blocks}
    # Live at the peak: the log_softmax output (saved for backward), the gather's
    # zero grad and the scatter_add grad; the float32 copy is gone, the softmax grad to come.
    live = {op for op, f in by_op.items() if f.live_at_peak}
    assert live == {
        "aten._log_softmax.default",
        "aten.new_zeros.default",
        "aten.scatter_add.default",
    }
    fwd = by_op["aten._log_softmax.default"]
    assert fwd.frame == Frame("unchunked_logprobs", fx.KERNEL, 24)
    # Backward blocks come from the autograd engine under memprobe's harness: no user frame.
    assert by_op["aten.scatter_add.default"].frame is None
    assert findings.live_at_peak_count == 5
    # Live-at-peak blocks are listed first, largest first.
    flags = [f.live_at_peak for f in findings.findings]
    assert flags == sorted(flags, reverse=True)


def test_unlabelled_snapshot_still_finds_the_blocks_by_size_and_frames() -> None:
    snap = fx.unchunked_snapshot()
    snap.pop("memprobe")  # nor the run's record of its case: a stranger's file
    for e in snap["device_traces"][0]:
        e.pop("user_metadata")
    for s in snap["segments"]:
        for b in s["blocks"]:
            b.pop("user_metadata", None)
    findings = attribute(snap, vocab=131072)
    blocks = _fp32_bsv(findings)
    assert len(blocks) == 5
    # Forward blocks are on the logits path by their frame (unchunked_logprobs); the
    # backward ones have no op at all and are made and freed inside backward.
    for f in blocks:
        best = f.explanations[0]
        # No attention/mask evidence: B and S stay unsplit, N = B·S is what is known.
        assert (best.dtype, best.shape) == ("float32", (20000, 131072)), best
        assert f.dtype_source == "inferred" and f.op is None and f.logits
    phases = sorted(f.phase for f in blocks)
    assert phases == ["backward", "backward", "backward", "forward", "forward"]
    # The float32 [N] gather output (80,000 bytes) is evidence for N = 20,000.
    assert any("80,000 B" in r for r in findings.inference.evidence)


def test_oom_reports_request_free_and_what_was_live() -> None:
    findings = attribute(fx.oom_snapshot())
    (oom,) = findings.ooms
    assert oom.requested_bytes == fx.FP32_BSV
    assert oom.device_free_bytes == 3 * 2**30
    assert oom.phase == "backward" and oom.op == "aten._log_softmax_backward_data.default"
    assert oom.allocated_bytes == fx.BF16_BSV + 2 * fx.FP32_BSV + 4 * fx.B * fx.S
    assert oom.live_count == 4
    live = [f for f in findings.findings if f.live_at_oom]
    assert {f.address for f in live} == set(oom.live_addresses)
    assert sorted(f.op for f in live if f.size == fx.FP32_BSV) == [
        "aten._log_softmax.default",
        "aten.scatter_add.default",
    ]
    assert all(f.oom_numbers == (0,) for f in live)


def test_real_style_snapshot_frames_ops_and_pending_free() -> None:
    findings = attribute(fx.real_style_snapshot(), vocab=131072)
    assert findings.peak_allocated_bytes == 60 * fx.MiB + 1000
    # Reserved: 64 MiB + 32 MiB mapped at once; +2 MiB comes after the unmap.
    assert findings.peak_reserved_bytes == 96 * fx.MiB
    assert findings.reserved_at_snapshot_bytes == 64 * fx.MiB
    big = findings.findings[0]
    assert big.size == 40 * fx.MiB and big.op == "aten::_log_softmax" and big.op_source == "frames"
    assert big.explanations[0].describe() == "float32 [N=80, V=131072]"
    assert big.frame == Frame("compute_logprobs", "/home/me/rl/train.py", 41)
    assert big.phase == "forward"
    assert big.free_index is None  # requested but still pending at snapshot time
    bwd = next(f for f in findings.findings if f.size == 20 * fx.MiB)
    assert bwd.phase == "backward" and "autograd engine" in bwd.phase_reason
    assert bwd.op == "aten::_log_softmax_backward_data" and bwd.frame is None
    (oom,) = findings.ooms
    assert (oom.requested_bytes, oom.device_free_bytes) == (400 * fx.MiB, 5 * fx.MiB)
    assert oom.allocated_bytes == 60 * fx.MiB


def test_variants_give_the_same_peak() -> None:
    base = attribute(fx.real_style_snapshot())
    for variant in (
        fx.without_time_us,
        fx.without_settings,
        fx.awaiting_free_spelling,
        fx.python_only_frames,
        fx.windows_paths,
    ):
        f = attribute(variant(fx.real_style_snapshot()))
        assert f.peak_allocated_bytes == base.peak_allocated_bytes, variant.__name__
        assert f.peak_index == base.peak_index
    no_time = attribute(fx.without_time_us(fx.real_style_snapshot()))
    assert no_time.peak_time_us is None and no_time.findings[0].lifetime_us is None
    assert any("no time_us" in n for n in no_time.notes)
    win = attribute(fx.windows_paths(fx.real_style_snapshot()))
    assert win.findings[0].frame == Frame("compute_logprobs", "C:\\Users\\me\\rl\\train.py", 41)
    py_only = attribute(fx.python_only_frames(fx.real_style_snapshot()))
    bwd = next(f for f in py_only.findings if f.size == 20 * fx.MiB)
    # Backward has no Python frames: its neighbours place it in backward (autograd engine).
    assert bwd.phase == "backward" and bwd.phase_reason.startswith("no frames")


def test_ring_buffer_counts_blocks_from_before_the_window() -> None:
    full = attribute(fx.unchunked_snapshot())
    cut = attribute(fx.ring_buffer_snapshot())
    assert cut.peak_allocated_bytes == full.peak_allocated_bytes
    assert any("ring buffer" in n for n in cut.notes)
    early = [f for f in cut.findings if f.alloc_index is None]
    assert {f.size for f in early} >= {fx.FP32_BSV, fx.BF16_BSV}
    lsm = next(f for f in early if f.size == fx.FP32_BSV)
    assert lsm.live_at_peak and lsm.phase is None and lsm.op == "aten._log_softmax.default"


def test_empty_trace_falls_back_to_segments() -> None:
    findings = attribute(fx.empty_trace_snapshot())
    assert findings.source == "segments" and findings.peak_index is None
    assert findings.peak_allocated_bytes == 40 * fx.MiB
    assert findings.peak_reserved_bytes == 64 * fx.MiB
    assert [f.size for f in findings.findings] == [40 * fx.MiB]


def test_legacy_segment_list_uses_rounding_slack() -> None:
    findings = attribute(fx.legacy_segment_list())
    assert findings.peak_allocated_bytes == 1000 * 1000


def test_json_round_trip_and_required_keys() -> None:
    findings = attribute(fx.oom_snapshot())
    data = json.loads(json.dumps(to_json(findings)))
    assert from_json(Findings, data) == findings
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_time_us", "peak_index"):
        assert key in data
    for f in data["findings"]:
        for key in ("size", "dtype", "shape", "op", "frame", "phase", "live_at_peak"):
            assert key in f
        assert "explanations" in f and "lifetime_us" in f and "live_at_oom" in f
    assert data["ooms"][0]["requested_bytes"] == fx.FP32_BSV


def test_top_limits_the_listed_blocks_but_never_the_logits() -> None:
    one = attribute(fx.unchunked_snapshot(), top=1)
    # Every logits-family block is listed whatever --top says; only they pass the limit.
    assert sum(f.live_at_peak and not f.logits for f in one.findings) <= 1
    assert len(one.logits_family) == 7
    assert one.findings[0].size == fx.FP32_BSV


@pytest.mark.parametrize("bad", [{"vocab": 0}, {"tokens": -1}, {"top": 0}, {"batch": 1.5}])
def test_bad_options_are_user_errors(bad: dict) -> None:
    with pytest.raises(UserError):
        attribute(fx.unchunked_snapshot(), **bad)


def test_device_choice() -> None:
    assert attribute(fx.unchunked_snapshot(), device=0).device == 0
    with pytest.raises(UserError, match="device 3"):
        attribute(fx.unchunked_snapshot(), device=3)


# -- frames -------------------------------------------------------------------


def test_frame_classification() -> None:
    torch_frame = Frame("log_softmax", "/x/site-packages/torch/nn/functional.py", 2240)
    win_torch = Frame("f", "C:\\venv\\Lib\\site-packages\\torch\\nn\\functional.py", 1)
    stdlib = Frame("wrapper", "/usr/lib/python3.11/contextlib.py", 81)
    cpp = Frame("at::_ops::_log_softmax::call(...)", "??", 0)
    user = Frame("compute", "/home/me/train.py", 5)
    kernel = Frame("unchunked_logprobs", fx.KERNEL, 24)
    harness = Frame("call", fx.STEP, 52)
    notebook = Frame("<module>", "<ipython-input-3-abc>", 2)
    for frame in (
        torch_frame,
        win_torch,
        stdlib,
        cpp,
        harness,
        Frame("<lambda>", "<frozen runpy>", 1),
    ):
        assert is_internal(frame), frame
    for frame in (user, kernel, notebook, Frame("main", "C:\\Users\\me\\train.py", 3)):
        assert not is_internal(frame), frame
    assert user_chain((cpp, torch_frame, harness, kernel, user))[0] == (kernel, user)
    assert op_from_frames((cpp, torch_frame)) == "aten::_log_softmax"
    assert op_from_frames((torch_frame, user)) == "torch.nn.functional.log_softmax"
    assert phase_from_frames(()) == (None, "no frames recorded")
    assert phase_from_frames((torch_frame, user))[0] == "forward"
    optim = Frame("step", "/x/site-packages/torch/optim/adam.py", 200)
    assert phase_from_frames((optim, user))[0] == "optimizer"
    custom_bwd = Frame("backward", "/work/main/memprobe/kernels/local_chunked.py", 120)
    assert phase_from_frames((custom_bwd,))[0] == "backward"


# -- text and HTML ------------------------------------------------------------


def test_text_report_mentions_computed_numbers() -> None:
    findings = attribute(fx.oom_snapshot())
    text = "\n".join(render_findings(findings))
    assert "peak allocated: 34.18 GiB" in text
    assert "float32 [1, 20000, 131072]" in text
    assert "OOM #1" in text and "requested 10,485,760,000 B (9.77 GiB)" in text
    assert "at that moment: 3.00 GiB free on the device" in text
    assert "autograd_reference.py:24 in unchunked_logprobs" in text


def test_html_is_escaped_and_self_contained(tmp_path) -> None:
    snap = fx.real_style_snapshot()
    snap["device_traces"][0][1]["frames"] = [
        {"name": "<script>alert(1)</script>", "filename": "/home/<me>/x.py", "line": 3}
    ]
    source, out = tmp_path / "snap.pickle", tmp_path / "page.html"
    write_snapshot(snap, source)
    attribute_command(source, html_path=out)
    page = out.read_text()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)" in page
    assert "http://" not in page and "https://" not in page
    assert page.lower().startswith("<!doctype html>")


def test_legacy_free_and_unknown_actions_are_tolerated() -> None:
    snap = fx.real_style_snapshot()
    trace = snap["device_traces"][0]
    # The earliest history files had a single ``free`` action; future torch may add more.
    for e in trace:
        if e["action"] == "free_completed":
            e["action"] = "free"
    trace = [e for e in trace if e["action"] != "free_requested" or e["addr"] == fx.SEG_A]
    trace.insert(3, {"action": "segment_defrag", "stream": 0})
    snap["device_traces"][0] = trace
    findings = attribute(snap)
    assert findings.peak_allocated_bytes == 60 * fx.MiB + 1000
    assert any("segment_defrag" in n for n in findings.notes)


def test_notes_name_synthesized_files_and_other_devices() -> None:
    snap = fx.unchunked_snapshot()
    snap["device_traces"].append(fx.real_style_snapshot()["device_traces"][0][:3])
    findings = attribute(snap)
    assert findings.device == 0  # the longer trace
    assert any("synthesized by memprobe" in n for n in findings.notes)
    assert any("other devices with a trace: 1 (3 entries)" in n for n in findings.notes)
    assert attribute(snap, device=1).peak_allocated_bytes == 40 * fx.MiB + 1000


def test_diff_lists_categories_of_equal_delta_in_a_stable_order() -> None:
    """Equal deltas (a file against itself: all 0) keep A's order, largest first, in
    every process (a set's order changed with the hash seed)."""
    findings = attribute(fx.real_style_snapshot())
    assert len(findings.breakdown) >= 2
    same = diff_findings(findings, findings)
    assert [c for c, _, _ in same.categories] == [c for c, _ in findings.breakdown]
