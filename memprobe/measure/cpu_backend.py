"""Real tensors on the CPU: tracker peak and median wall times.

Every case is simulated on meta first; one that would not fit in a safe
share of the available RAM is skipped with the reason, rather than taking
the machine down.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from memprobe.io.sizes import format_bytes
from memprobe.measure.cpu_limits import REPEATS, SAFE_RAM_SHARE, available_ram_bytes
from memprobe.measure.garbage import garbage_collected_after
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.measure.parallel import RankLayout
from memprobe.measure.protocol import floor_bytes, protocol_for
from memprobe.measure.step import process_group_for
from memprobe.measure.traced import run_from_trace, traced_step
from memprobe.records import Case, Run


def cpu_bytes_needed(case: Case) -> int:
    """Simulated step peak (the inputs are drawn in their own dtype, with no staging copy).

    A kernel seen keeping memory between calls is simulated in a fresh process: called
    on meta here, it replaced what its last CPU call kept (a cache per call) with a meta
    tensor, and the next case held nothing of it (see :func:`measure_cpu`)."""
    from memprobe.measure import fresh

    if fresh.keeps(case.kernel) and fresh.available():
        return fresh.run(_needed, case, "allocated", None)
    return _needed(case, "allocated", None)


def _needed(case: Case, kind: str, alloc_conf: str | None) -> int:
    return simulate_tracker(case, capture_frames=False).peak_bytes


def measure_cpu(
    case: Case,
    *,
    repeats: int = REPEATS,
    ram_bytes: int | None = None,
    layout: RankLayout | None = None,
) -> Run:
    need = cpu_bytes_needed(case)
    budget = int(SAFE_RAM_SHARE * (available_ram_bytes() if ram_bytes is None else ram_bytes))
    if need > budget:
        return Run(
            case=case,
            status="skipped",
            floor_bytes=floor_bytes(case),
            note=(
                f"needs {format_bytes(need)} (simulated), over the safe share "
                f"{format_bytes(budget)} of available RAM; simulate it with --device meta"
            ),
        )
    with garbage_collected_after(), process_group_for(case):
        inputs = protocol_for(case.kernel).make_inputs(case, "cpu", layout=layout)
        trace = traced_step(case, inputs, layout=layout)
        fwd_times, bwd_times = timed_steps(case, inputs, repeats, layout)
        if trace.kept or trace.held:
            # A kernel that keeps memory (a cache replaced per call): the timed calls ran
            # untracked, so what the last one kept the next case never adopted, and its
            # peak left out what the note said it counted (1 MiB kept read as unchunked's
            # peak plus this case's 1 MiB). One more tracked step is the last call.
            from memprobe.measure import fresh

            fresh.saw_keeping(case.kernel)
            traced_step(case, inputs, layout=layout)
        del inputs
    return run_from_trace(
        case,
        trace,
        fwd_time_s=statistics.median(fwd_times),
        bwd_time_s=statistics.median(bwd_times),
    )


def timed_steps(
    case: Case, inputs: Any, repeats: int, layout: RankLayout | None = None
) -> tuple[list[float], list[float]]:
    """Wall times of forward and backward, untracked (the tracker would slow them)."""
    protocol = protocol_for(case.kernel)
    call = protocol.forward(case, layout=layout)
    backward = protocol.backward_of(case)
    fwd: list[float] = []
    bwd: list[float] = []
    for _ in range(repeats):
        # An in-place kernel leaves gradient values in the logits: finite
        # numbers, as good as any for timing, and no second copy is needed.
        t0 = time.perf_counter()
        out = call(inputs)
        t1 = time.perf_counter()
        backward(out, inputs)
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        del out
    return fwd, bwd
