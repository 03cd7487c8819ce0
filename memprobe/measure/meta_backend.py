"""Exact simulation on meta tensors: any size, milliseconds, no real memory.

Meta tensors have shapes and dtypes but no data, so every allocation the
kernel would make is seen at its true size. Times are not measured.
"""

from __future__ import annotations

from memprobe.errors import UserError
from memprobe.kernels.peers import unavailable_reason
from memprobe.measure.protocol import protocol_for
from memprobe.measure.step import process_group_for
from memprobe.measure.traced import StepTrace, run_from_trace, traced_step
from memprobe.measure.tracker import AllocationTracker
from memprobe.records import Case, Run


def simulate_step(case: Case, *, capture_frames: bool = True, memo: bool = True) -> StepTrace:
    """One representative rank: a vocabulary-parallel kernel runs under a fake
    process group of ``case.tp`` ranks whose collectives do nothing."""
    if unavailable_reason(case.kernel, "meta") is not None:
        # A Triton peer: rather no figure than a guessed one (`memprobe plan` says so).
        raise UserError(
            f"{case.kernel} is a Triton kernel: its memory cannot be simulated on meta",
            f"measure it on a GPU: {gpu_sweep_command(case)}",
        )
    with process_group_for(case):
        inputs = protocol_for(case.kernel).make_inputs(case, "meta")
        return traced_step(case, inputs, capture_frames=capture_frames, memo=memo)


def gpu_sweep_command(case: Case) -> str:
    """The sweep that measures ``case``'s kernel on a GPU at its vocabulary (and hidden
    size, dtype, batch): a hidden-family peer named without ``--hidden`` is refused by the
    sweep, so the hint carries every flag the kernel needs to run at all."""
    flags = [f"--device cuda --kernel {case.kernel} --vocab {case.vocab}"]
    if case.hidden is not None:
        flags.append(f"--hidden {case.hidden}")
    if case.dtype != "bf16":
        flags.append(f"--dtype {case.dtype}")
    if case.batch != 1:
        flags.append(f"--batch {case.batch}")
    return "memprobe sweep " + " ".join(flags)


def simulate_tracker(
    case: Case, *, capture_frames: bool = True, memo: bool = True
) -> AllocationTracker:
    """The exact tracker of one step, whichever inputs the kernel takes."""
    return simulate_step(case, capture_frames=capture_frames, memo=memo).tracker


def measure_meta(case: Case) -> Run:
    return run_from_trace(case, simulate_step(case))
