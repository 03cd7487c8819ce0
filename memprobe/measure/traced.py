"""Run one step under the allocation tracker and turn the trace into a Run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memprobe.measure.memo import trace_memo
from memprobe.measure.parallel import RankLayout
from memprobe.measure.protocol import floor_bytes, protocol_for
from memprobe.measure.step import describe_filters
from memprobe.measure.tracker import AllocationTracker, threads_started
from memprobe.records import Case, Event, Run


@dataclass
class StepTrace:
    """The tracker of one step, the collectives it issued in each pass, and the threads
    the kernel started (what they allocated is not in the tracker)."""

    tracker: AllocationTracker
    fwd_collectives: int
    bwd_collectives: int
    threads: int = 0


def traced_step(
    case: Case,
    inputs: Any,
    *,
    capture_frames: bool = True,
    memo: bool = True,
    layout: RankLayout | None = None,
) -> StepTrace:
    """Forward and backward once, every storage and collective recorded.

    ``inputs`` are the case's protocol's (:mod:`memprobe.measure.protocol`); the ones
    backward differentiates are counted from the start. Inputs are released by the
    caller; the step's own tensors are dropped before returning. ``memo``: repeated meta
    ops answered from memory (the same events, faster).
    """
    protocol = protocol_for(case.kernel)
    call = protocol.forward(case, layout=layout)
    backward = protocol.backward_of(case)
    # On meta a chunk loop asks each op the same question every chunk: answered from
    # memory where that is exact (measure.memo; ops on other devices just run).
    tracker = AllocationTracker(capture_frames=capture_frames, memo=trace_memo() if memo else None)
    for label, tensor in protocol.leaves(inputs):
        tracker.track(tensor, op=f"input: {label}")
    with tracker, threads_started() as started:
        tracker.set_phase("forward")
        logprobs = call(inputs)
        tracker.set_phase("backward")
        grads = backward(logprobs, inputs)
        del logprobs, grads
    counted = tracker.collectives
    return StepTrace(tracker, counted.get("forward", 0), counted.get("backward", 0), started[0])


def count_big_fp32_blocks(case: Case, live: list[Event]) -> int:
    """Live float32 allocations the size of a whole [B, S, V] on this rank."""
    return sum(1 for e in live if case.is_fp32_bsv(e.nbytes, e.dtype))


def run_from_trace(case: Case, trace: StepTrace, **extra: object) -> Run:
    tracker = trace.tracker
    live = tracker.live_at_peak()
    return Run(
        case=case,
        status="ok",
        peak_bytes=tracker.peak_bytes,
        forward_peak_bytes=tracker.phase_peaks.get("forward"),
        backward_peak_bytes=tracker.phase_peaks.get("backward"),
        floor_bytes=floor_bytes(case),
        big_fp32_blocks=count_big_fp32_blocks(case, live),
        fwd_collectives=trace.fwd_collectives,
        bwd_collectives=trace.bwd_collectives,
        note="; ".join(n for n in (describe_filters(case), _threads_note(trace.threads)) if n),
        events=tuple(tracker.events),
        **extra,  # type: ignore[arg-type]
    )


def _threads_note(threads: int) -> str:
    """A tracker sees the thread it was entered on only: a kernel that allocates on threads
    it starts has a peak without those bytes (the CUDA allocator would count them)."""
    if not threads:
        return ""
    return (
        f"the kernel started {threads:,} thread(s): memory allocated on them is not in this "
        "peak (on meta and cpu memprobe tracks the thread that runs the kernel; measure it "
        "on a GPU to count every thread)"
    )
