"""Measurement backends behind one interface: ``measure(case) -> Run``.

* ``meta`` — exact simulation with meta tensors (any size, no real memory, no times);
* ``cpu``  — real tensors, tracker peak and wall times, skipped when it would not fit;
* ``cuda`` — real allocator statistics, CUDA-event times and allocator history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memprobe.errors import UserError
from memprobe.records import DEVICE_CHOICES, Case, Run

if TYPE_CHECKING:
    from memprobe.measure.parallel import RankLayout


def resolve_device(device: str) -> str:
    """``auto`` means cuda when available, else meta. Unknown names are a user error."""
    if device not in DEVICE_CHOICES:
        raise UserError(f"unknown device {device!r}", f"use one of: {', '.join(DEVICE_CHOICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "meta"
    if device == "cuda":
        from memprobe.measure.cuda_backend import require_cuda

        require_cuda()
    return device


def measure(case: Case, *, layout: RankLayout | None = None) -> Run:
    """Measure one case on ``case.device`` (meta, cpu or cuda). ``layout`` is this
    process's place in a torchrun job (None: one process; meta never has one)."""
    from memprobe.kernels import get_spec

    if get_spec(case.kernel).inputs == "hidden":
        from memprobe.measure.hidden_backend import measure_hidden

        return measure_hidden(case)
    if case.device == "meta":
        from memprobe.measure.meta_backend import measure_meta

        return measure_meta(case)
    if case.device == "cpu":
        from memprobe.measure.cpu_backend import measure_cpu

        return measure_cpu(case, layout=layout)
    if case.device == "cuda":
        from memprobe.measure.cuda_backend import measure_cuda

        return measure_cuda(case, layout=layout)
    raise UserError(f"unknown device {case.device!r}", "use meta, cpu or cuda")


__all__ = ["measure", "resolve_device"]
