"""Real measurement on a GPU: allocator statistics, CUDA-event times, history.

``peak_bytes`` means the same thing as on meta and cpu: the logits plus
everything the step allocates (targets and the upstream gradient, identical
for every kernel, are left out). ``reserved_peak_bytes`` is what the caching
allocator held at most for the inputs and the step.

One case runs as:

1. a warm-up step of the same kernel at a tiny shape, so one-time allocations
   (cuBLAS workspaces of the caller's and of autograd's device thread, lazily
   loaded kernels) are made before the baseline, not counted in the step;
2. the inputs, drawn directly in their dtype (no float32 staging copy);
3. one recorded step: peak statistics reset and allocator history started only
   now that the inputs exist, so the trace and the peaks hold the step alone,
   each allocation labelled with case and phase;
4. ``repeats`` timed steps with history off; CUDA events bracket forward and
   backward with no host work between them.

The allocator's per-allocation metadata is thread-local, and CUDA runs backward
on autograd's device thread: the backward label is set by a pre-hook of the
step's output node, which runs on that thread before anything else of backward.

Every kernel runs through its input protocol (:mod:`memprobe.measure.protocol`): a
hidden-family case has hidden states and the lm_head weight for inputs and both their
gradients in backward (:class:`DeviceStep`); its peaks count hidden and weight from
the start, as meta's do.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from memprobe.errors import UserError
from memprobe.measure.parallel import RankLayout
from memprobe.measure.protocol import floor_bytes, protocol_for
from memprobe.measure.step import describe_filters, process_group_for
from memprobe.records import Case, Run

HISTORY_ENTRIES = 100_000
REPEATS = 3
# Where tensors are made; the fake-CUDA test harness points it at the CPU.
DEVICE = "cuda"
# Tokens of the warm-up step: enough to run every code path once, small enough to cost
# milliseconds at any vocabulary.
WARM_UP_TOKENS = 64
NO_CACHING_ENV = "PYTORCH_NO_CUDA_MEMORY_CACHING"
# What CUDA libraries say when they could not get memory outside the caching allocator.
_OOM_MARKERS = (
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
)

# Set once a CUDA error leaves the context unusable: every later case says so.
_sticky_error: str | None = None


@dataclasses.dataclass(frozen=True)
class DeviceStep:
    """One case's step on the device, whichever inputs its kernel takes.

    ``counted`` are the inputs its peaks include from the start (the logits;
    hidden and weight): targets and the upstream gradient, the same for every
    kernel, are left out.
    """

    make: Callable[[Case], Any]
    forward: Callable[[Any], torch.Tensor]
    backward: Callable[[torch.Tensor, Any], object]
    counted: Callable[[Any], tuple[torch.Tensor, ...]]


def device_step(case: Case, layout: RankLayout | None = None) -> DeviceStep:
    """The step of ``case``'s kernel, through its input protocol."""
    protocol = protocol_for(case.kernel)
    return DeviceStep(
        make=lambda c: protocol.make_inputs(c, DEVICE, layout=layout),
        forward=protocol.forward(case, layout=layout),
        backward=protocol.backward_of(case),
        counted=lambda i: tuple(t for _, t in protocol.leaves(i)),
    )


def _nbytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def require_cuda() -> None:
    """CUDA present, and an allocator whose statistics mean what memprobe reports."""
    # The CPU build of torch answers 0 from max_memory_allocated(): never measure there.
    if not torch.cuda.is_available():
        raise UserError(
            "--device cuda asked for, but CUDA is not available here",
            "run on a GPU machine, or use --device meta to simulate exactly",
        )
    backend = allocator_backend()
    if backend != "native":
        raise UserError(
            f"the CUDA allocator backend is {backend}; memprobe measures torch's native "
            "caching allocator (its statistics and history differ elsewhere)",
            "unset backend:cudaMallocAsync in PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF, "
            "or simulate with --device meta",
        )
    if os.environ.get(NO_CACHING_ENV, "0") not in ("", "0"):
        raise UserError(
            f"{NO_CACHING_ENV} is set: without caching the allocator keeps no statistics "
            "and every peak would read as just the logits",
            f"unset {NO_CACHING_ENV}, or simulate with --device meta",
        )


def allocator_backend() -> str:
    get = getattr(torch.cuda.memory, "get_allocator_backend", None)
    return get() if get is not None else "native"  # older torch had only native


def _label(case: Case, phase: str) -> None:
    """Tag the allocations that follow on this thread, so attribution knows case and phase."""
    from memprobe.snapshot import format_label

    _set_metadata(format_label(case=case.case_id, phase=phase))


def _set_metadata(text: str) -> None:
    set_metadata = getattr(torch.cuda.memory, "_set_memory_metadata", None)
    if set_metadata is not None:  # older torch has no per-entry metadata
        set_metadata(text)


def _start_history() -> None:
    # Python stacks only: phases come from the labels, and unwinding C++ stacks on
    # every allocation is what makes recording slow.
    try:
        torch.cuda.memory._record_memory_history(
            max_entries=HISTORY_ENTRIES, stacks="python", clear_history=True
        )
    except TypeError:  # a torch without these keywords
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)


def _stop_history() -> None:
    torch.cuda.memory._record_memory_history(enabled=None)


def _snapshot() -> dict[str, Any]:
    return torch.cuda.memory._snapshot()


def is_cuda_oom(exc: BaseException) -> bool:
    """The allocator's OutOfMemoryError, or a CUDA library that ran out on its own."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MARKERS)


def _first_line(exc: BaseException, default: str) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else default


def measure_cuda(
    case: Case,
    *,
    repeats: int = REPEATS,
    history: bool = True,
    layout: RankLayout | None = None,
) -> Run:
    global _sticky_error
    require_cuda()
    sticky = sticky_error_note()
    if sticky is not None:
        return Run(
            case=case, status="error", floor_bytes=floor_bytes(case), note=f"not run: {sticky}"
        )
    try:
        with process_group_for(case):
            return _measure(case, repeats=repeats, history=history, layout=layout)
    except Exception as exc:
        if not is_cuda_oom(exc) and _context_broken():
            _sticky_error = _first_line(exc, type(exc).__name__)
        raise


def sticky_error_note() -> str | None:
    """Why no case can run in this process any more, or None."""
    if _sticky_error is None:
        return None
    return (
        f"an earlier case left a sticky CUDA error ({_sticky_error}); "
        "the CUDA context is unusable until the process restarts"
    )


def _context_broken() -> bool:
    """After an error: does the device still answer? A sticky error fails every call."""
    try:
        torch.cuda.synchronize()
    except Exception:
        return True
    return False


def warm_up_device() -> None:
    """Make the one-time allocations of CUDA libraries (a cuBLAS handle and workspace
    for this thread and for autograd's device thread) outside any measurement."""
    x = torch.ones(8, 8, device=DEVICE, requires_grad=True)
    torch.autograd.grad((x @ x).sum(), x)
    torch.cuda.synchronize()


def _warm_up(case: Case, step: DeviceStep) -> None:
    warm_up_device()
    tokens = case.cp * min(case.local_tokens, WARM_UP_TOKENS)
    small = step.make(dataclasses.replace(case, tokens=tokens))
    out = step.forward(small)
    # Labelled, so the device thread never carries an earlier case's label into this one.
    with _backward_labelled(case, out, "warm-up"):
        step.backward(out, small)
    del out, small
    torch.cuda.synchronize()


@contextmanager
def _backward_labelled(case: Case, out: torch.Tensor, phase: str = "backward") -> Iterator[None]:
    """Label backward's allocations, on whichever thread runs backward."""
    _label(case, phase)  # the caller's thread: backward runs here on the CPU

    def on_device_thread(grad_outputs: Any) -> None:
        _label(case, phase)

    handle = out.grad_fn.register_prehook(on_device_thread) if out.grad_fn else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def _measure(case: Case, *, repeats: int, history: bool, layout: RankLayout | None) -> Run:
    gc.collect()
    torch.cuda.empty_cache()
    step = device_step(case, layout)
    snapshot: dict[str, Any] | None = None
    inputs: Any = None
    try:
        _warm_up(case, step)
        torch.cuda.empty_cache()
        before_reserved = torch.cuda.memory_reserved()
        before_allocated = torch.cuda.memory_allocated()
        inputs = step.make(case)
        counted = _nbytes(step.counted(inputs))
        torch.cuda.synchronize()
        _check_statistics(counted, before_allocated)
        try:
            recorded, snapshot = _recorded_step(case, step, inputs, history)
        except Exception as exc:
            if history and is_cuda_oom(exc):
                snapshot = _snapshot()  # the trace ends with the failed request
            raise
        finally:
            if history:
                _stop_history()
        fwd_times, bwd_times = _timed_steps(step, inputs, repeats)
    except Exception as exc:
        if not is_cuda_oom(exc):
            raise
        note = _first_line(exc, "CUDA out of memory")
        return Run(
            case=case,
            status="oom",
            floor_bytes=floor_bytes(case),
            note=note,
            cuda_snapshot=snapshot,
        )
    finally:
        _set_metadata("")
        del inputs
        gc.collect()
        torch.cuda.empty_cache()
    fwd_peak, bwd_peak, reserved_peak, base = recorded
    shift = counted - base
    return Run(
        case=case,
        status="ok",
        peak_bytes=max(fwd_peak, bwd_peak) + shift,
        forward_peak_bytes=fwd_peak + shift,
        backward_peak_bytes=bwd_peak + shift,
        # Everything the caching allocator held for the inputs and the step.
        reserved_peak_bytes=reserved_peak - before_reserved,
        floor_bytes=floor_bytes(case),
        fwd_time_s=statistics.median(fwd_times) if fwd_times else None,
        bwd_time_s=statistics.median(bwd_times) if bwd_times else None,
        big_fp32_blocks=_big_fp32_blocks(case, snapshot),
        note=describe_filters(case),
        cuda_snapshot=snapshot,
    )


def _check_statistics(made: int, before: int) -> None:
    """The statistics must see the inputs just made, or every figure would be wrong."""
    seen = torch.cuda.memory_allocated() - before
    if seen < made:
        raise UserError(
            f"the CUDA allocator's statistics do not see the inputs: {made} bytes of inputs "
            f"made, memory_allocated() grew by {seen} (caching off, or another allocator?)",
            f"unset {NO_CACHING_ENV} and any custom allocator, or simulate with --device meta",
        )


def _recorded_step(
    case: Case, step: DeviceStep, inputs: Any, history: bool
) -> tuple[tuple[int, int, int, int], dict[str, Any] | None]:
    """One step with peak statistics per phase and, with ``history``, the allocator trace.

    Returns ((forward peak, backward peak, reserved peak, allocated before), snapshot),
    with history still on: the caller stops it (after its own snapshot on OOM).
    """
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    if history:
        _start_history()
    _label(case, "forward")
    with torch.autograd.profiler.record_function(f"memprobe:{case.case_id}:forward"):
        out = step.forward(inputs)
    fwd_peak = torch.cuda.max_memory_allocated()
    reserved_peak = torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    with (
        torch.autograd.profiler.record_function(f"memprobe:{case.case_id}:backward"),
        _backward_labelled(case, out),
    ):
        grad = step.backward(out, inputs)
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated()
    reserved_peak = max(reserved_peak, torch.cuda.max_memory_reserved())
    snapshot = _snapshot() if history else None
    del out, grad
    return (fwd_peak, bwd_peak, reserved_peak, base), snapshot


def _timed_steps(step: DeviceStep, inputs: Any, repeats: int) -> tuple[list[float], list[float]]:
    """GPU times of forward and backward; nothing but launches between the events."""
    fwd: list[float] = []
    bwd: list[float] = []
    for _ in range(repeats):
        start, mid, bwd_start, end = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        start.record()
        out = step.forward(inputs)
        mid.record()
        bwd_start.record()
        step.backward(out, inputs)
        end.record()
        del out
        torch.cuda.synchronize()
        fwd.append(start.elapsed_time(mid) / 1e3)
        bwd.append(bwd_start.elapsed_time(end) / 1e3)
    return fwd, bwd


def _big_fp32_blocks(case: Case, snapshot: dict[str, Any] | None) -> int | None:
    """Blocks of exactly float32 [B, S, V] size live at the recorded peak.

    The allocator does not record dtypes: a block of that size is counted
    whatever made it, which is what a budget cares about.
    """
    if snapshot is None:
        return None
    from memprobe.snapshot import normalize_snapshot, replay

    history = replay(normalize_snapshot(snapshot))
    live = history.live_at(history.peak_pos)
    return sum(1 for b in live if case.is_fp32_bsv(b.size, None))
