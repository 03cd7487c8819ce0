"""Real measurement on a GPU: allocator statistics, CUDA-event times, history.

``peak_bytes`` means the same thing as on meta and cpu: the logits plus
everything the step allocates (targets and the upstream gradient, identical
for every kernel, are left out). ``reserved_peak_bytes`` is what the caching
allocator held at most for the inputs and the step.
"""

from __future__ import annotations

import gc
import statistics
from typing import Any

import torch

from memprobe.errors import UserError
from memprobe.measure.step import (
    describe_filters,
    floor_bytes,
    kernel_call,
    make_inputs,
    process_group_for,
)
from memprobe.records import Case, Run

HISTORY_ENTRIES = 100_000
REPEATS = 3


def require_cuda() -> None:
    # The CPU build of torch answers 0 from max_memory_allocated(): never measure there.
    if not torch.cuda.is_available():
        raise UserError(
            "--device cuda asked for, but CUDA is not available here",
            "run on a GPU machine, or use --device meta to simulate exactly",
        )


def _label(case: Case, phase: str) -> None:
    """Tag the allocations that follow, so attribution knows case and phase."""
    from memprobe.snapshot import format_label

    set_metadata = getattr(torch.cuda.memory, "_set_memory_metadata", None)
    if set_metadata is not None:  # older torch has no per-entry metadata
        set_metadata(format_label(case=case.case_id, phase=phase))


def _snapshot() -> dict[str, Any]:
    return torch.cuda.memory._snapshot()


def measure_cuda(case: Case, *, repeats: int = REPEATS, history: bool = True) -> Run:
    require_cuda()
    with process_group_for(case):
        return _measure(case, repeats=repeats, history=history)


def _measure(case: Case, *, repeats: int, history: bool) -> Run:
    gc.collect()
    torch.cuda.empty_cache()
    call = kernel_call(case)
    snapshot: dict[str, Any] | None = None
    before_reserved = torch.cuda.memory_reserved()
    if history:
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
    try:
        _label(case, "setup")
        inputs = make_inputs(case, "cuda")
        logits_bytes = inputs.logits.untyped_storage().nbytes()
        torch.cuda.synchronize()
        # Return the float32 staging buffer the random logits were drawn in:
        # left cached, the step could reuse it and hide part of its reserve.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fwd_times: list[float] = []
        bwd_times: list[float] = []
        fwd_peak = bwd_peak = reserved_peak = 0
        for i in range(repeats):
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            torch.cuda.reset_peak_memory_stats()
            _label(case, "forward")
            with torch.autograd.profiler.record_function(f"memprobe:{case.case_id}:forward"):
                start.record()
                out = call(inputs.logits, inputs.targets)
                mid.record()
            torch.cuda.synchronize()
            fwd = torch.cuda.max_memory_allocated()
            reserved_peak = max(reserved_peak, torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()
            _label(case, "backward")
            with torch.autograd.profiler.record_function(f"memprobe:{case.case_id}:backward"):
                torch.autograd.grad(out, inputs.logits, inputs.grad_outputs)
                end.record()
            torch.cuda.synchronize()
            bwd = torch.cuda.max_memory_allocated()
            reserved_peak = max(reserved_peak, torch.cuda.max_memory_reserved())
            if i == 0:
                fwd_peak, bwd_peak = fwd, bwd
                if history:
                    snapshot = _snapshot()
            fwd_times.append(start.elapsed_time(mid) / 1e3)
            bwd_times.append(mid.elapsed_time(end) / 1e3)
            del out
    except torch.cuda.OutOfMemoryError as exc:
        if history:
            snapshot = _snapshot()
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "CUDA out of memory"
        return Run(
            case=case,
            status="oom",
            floor_bytes=floor_bytes(case),
            note=first_line,
            cuda_snapshot=snapshot,
        )
    finally:
        if history:
            torch.cuda.memory._record_memory_history(enabled=None)
        gc.collect()
        torch.cuda.empty_cache()
    shift = logits_bytes - base
    return Run(
        case=case,
        status="ok",
        peak_bytes=max(fwd_peak, bwd_peak) + shift,
        forward_peak_bytes=fwd_peak + shift,
        backward_peak_bytes=bwd_peak + shift,
        # Everything the caching allocator held for the inputs and the step.
        reserved_peak_bytes=reserved_peak - before_reserved,
        floor_bytes=floor_bytes(case),
        fwd_time_s=statistics.median(fwd_times),
        bwd_time_s=statistics.median(bwd_times),
        big_fp32_blocks=_big_fp32_blocks(case, snapshot),
        note=describe_filters(case),
        cuda_snapshot=snapshot,
    )


def _big_fp32_blocks(case: Case, snapshot: dict[str, Any] | None) -> int | None:
    """Blocks of exactly float32 [B, S, V] size live at the recorded peak.

    The allocator does not record dtypes: a block of that size is counted
    whatever made it, which is what a budget cares about.
    """
    if snapshot is None:
        return None
    from memprobe.snapshot import normalize_snapshot, replay

    history = replay(normalize_snapshot(snapshot))
    return sum(1 for b in history.live_at(history.peak_pos) if b.size == case.fp32_bsv_bytes)
