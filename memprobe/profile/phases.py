"""The tracker for a whole training step: phases from autograd and the optimizer.

A kernel's step is split into forward and backward by the harness that calls it. A
user's step is one callable, so the phase of each allocation is read from torch itself:

- ``setup`` until the step starts computing: building the model and its inputs;
- ``forward`` from the first module call (a global forward pre-hook), or the first op
  that records autograd history (a tensor that requires grad, grad mode on), or the first
  op inside a custom autograd Function's forward called on such a tensor, for a step
  written without ``nn.Module``;
- ``backward`` while the autograd engine runs a graph task (every op it dispatches,
  activation-checkpoint recomputation included), and after it until the next phase
  begins (gradient clipping, all-reduces);
- ``optimizer`` from an optimizer's step (torch's global step pre-hook) until the next
  forward.

It also remembers the op that raised, so a step that fails on meta can be reported by op,
and the moments the step marks with :func:`mark` (where its loss starts and ends, say).
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import torch

from memprobe.errors import UserError
from memprobe.io.text import exception_text
from memprobe.measure import memo as memo_module
from memprobe.measure.memo import MetaMemo
from memprobe.measure.tracker import AllocationTracker, tensors_in
from memprobe.profile import attention
from memprobe.profile.flash_workspace import FLASH_BACKWARD, flash_backward_workspace, free_order


class StepTracker(AllocationTracker):
    """:class:`AllocationTracker` whose phase follows the step (see the module notes)."""

    skip_files = frozenset({__file__, attention.__file__, memo_module.__file__})

    def __init__(
        self,
        *,
        capture_frames: bool = True,
        device: str | None = None,
        memo: MetaMemo | None = None,
    ) -> None:
        super().__init__(capture_frames=capture_frames, device=device, memo=memo)
        self._handles: list[Any] = []
        self.failed_op: str | None = None
        self.failure: BaseException | None = None
        self.marks: list[tuple[str, int]] = []

    def __enter__(self) -> StepTracker:
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.remove(self)
        super().__exit__(*exc)

    # -- hooks -----------------------------------------------------------
    def install_hooks(self) -> None:
        """Register the global module and optimizer hooks; :meth:`remove_hooks` undoes it."""
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._handles = [
            register_module_forward_pre_hook(self._on_module_forward),
            register_optimizer_step_pre_hook(self._on_optimizer_step),
        ]

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _on_module_forward(self, module: Any, args: Any) -> None:
        if torch._C._current_graph_task_id() == -1:
            self.set_phase("forward")

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.set_phase("optimizer")

    # -- dispatch --------------------------------------------------------
    def follow_phase(self, args: Any, kwargs: Any) -> None:
        """Update the phase before an op runs (see the module notes)."""
        if torch._C._current_graph_task_id() != -1:
            if self.phase != "backward":
                self.set_phase("backward")
        elif self.phase == "setup" and (
            _records_history(args, kwargs) if torch.is_grad_enabled() else _in_function_forward()
        ):
            self.set_phase("forward")

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        self.follow_phase(args, kwargs)
        try:
            if func is FLASH_BACKWARD and self.device == "meta":
                return self._flash_backward(func, types, args, kwargs)
            return super().__torch_dispatch__(func, types, args, kwargs)
        except Exception as exc:
            # The op that raised: what a failure on meta is reported by.
            self.failed_op, self.failure = str(func), exc
            raise

    def _flash_backward(
        self, op: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
    ) -> Any:
        """Flash attention backward with the workspace CUDA allocates around its outputs
        (:mod:`memprobe.profile.flash_workspace`), each freed where CUDA frees it."""
        workspace = flash_backward_workspace(args)
        frames = self._frames(sys._getframe(1))
        held: dict[int, torch.Tensor] = {}

        def allocate(before: bool) -> None:
            for i, w in enumerate(workspace):
                if w.before == before:
                    held[i] = w.make()
                    self._register(held[i], w.op, frames)

        allocate(before=True)
        out = super().__torch_dispatch__(op, types, args, kwargs)
        allocate(before=False)
        for i in free_order(workspace):
            del held[i]  # the only reference: its storage is freed (and recorded) now
        return out


# The trackers running a step now, innermost last (what :func:`mark` writes to).
_ACTIVE: list[StepTracker] = []


def mark(label: str) -> None:
    """Note this moment of the step being traced: ``(label, events so far)`` goes into its
    record's ``marks``. Outside a trace it does nothing, so a step can always call it."""
    if _ACTIVE:
        tracker = _ACTIVE[-1]
        tracker.marks.append((label, len(tracker.events)))


def events_so_far() -> int | None:
    """How many events the step being traced has recorded (None outside a trace): a note
    taken now names the storages allocated before it, not a later one at a reused key."""
    return len(_ACTIVE[-1].events) if _ACTIVE else None


# torch.autograd.Function.apply's code: while it is on the stack, a custom Function's
# forward runs, with grad mode off inside it.
_FUNCTION_APPLY = torch.autograd.Function.apply.__func__.__code__  # type: ignore[attr-defined]


def _in_function_forward() -> bool:
    """Whether this op runs inside a custom autograd Function's forward called on a
    tensor that requires grad (memprobe's own kernels, called from a step written
    without ``nn.Module``): that forward records the history the backward will use."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _FUNCTION_APPLY:
            return _records_history(frame.f_locals.get("args"), frame.f_locals.get("kwargs"))
        frame = frame.f_back
    return False


def _records_history(args: Any, kwargs: Any) -> bool:
    return any(t.requires_grad for t in tensors_in((args, kwargs or {})))


def step_failed(
    exc: Exception, tracker: StepTracker, device: str, hint: str | None = None
) -> UserError:
    """The one-line error for a step that raised: the op that raised when the tracker saw
    it, and on meta why meta may be the cause and what to do (``hint``: what to do, on
    any device, where the step is not the user's, e.g. a model built from a config)."""
    if isinstance(exc, UserError):
        return exc
    from memprobe.kernels.user_dispatch import OpsReplaced
    from memprobe.kernels.user_memprobe import MemprobeChanged
    from memprobe.kernels.user_torch import ModesRemoved
    from memprobe.measure.step import BadResult, UnseenResult

    # What the step did to memprobe (its modes, its modules, torch's operators): no meta
    # hint helps ("meta tensors hold no values ... try --device cpu" said of a changed one).
    if isinstance(exc, (ModesRemoved, MemprobeChanged, OpsReplaced)):
        return UserError(f"the step failed: {exc}")

    # The kernel's fault, not meta's nor the config's: --device cpu would not help.
    if isinstance(exc, (BadResult, UnseenResult)):
        return UserError(f"the step's log-prob kernel failed: {exc}")
    what = exception_text(exc)
    raised_by_op = tracker.failure is not None and _caused_by(exc, tracker.failure)
    where = f"at {tracker.failed_op}" if raised_by_op else f"in its {tracker.phase} phase"
    if isinstance(exc, RecursionError):
        # No value meta lacks: a step that lowered its recursion limit to a few frames
        # above its own depth (sys.setrecursionlimit(depth + 20)) passes without memprobe,
        # whose tracker runs Python for every op (deeper on meta); the line blamed meta
        # tensors' missing values, .item() and ops without a meta kernel.
        return UserError(
            f"the step failed on {device} {where} ({what})",
            "memprobe's tracker runs Python code for each op, frames deeper than the step's "
            "own: raise a recursion limit the step lowers (sys.setrecursionlimit), or end "
            "its recursion",
        )
    if _asked_for_cuda(exc):
        # `.cuda()`, `.to("cuda")` or `device="cuda"` in the step itself, on a machine
        # without CUDA: "meta tensors hold no values ... try --device cpu" sent the user to
        # a device where the same call fails the same way.
        return UserError(
            f"the step failed on {device} {where}: it asks for CUDA itself ({what}) and "
            "this machine has none",
            "build the model and inputs on the device memprobe gives the step "
            "(model.to(device), torch.zeros(..., device=device)), not on 'cuda', and keep "
            "torch.cuda's own calls (synchronize, memory statistics) out of it",
        )
    own = _PYTHON_ERRORS + (_STEP_RAISES if hint is None else ())
    if not raised_by_op and isinstance(exc, own):
        # A bug of the step's own Python (a name, a key, sys.argv[1] read of a command
        # line it does not get): no op raised it, and "meta tensors hold no values ...
        # try --device cpu" sent the user to a device where it fails the same way.
        return UserError(
            f"the step failed on {device} {where} ({what}), in its own Python code, not in an op",
            "fix the step and rerun; memprobe calls it with no command-line arguments, "
            "sys.argv holding the program name alone",
        )
    if device == "meta" and hint is not None and _reads_values(tracker, raised_by_op, what):
        # A config's step (hint given) that read a tensor's values: the config was whole
        # (BLT's entropy patching, JetMoE's expert sizes as a list), its sizes not to blame.
        hint = (
            "this architecture reads its tensors' values during the step (data-dependent "
            "routing or shapes), which meta tensors do not hold: memprobe step cannot "
            "simulate it"
        )
    if device == "meta":
        return UserError(
            f"the step failed on meta {where} ({what})",
            hint
            or "meta tensors hold no values: data-dependent shapes, .item() and ops "
            "without a meta kernel cannot run there; try --device cpu at a smaller size",
        )
    return UserError(
        f"the step failed on {device} {where} ({what})", hint or "fix the step and rerun"
    )


# Errors of plain Python code that no tensor, meta or not, makes.
_PYTHON_ERRORS = (NameError, KeyError, IndexError, ZeroDivisionError, ImportError, OSError)
# What a user's own step raises itself (`raise ValueError("bad batch")`, a failed `assert`,
# a wrong call): raised by no op, it fails the same on any device, and "meta tensors hold
# no values ... try --device cpu" sent the user there. Only for the user's step (no hint):
# a config's step raises these from transformers' code, which is not the user's to fix.
_STEP_RAISES = (ValueError, AssertionError, TypeError, AttributeError)


# What torch raises where CUDA is asked for and cannot start: a CPU-only build, a CUDA
# build with no driver or no device (torch.cuda's functions, .cuda(), device="cuda").
_NO_CUDA = (
    "Torch not compiled with CUDA enabled",
    "Found no NVIDIA driver",
    "No CUDA GPUs are available",
    "CUDA driver initialization failed",
)


def _asked_for_cuda(exc: BaseException) -> bool:
    if torch.cuda.is_available():
        return False
    if isinstance(exc, AttributeError):
        # torch.cuda's memory statistics on a CPU-only build reach for torch._C's CUDA
        # functions, which that build lacks (torch.cuda.reset_peak_memory_stats()).
        return "torch._C' has no attribute '_cuda" in str(exc)
    text = str(exc) if isinstance(exc, (AssertionError, RuntimeError)) else ""
    return any(words in text for words in _NO_CUDA)


# The ops a value read reaches on meta: .item(), bool(), .tolist() (_local_scalar_dense);
# .cpu() or .numpy() (_to_copy, which raises "Cannot copy out of meta tensor").
_VALUE_READS = ("aten._local_scalar_dense.default",)


def _reads_values(tracker: StepTracker, raised_by_op: bool, what: str) -> bool:
    return (raised_by_op and tracker.failed_op in _VALUE_READS) or (
        "Cannot copy out of meta tensor" in what
    )


def _caused_by(exc: BaseException, cause: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if current is cause:
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
