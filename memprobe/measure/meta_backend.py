"""Exact simulation on meta tensors: any size, milliseconds, no real memory.

Meta tensors have shapes and dtypes but no data, so every allocation the
kernel would make is seen at its true size. Times are not measured.
"""

from __future__ import annotations

from memprobe.measure.step import make_inputs
from memprobe.measure.traced import run_from_tracker, traced_step
from memprobe.measure.tracker import AllocationTracker
from memprobe.records import Case, Run


def simulate(case: Case, *, capture_frames: bool = True) -> AllocationTracker:
    return traced_step(case, make_inputs(case, "meta"), capture_frames=capture_frames)


def measure_meta(case: Case) -> Run:
    return run_from_tracker(case, simulate(case))
