"""Measurement backends behind one interface: ``measure(case) -> Run``.

* ``meta`` — exact simulation with meta tensors (any size, no real memory, no times);
* ``cpu``  — real tensors, tracker peak and wall times, skipped when it would not fit;
* ``cuda`` — real allocator statistics, CUDA-event times and allocator history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memprobe.errors import UserError
from memprobe.records import DEVICE_CHOICES, Case, Run

if TYPE_CHECKING:
    from memprobe.measure.parallel import RankLayout


def resolve_device(device: str) -> str:
    """``auto`` means cuda when available, else meta. Unknown names are a user error."""
    if device not in DEVICE_CHOICES:
        raise UserError(f"unknown device {device!r}", f"use one of: {', '.join(DEVICE_CHOICES)}")
    if device == "auto":
        import torch  # here: the package itself is torch-free (measure.torchrun_env)

        return "cuda" if torch.cuda.is_available() else "meta"
    if device == "cuda":
        from memprobe.measure.cuda_backend import require_cuda

        require_cuda()
    return device


def measure(case: Case, *, layout: RankLayout | None = None) -> Run:
    """Measure one case on ``case.device`` (meta, cpu or cuda). ``layout`` is this
    process's place in a torchrun job (None: one process; meta never has one)."""
    from memprobe.kernels import KernelUnavailable
    from memprobe.kernels.peers import unavailable_reason
    from memprobe.measure.loops import too_long_to_simulate
    from memprobe.measure.protocol import protocol_for

    protocol = protocol_for(case.kernel)
    why = protocol.unfit(case) or too_long_to_simulate(case)
    if why is not None:
        return Run(case, "skipped", note=why)
    # A GPU peer (Liger-Kernel, Cut Cross-Entropy) off CUDA or not installed: a row
    # that says so, not a missing one.
    why = unavailable_reason(case.kernel, case.device)
    if why is not None:
        return Run(case, "skipped", floor_bytes=protocol.floor_bytes(case), note=why)
    try:
        return _measure_on_device(case, layout)
    except KernelUnavailable as exc:  # e.g. a torch without linear_cross_entropy
        return Run(case, "skipped", floor_bytes=protocol.floor_bytes(case), note=str(exc))


def _measure_on_device(case: Case, layout: RankLayout | None) -> Run:
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
