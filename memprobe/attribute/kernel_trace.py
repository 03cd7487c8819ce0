"""KERNEL's own blocks in a stand-in step on meta, split where the splice needs them.

KERNEL runs inside a stand-in loss whose backward hands it an engine-owned gradient,
as a real loss does; the events are split into its forward and backward, where it let
go of its incoming gradient and of the logits, and which of its blocks outlive it.
torch is imported only when a kernel is simulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memprobe.attribute.loss_step_record import LossStep
from memprobe.errors import UserError
from memprobe.records import Event

# Phases of the kernel's simulation (the tracker's labels).
_KERNEL_FORWARD, _LOSS, _KERNEL_BACKWARD, _AFTER = "kf", "loss", "kb", "after"


@dataclass(frozen=True)
class KernelTrace:
    """The kernel's own events in a stand-in step, split where the splice needs them."""

    forward: tuple[Event, ...]  # allocs and frees of its blocks during its forward
    backward: tuple[Event, ...]  # ... during its backward
    release_at: int  # where in ``backward`` it let go of its incoming gradient
    forward_escapes: tuple[Event, ...]  # its forward blocks alive after the step (outputs)
    backward_escapes: tuple[Event, ...]  # its backward blocks alive after (the gradient)
    # Where it let go of the logits (when nothing else held them): ("forward", i) or
    # ("backward", i), before event i of that list; ("after", 0): with its gradient.
    logits_release: tuple[str, int] = ("after", 0)


def simulate_kernel(kernel: str, step: LossStep, chunk_size: int | None) -> KernelTrace:
    """Run ``kernel`` forward and backward on meta at the step's shape, as the recorded
    step ran its loss: logits from before, an engine-owned gradient of its output."""
    import torch

    from memprobe.measure.step import (
        kernel_backward,
        kernel_call,
        kernel_failed,
        process_group_for,
        torch_dtype,
    )
    from memprobe.measure.tracker import AllocationTracker
    from memprobe.records import Case

    # The kernel runs on the loss's rows (S − 1 for a shifted loss); the logits have S.
    case = Case(kernel, step.batch, step.loss_rows, step.vocab, step.dtype, chunk_size)
    call = kernel_call(case)
    # The GPU's memory only: a kernel's host scratch is not the step's (measure.traced).
    tracker = AllocationTracker(capture_frames=True, device="meta")
    released: list[int] = []

    class _Loss(torch.autograd.Function):
        """Stands in for the user's loss code (kept as recorded): its backward makes the
        gradient of the kernel's output, owned by the autograd engine."""

        @staticmethod
        def forward(ctx: Any, out: torch.Tensor) -> torch.Tensor:
            ctx.like = (out.shape, out.dtype, out.device)
            return out.new_empty(())

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            shape, dtype, device = ctx.like
            seed = torch.empty(shape, dtype=dtype, device=device)
            released.append(len(tracker.events) - 1)  # its alloc, just registered
            tracker.set_phase(_KERNEL_BACKWARD)
            return seed

    class _Head(torch.autograd.Function):
        """Stands in for the lm_head: makes the logits, and takes their gradient in
        backward, which the engine frees once it returns (as after the real lm_head's)."""

        @staticmethod
        def forward(ctx: Any, weight: torch.Tensor) -> torch.Tensor:
            shape = (case.batch, step.rows, case.vocab)
            made = torch.empty(shape, dtype=torch_dtype(case.dtype), device="meta")
            made_at.append(len(tracker.events) - 1)
            return made

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            tracker.set_phase(_AFTER)
            return grad.new_zeros(())

    made_at: list[int] = []

    def run() -> None:
        weight = torch.empty((), device="meta", requires_grad=True)
        ids = torch.empty((case.batch, step.rows), dtype=torch.long, device="meta")
        targets = ids if not step.shift else ids[:, step.shift :]
        with tracker:
            logits = _Head.apply(weight)
            tracker.set_phase(_KERNEL_FORWARD)
            held = None
            if step.shift:  # as Hugging Face's loss: logits[:, :-1] against labels[:, 1:]
                logits = logits[:, : -step.shift].contiguous()
                held = logits if step.holds_copy else None
                if step.copies_targets:
                    targets = targets.contiguous()
            out = call(logits, targets)
            del logits  # from here only the kernel holds them, if it saved them
            tracker.set_phase(_LOSS)
            loss = _Loss.apply(out)
            with kernel_backward(kernel):  # the kernel's backward is its code too
                (grad,) = torch.autograd.grad(loss, weight)
            tracker.set_phase(_AFTER)
            del out, loss, grad, held

    tracker.stop_code = run.__code__
    try:
        with process_group_for(case):
            run()
    except UserError:
        raise
    except Exception as exc:  # a user's kernel that fails on meta: one line, not a traceback
        raise kernel_failed(kernel, f"{case.tokens:,} tokens", exc) from None
    return _split(
        tracker.events, released[0] if released else None, made_at[0] if made_at else None
    )


def _split(events: list[Event], seed_at: int | None, logits_at: int | None) -> KernelTrace:
    # Storage ids are reused once freed: a block is known by its id only while live.
    live: dict[int, Event] = {}
    forward: list[Event] = []
    backward: list[Event] = []
    escapes: list[Event] = []
    release_at: int | None = None
    seed = events[seed_at].storage if seed_at is not None else None
    logits = events[logits_at].storage if logits_at is not None else None
    release: tuple[str, int] = ("after", 0)
    for e in events:
        if logits_at is not None and e.index > logits_at and e.storage == logits:
            logits_at = None  # its free: where the kernel let the logits go
            if e.phase in (_KERNEL_FORWARD, _LOSS):
                release = ("forward", len(forward))
            elif e.phase == _KERNEL_BACKWARD:
                release = ("backward", len(backward))
        if e.action == "alloc":
            if e.phase in (_KERNEL_FORWARD, _KERNEL_BACKWARD) and e.nbytes > 0:
                live[e.storage] = e
                (forward if e.phase == _KERNEL_FORWARD else backward).append(e)
            continue
        if seed_at is not None and e.index > seed_at and e.storage == seed:
            seed_at = None
            release_at = len(backward)
        made = live.pop(e.storage, None)
        if made is None:
            continue
        if e.phase == _AFTER:
            escapes.append(made)
        else:
            # A forward block freed before the kernel's backward began: at its forward's end.
            (forward if e.phase in (_KERNEL_FORWARD, _LOSS) else backward).append(e)
    escapes += live.values()
    escapes.sort(key=lambda e: e.index)
    return KernelTrace(
        forward=tuple(forward),
        backward=tuple(backward),
        release_at=len(backward) if release_at is None else release_at,
        forward_escapes=tuple(e for e in escapes if e.phase == _KERNEL_FORWARD),
        backward_escapes=tuple(e for e in escapes if e.phase == _KERNEL_BACKWARD),
        logits_release=release,
    )
