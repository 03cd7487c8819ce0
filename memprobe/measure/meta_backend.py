"""Exact simulation on meta tensors: any size, milliseconds, no real memory.

Meta tensors have shapes and dtypes but no data, so every allocation the
kernel would make is seen at its true size. Times are not measured.
"""

from __future__ import annotations

from memprobe.measure.step import make_inputs, process_group_for
from memprobe.measure.traced import StepTrace, run_from_trace, traced_step
from memprobe.measure.tracker import AllocationTracker
from memprobe.records import Case, Run


def simulate_step(case: Case, *, capture_frames: bool = True) -> StepTrace:
    """One representative rank: a vocabulary-parallel kernel runs under a fake
    process group of ``case.tp`` ranks whose collectives do nothing."""
    with process_group_for(case):
        return traced_step(case, make_inputs(case, "meta"), capture_frames=capture_frames)


def simulate_tracker(case: Case, *, capture_frames: bool = True) -> AllocationTracker:
    """The exact tracker of one step, for logits and hidden-family kernels alike."""
    from memprobe.kernels import get_spec

    if get_spec(case.kernel).inputs == "hidden":
        from memprobe.measure.hidden_backend import simulate_hidden_case

        return simulate_hidden_case(case, capture_frames=capture_frames)
    return simulate_step(case, capture_frames=capture_frames).tracker


def measure_meta(case: Case) -> Run:
    return run_from_trace(case, simulate_step(case))
