"""A whole training step (a user's callable) on meta, cpu or cuda → a CUDA-format snapshot.

The library API, small on purpose:

- :func:`profile_step` ``(step, device="meta", *, capture_frames=True, alloc_conf=None,
  name=None) -> dict``: the snapshot dict ``torch.cuda.memory._snapshot()`` would give
  for one run of ``step``; write it with :func:`memprobe.snapshot.write.write_snapshot`.
- :func:`trace_step` ``(step, device="meta", *, capture_frames=True) -> TrackedStep``:
  the tracker's exact events and peak (meta or cpu), before the allocator model.
- :func:`load_step` ``("pkg.mod:fn") -> Step``: import a step by path, with the rules
  and errors of ``--kernel pkg.mod:fn``.

A step is ``step(device: torch.device) -> Any``: it builds its model and inputs on
``device`` and runs forward, loss, backward and optionally an optimizer step. Phases
(setup, forward, backward, optimizer) are read from module, autograd and optimizer
hooks. Every failure is a :class:`memprobe.errors.UserError` (one line, a hint).
"""

from memprobe.profile.load import Step, load_step
from memprobe.profile.run import PROFILE_DEVICES, TrackedStep, profile_step, trace_step

__all__ = ["PROFILE_DEVICES", "Step", "TrackedStep", "load_step", "profile_step", "trace_step"]
