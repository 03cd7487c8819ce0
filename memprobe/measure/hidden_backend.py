"""The hidden family as sweep cases: ``Case(hidden=H)`` → ``Run``.

The hidden-family kernels take hidden states ``[B,S,H]`` and the lm_head weight
``[V,H]`` (:mod:`memprobe.measure.hidden` runs one step); this module turns a
case into that step on meta (exact simulation) or cpu (real tensors, tracked peak
and wall times), and into a Run with the same columns as a logits case. On cuda
the cuda backend runs it (:func:`memprobe.measure.cuda_backend.device_step`). The
floor is hidden + weight + both gradients; ``big_fp32_blocks`` still counts
float32 ``[B,S,V]`` blocks live at the peak, the block fusing exists to avoid.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from memprobe.io.sizes import format_bytes
from memprobe.kernels import KernelUnavailable, get_spec
from memprobe.measure.cpu_limits import REPEATS, SAFE_RAM_SHARE, available_ram_bytes
from memprobe.measure.hidden import (
    HiddenInputs,
    make_hidden_inputs,
    traced_hidden_step,
)
from memprobe.measure.step import floor_bytes, hidden_shape
from memprobe.measure.traced import StepTrace, run_from_trace
from memprobe.measure.tracker import AllocationTracker
from memprobe.records import Case, Run


def simulate_hidden_case(case: Case, *, capture_frames: bool = True) -> AllocationTracker:
    """The exact tracker of one step on meta tensors."""
    fn = get_spec(case.kernel).fn
    inputs = make_hidden_inputs(hidden_shape(case), "meta")
    return traced_hidden_step(fn, inputs, chunk_size=case.chunk_size, capture_frames=capture_frames)


def unsupported_layout(tp: int, cp: int) -> str | None:
    """Why the hidden family cannot run on this parallel layout (None: it can). The one
    rule: the sweep skips such cases and the planner refuses them, so neither answers
    with a whole-sequence simulation passed off as one rank's."""
    if tp > 1 or cp > 1:
        return "the hidden family runs on one device (tp = cp = 1)"
    return None


def measure_hidden(case: Case) -> Run:
    """One hidden-family case on ``case.device``: meta, cpu or cuda."""
    unsupported = unsupported_layout(case.tp, case.cp)
    if unsupported is not None:
        return Run(case, "skipped", note=unsupported)
    floor = floor_bytes(case)
    try:
        if case.device == "cuda":
            from memprobe.measure.cuda_backend import measure_cuda

            return measure_cuda(case)
        tracker = simulate_hidden_case(case, capture_frames=case.device == "meta")
    except KernelUnavailable as exc:
        return Run(case, "skipped", floor_bytes=floor, note=str(exc))
    times: dict[str, float] = {}
    if case.device == "cpu":
        budget = int(SAFE_RAM_SHARE * available_ram_bytes())
        if tracker.peak_bytes > budget:
            note = (
                f"needs {format_bytes(tracker.peak_bytes)} (simulated), over the safe share "
                f"{format_bytes(budget)} of available RAM; simulate it with --device meta"
            )
            return Run(case, "skipped", floor_bytes=floor, note=note)
        inputs = make_hidden_inputs(hidden_shape(case), "cpu")
        tracker = traced_hidden_step(get_spec(case.kernel).fn, inputs, chunk_size=case.chunk_size)
        times = _timed(case, inputs)
    # Single-device: no collectives. The same Run as a logits case's, from its tracker.
    return run_from_trace(case, StepTrace(tracker, 0, 0), **times)


def _timed(case: Case, inputs: HiddenInputs) -> dict[str, float]:
    """Median wall times of forward and backward, untracked."""
    # The hidden protocol's fn (spec.inputs says which; the union type cannot).
    fn: Callable[..., torch.Tensor] = get_spec(case.kernel).fn
    fwd: list[float] = []
    bwd: list[float] = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        out = fn(inputs.hidden, inputs.weight, inputs.targets, chunk_size=case.chunk_size)
        t1 = time.perf_counter()
        torch.autograd.grad(out, (inputs.hidden, inputs.weight), inputs.grad_outputs)
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        del out
    return {"fwd_time_s": statistics.median(fwd), "bwd_time_s": statistics.median(bwd)}
