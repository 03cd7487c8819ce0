"""Run one step under the allocation tracker and turn the trace into a Run."""

from __future__ import annotations

import gc
import weakref
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
    kept: int = 0  # bytes the kernel left allocated after the step (a cache, a global)
    held: int = 0  # bytes it kept from earlier cases, still allocated as this one ran


# The trackers of earlier steps whose kernel kept storages allocated after it returned, by
# kernel: each sees those storages freed, so what they still hold is live memory the next
# case of the kernel runs beside. A kernel that cached a 4 MiB buffer at its first call
# had it in the first row's peak only: later rows (and every step of plan's search after
# the first) read as if it held none, and plan fitted it at unchunked's size.
# Keyed by the kernel's module (a user kernel's ``module:attr``; a built-in's own name):
# two kernels of one module share its globals, and a cache the first made was live, yet
# uncounted, through the second's cases (2 MiB of it at 1,081,344 B, no word; alone it
# read 2,129,920 B).
_KEPT: dict[str, list[AllocationTracker]] = {}
# The inputs memprobe gave earlier cases, by the same key: memprobe drops them after each
# case, so one still live at a later case is one the kernel kept (``_C['x'] = logits``):
# the previous case's logits were live beside the next case's, uncounted, and plan fitted
# such a kernel at unchunked's 583 tokens where it holds another [S, V] of logits.
_GIVEN: dict[str, list[tuple[weakref.ref[Any], Event]]] = {}


def owner_of(kernel: str) -> str:
    """Whose globals a kernel shares: a user kernel's module, a built-in's own name."""
    module, sep, _ = kernel.partition(":")
    return module if sep else kernel


def keeps_inputs(kernel: str) -> bool:
    """Whether an input memprobe gave ``kernel`` (or its module's other kernels) is still
    live, its case over: the kernel kept it (``_L.append(logits)``)."""
    return bool(_live_given(kernel))


def _live_given(kernel: str) -> list[tuple[weakref.ref[Any], Event]]:
    """The inputs given to ``kernel``'s module still live (the dead ones dropped)."""
    given = _GIVEN.get(owner_of(kernel), [])
    if any(ref() is not None for ref, _ in given):
        gc.collect()  # an input in a reference cycle of its own step is garbage, not kept
    given[:] = [(ref, event) for ref, event in given if ref() is not None]
    return given


def _left(tracker: AllocationTracker) -> int:
    """Bytes allocated under ``tracker`` (not its inputs) still live."""
    return sum(event.nbytes for _, event in tracker.left())


def _adopt_kept(tracker: AllocationTracker, kernel: str) -> int:
    """Adopt what ``kernel`` kept from earlier cases; its bytes. (A function of its own: a
    loop variable left holding a storage would keep it allocated through the case.)"""
    before = tracker.live_bytes
    label = "input: kept by the kernel from earlier cases"
    earlier = _KEPT.get(owner_of(kernel), [])
    lefts = [(t, t.left()) for t in earlier]
    # A tracker whose storages have all been freed holds nothing more: kept, it stayed in
    # the process (with all its events) and was asked again at every later case.
    earlier[:] = [t for t, left in lefts if left]
    for _, left in lefts:
        for storage, event in left:
            tracker.adopt(storage, event, label)
    for ref, event in _live_given(kernel):
        storage = ref()
        if storage is not None:
            tracker.adopt(storage, event, label)
        del storage
    return tracker.live_bytes - before


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
    # memory where that is exact (measure.memo; ops on other devices just run). Only the
    # inputs' device is counted: a kernel's scratch tensor on the host (torch.empty(n),
    # no device) was read as 4 MiB more of a meta case's device memory, which a GPU's
    # allocator never counts, and a meta one (device="meta") as real memory of a CPU case.
    leaves = protocol.leaves(inputs)
    device = leaves[0][1].device.type if leaves else None
    memo_ = trace_memo() if memo else None
    tracker = AllocationTracker(capture_frames=capture_frames, memo=memo_, device=device)
    for label, tensor in leaves:
        tracker.track(tensor, op=f"input: {label}")
    # What the kernel kept from earlier cases is live through this one, as on a GPU.
    # Each storage is adopted, so one the kernel frees as this case runs is freed here too.
    given = [(weakref.ref(storage), event) for storage, event in tracker.live_storages()]
    held = _adopt_kept(tracker, case.kernel)
    with tracker, threads_started() as started:
        tracker.set_phase("forward")
        logprobs = call(inputs)
        tracker.set_phase("backward")
        grads = backward(logprobs, inputs)
        del logprobs, grads
    kept = _left(tracker)
    if kept:  # a reference cycle of the step's own is garbage, not kept: collect it first
        gc.collect()
        kept = _left(tracker)
    if kept:
        _KEPT.setdefault(owner_of(case.kernel), []).append(tracker)
    _GIVEN.setdefault(owner_of(case.kernel), []).extend(given)
    counted = tracker.collectives
    return StepTrace(
        tracker, counted.get("forward", 0), counted.get("backward", 0), started[0], kept, held
    )


def _elsewhere_note(tracker: AllocationTracker) -> str:
    """Tensors the kernel made on another device than its inputs' (host scratch on a
    meta or GPU case, meta tensors on a CPU one): not this device's memory."""
    if not tracker.elsewhere:
        return ""
    made = ", ".join(f"{n:,} on {kind}" for kind, n in sorted(tracker.elsewhere.items()))
    return f"the kernel made tensors on another device than its inputs' ({made}): not in this peak"


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
        note="; ".join(
            n
            for n in (
                describe_filters(case),
                _threads_note(trace.threads),
                _kept_note(trace),
                _elsewhere_note(tracker),
            )
            if n
        ),
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


def _kept_note(trace: StepTrace) -> str:
    """What the kernel keeps allocated between calls: in the peak of the case that made it
    and, while it stays allocated, of every later case of the kernel in this process."""
    said = []
    if trace.held:
        said.append(f"this peak holds {trace.held:,} B the kernel kept from earlier cases")
    if trace.kept:
        said.append(
            f"the kernel kept {trace.kept:,} B allocated after it returned (a cache or a "
            "global): counted in this peak and in its later cases' while it stays allocated"
        )
    return "; ".join(said)
