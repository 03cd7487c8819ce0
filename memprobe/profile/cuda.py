"""A step on a real GPU: torch's own allocator history, labelled with memprobe's phases.

The snapshot is the one ``torch.cuda.memory._dump_snapshot`` would write. memprobe adds
only each allocation's phase, through torch's per-entry ``user_metadata`` (thread-local
in torch, so it is set on whichever thread dispatches: the autograd engine runs backward
on its own threads).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from memprobe.kernels.user import UserCodeExit, user_code
from memprobe.measure.cuda_backend import require_cuda
from memprobe.profile.load import Step, check_returned, step_exited
from memprobe.profile.phases import StepTracker, step_failed
from memprobe.snapshot.labels import format_label

HISTORY_ENTRIES = 1_000_000


class _PhaseLabels(StepTracker):
    """Follows the phases as :class:`StepTracker` does, but records nothing itself: it
    labels the allocations torch's history records."""

    skip_files = frozenset({__file__, *StepTracker.skip_files})

    def __init__(self) -> None:
        super().__init__(capture_frames=False, device="cuda")
        self._thread = threading.local()
        self._set = getattr(torch.cuda.memory, "_set_memory_metadata", None)

    def _register(self, tensor: torch.Tensor, op: str, frames: Any) -> None:
        return None

    def follow_phase(self, args: Any, kwargs: Any) -> None:
        super().follow_phase(args, kwargs)
        self.label()

    def label(self) -> None:
        """Label this thread's next allocations with the phase, when it changed here."""
        if self._set is not None and getattr(self._thread, "phase", None) != self.phase:
            self._thread.phase = self.phase
            self._set(format_label(phase=self.phase))


def record_cuda_step(step: Step) -> dict[str, Any]:
    """Run ``step(cuda device)`` with torch's allocator history on; return its snapshot."""
    require_cuda()
    labels = _PhaseLabels()
    labels.install_hooks()
    try:
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
        try:
            with labels, user_code("the step"):
                result = step(torch.device("cuda", torch.cuda.current_device()))
            check_returned(result)
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError:
            pass  # the trace ends with the failed request: what attribution reads
        except UserCodeExit as exc:
            raise step_exited(exc) from None
        except Exception as exc:
            raise step_failed(exc, labels, "cuda") from None
        snapshot: dict[str, Any] = torch.cuda.memory._snapshot()
    finally:
        labels.remove_hooks()
        torch.cuda.memory._record_memory_history(enabled=None)
        if labels._set is not None:
            labels._set("")
    return snapshot
