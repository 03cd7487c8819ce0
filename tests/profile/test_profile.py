"""``memprobe profile`` and its library API: a user's step on meta equals it on cpu, phases
come from the hooks, failures are one line and write nothing."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import steps
import torch

from memprobe.attribute import attribute
from memprobe.errors import UserError
from memprobe.kernels import local_chunked_logprobs
from memprobe.profile import load_step, profile_step, trace_step
from memprobe.snapshot.load import load_snapshot


def _live_signature(tracked):  # type: ignore[no-untyped-def]
    return sorted((e.nbytes, e.op, e.shape, e.dtype, e.phase) for e in tracked.live_at_peak())


@pytest.fixture(scope="module")
def meta_and_cpu():  # type: ignore[no-untyped-def]
    return trace_step(steps.gpt_step, "meta"), trace_step(steps.gpt_step, "cpu")


def test_meta_equals_a_real_cpu_run_to_the_byte(meta_and_cpu) -> None:  # type: ignore[no-untyped-def]
    meta, cpu = meta_and_cpu
    assert meta.peak_bytes == cpu.peak_bytes > 0
    assert meta.phase_peaks == cpu.phase_peaks
    assert _live_signature(meta) == _live_signature(cpu)
    assert [(e.action, e.nbytes, e.op) for e in meta.events] == [
        (e.action, e.nbytes, e.op) for e in cpu.events
    ]


def test_phases_follow_the_step(meta_and_cpu) -> None:  # type: ignore[no-untyped-def]
    meta, _ = meta_and_cpu
    first = {}
    for e in meta.events:
        if e.action == "alloc":
            first.setdefault(e.phase, e.index)
    assert list(first) == ["setup", "forward", "backward", "optimizer"]
    ops = {e.phase: set() for e in meta.events}
    for e in meta.events:
        ops[e.phase].add(e.op)
    assert "aten.empty.memory_format" in ops["setup"]  # the parameters
    assert "aten._log_softmax.default" in ops["forward"]
    assert "aten._log_softmax_backward_data.default" in ops["backward"]
    # SGD's momentum buffers are made by the optimizer step.
    assert "aten.clone.default" in ops["optimizer"]
    # Every byte is freed once the step has returned.
    allocs = sum(e.nbytes for e in meta.events if e.action == "alloc")
    assert allocs == sum(e.nbytes for e in meta.events if e.action == "free")


def test_frames_start_at_the_users_step(meta_and_cpu) -> None:  # type: ignore[no-untyped-def]
    meta, _ = meta_and_cpu
    for e in meta.events:
        names = [f.name for f in e.frames]
        assert names[-1] == "gpt_step", names
        assert not any("memprobe" in f.filename for f in e.frames)


def test_snapshot_reads_as_the_step_it_profiled() -> None:
    snap = profile_step(steps.gpt_step, "meta", name="steps:gpt_step")
    tracked = trace_step(steps.gpt_step, "meta")
    found = attribute(snap)
    assert found.peak_allocated_bytes == tracked.peak_bytes
    assert found.peak_phase == "optimizer"
    assert snap["memprobe"]["step"] == "steps:gpt_step"
    assert snap["memprobe"]["clock"] == "simulation"
    assert found.times == "simulated"


def test_a_value_read_on_meta_names_the_op_and_suggests_cpu() -> None:
    with pytest.raises(UserError) as err:
        trace_step(steps.item_step, "meta")
    line = err.value.one_line()
    assert "aten._local_scalar_dense" in line and "--device cpu" in line
    assert "\n" not in line
    # The same step runs for real on cpu.
    assert trace_step(steps.item_step, "cpu").peak_bytes > 0


def test_load_step_follows_the_kernel_rules() -> None:
    assert load_step("steps:gpt_step") is steps.gpt_step
    with pytest.raises(UserError, match="does not take one argument"):
        load_step("steps:takes_nothing")
    with pytest.raises(UserError, match="not an import path"):
        load_step("steps.gpt_step")
    with pytest.raises(UserError, match="has no attribute"):
        load_step("steps:missing")


def test_cli_writes_the_snapshot_and_prints_its_attribution(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "step.pickle"
    code, text, err = run_cli("profile", "steps:gpt_step", "--out", str(out), "--json")
    assert code == 0, err
    assert out.read_bytes()[:2] == b"\x80\x04"  # pickle protocol 4: torch's viewer reads it
    data = json.loads(text)
    assert data["peak_allocated_bytes"] == attribute(load_snapshot(out)).peak_allocated_bytes
    assert data["peak_phase"] == "optimizer"
    with out.open("rb") as f:
        assert pickle.load(f)["memprobe"]["step"] == "steps:gpt_step"


def test_cli_html_says_where_the_page_went_on_stderr(run_cli, tmp_path: Path) -> None:
    page = tmp_path / "step.html"
    code, text, err = run_cli("profile", "steps:gpt_step", "--html", str(page), "--json")
    assert code == 0, err
    assert json.loads(text)["peak_phase"] == "optimizer"  # stdout is the reading alone
    assert err.strip().splitlines()[-1] == f"page: {page}"
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_cli_failures_are_one_line_and_write_nothing(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "step.pickle"
    for args in (
        ("steps:item_step",),
        ("steps:nope",),
        ("steps:gpt_step", "--device", "tpu"),
        ("steps:gpt_step", "--device", "cuda"),  # this build has no CUDA
    ):
        code, text, err = run_cli("profile", *args, "--out", str(out))
        assert code == 2, (args, text, err)
        assert err.startswith("memprobe: error:") and err.count("\n") == 1, err
        assert "Traceback" not in err
        assert not out.exists()


def test_attention_on_meta_runs_the_kernel_cpu_runs() -> None:
    """Meta's own SDPA choice is the math path ([B, h, S, S] scores, saved for backward);
    profiling on meta runs the fused kernel a real device picks, so meta equals cpu."""
    meta, cpu = trace_step(steps.sdpa_step, "meta"), trace_step(steps.sdpa_step, "cpu")
    assert meta.peak_bytes == cpu.peak_bytes
    assert [(e.action, e.nbytes, e.op) for e in meta.events] == [
        (e.action, e.nbytes, e.op) for e in cpu.events
    ]
    assert any("flash_attention" in e.op for e in meta.events)
    assert not any("memprobe" in f.filename for e in meta.events for f in e.frames)


def test_equals_torchs_mem_tracker_under_fake_tensors() -> None:
    """torch's own MemTracker (FakeTensorMode, fake cpu tensors) reads the same peak."""
    mem_tracker = pytest.importorskip(
        "torch.distributed._tools.mem_tracker", reason="this torch has no MemTracker"
    )
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    device = torch.device("cpu")
    with FakeTensorMode():
        model = steps.TinyGPT(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        tracker = mem_tracker.MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            ids = torch.randint(0, steps.VOCAB, (1, steps.TOKENS), device=device)
            logits = model(ids)
            loss = F.cross_entropy(logits.float().view(-1, steps.VOCAB), ids.view(-1))
            loss.backward()
            optimizer.step()
        theirs = tracker.get_tracker_snapshot("peak")[device]["Total"]
    assert trace_step(steps.gpt_step, "meta").peak_bytes == theirs


class _Double(torch.autograd.Function):
    """A user's own custom Function: its forward's allocations are the step's forward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


def _kernel_step(device: torch.device) -> None:
    logits = torch.randn(1, 64, 256, device=device, requires_grad=True)
    targets = torch.randint(0, 256, (1, 64), device=device)
    local_chunked_logprobs(logits, targets, chunk_size=16).sum().backward()


def _own_function_step(device: torch.device) -> None:
    x = torch.randn(64, 256, device=device, requires_grad=True)
    _Double.apply(x).sum().backward()


def _no_grad_kernel_step(device: torch.device) -> None:
    logits = torch.randn(1, 64, 256, device=device, requires_grad=True)
    targets = torch.randint(0, 256, (1, 64), device=device)
    with torch.no_grad():
        local_chunked_logprobs(logits, targets, chunk_size=16)


def _no_grad_setup_step(device: torch.device) -> None:
    with torch.no_grad():
        x = torch.randn(64, 256, device=device) * 3
    (x.requires_grad_() * 2).sum().backward()


# (step, the op whose first allocation is looked at, the phase it must be in)
FUNCTION_FORWARDS = [
    (_kernel_step, "aten.randn.default", "setup"),
    (_kernel_step, "aten.new_empty.default", "forward"),
    (_own_function_step, "aten.mul.Tensor", "forward"),
    # Under no_grad a Function's forward on a tensor that requires grad still computes.
    (_no_grad_kernel_step, "aten.new_empty.default", "forward"),
    # Setup ops under no_grad, outside any Function, stay setup.
    (_no_grad_setup_step, "aten.mul.Tensor", "setup"),
]


@pytest.mark.parametrize(("step", "op", "phase"), FUNCTION_FORWARDS)
def test_a_custom_functions_forward_is_the_steps_forward(step: Any, op: str, phase: str) -> None:
    """A step written without nn.Module that calls a custom autograd Function (memprobe's
    own kernels are ones): the Function's forward was labelled setup."""
    for device in ("meta", "cpu"):
        tracked = trace_step(step, device)
        first = next(e for e in tracked.events if e.action == "alloc" and e.op == op)
        assert first.phase == phase, (device, op)


def test_a_callers_gc_freeze_is_kept_and_none_is_left_behind() -> None:
    import gc

    gc.freeze()  # the caller's (this suite's conftest froze too)
    trace_step(steps.gpt_step, "meta")
    assert gc.get_freeze_count() > 0  # an unfreeze would have emptied it
    # Seen once, the freeze is not counted again while nothing was unfrozen: each of
    # these orders (another trace, an unfreeze, a freeze again) is still read right.
    trace_step(steps.gpt_step, "meta")
    assert gc.get_freeze_count() > 0
    gc.unfreeze()
    try:
        trace_step(steps.gpt_step, "meta")
        assert gc.get_freeze_count() == 0
        trace_step(steps.gpt_step, "meta")
        assert gc.get_freeze_count() == 0
        gc.freeze()
        trace_step(steps.gpt_step, "meta")
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
        trace_step(steps.gpt_step, "meta")
        assert gc.get_freeze_count() == 0
    finally:
        gc.freeze()
