"""Run a user's training step under memprobe's tracker and write what torch would have.

A *step* is a callable ``step(device: torch.device)`` that builds its model and inputs
on the device it is given and runs forward, the loss, backward and (optionally) an
optimizer step. On ``meta`` nothing real is allocated, so any size runs anywhere; on
``cpu`` the tensors are real (keep them small); on ``cuda`` torch's own allocator
history is recorded instead of memprobe's tracker.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from memprobe.allocator import AllocConf
from memprobe.errors import UserError
from memprobe.kernels.user import UserCodeExit, user_code
from memprobe.measure.garbage import garbage_collected_after
from memprobe.measure.memo import trace_memo
from memprobe.measure.tracker import autocast_not_applied, cuda_autocast_off, threads_started
from memprobe.profile.attention import sdpa_on_meta
from memprobe.profile.load import Step, check_returned, step_exited
from memprobe.profile.phases import StepTracker, step_failed
from memprobe.records import Event
from memprobe.snapshot.synthesize import synthesize_snapshot

PROFILE_DEVICES = ("meta", "cpu", "cuda")


@dataclass(frozen=True)
class TrackedStep:
    """The tracker's record of one step: every storage allocated and freed on the device.

    ``peak_bytes``: the most bytes of storage live at once (exact; no allocator
    rounding); ``peak_index``: the ``alloc`` event that reached it; ``phase_peaks``: the
    most live in each phase.
    """

    device: str
    events: tuple[Event, ...]
    peak_bytes: int
    peak_index: int
    phase_peaks: dict[str, int]
    # The attention kernels simulated on meta (kernel -> calls; see profile.attention).
    attention: dict[str, int] = field(default_factory=dict)
    # Moments the step marked (profile.phases.mark): (label, events recorded before it).
    marks: tuple[tuple[str, int], ...] = ()
    # Threads the step started: what they allocated is not in ``events`` (see _threads).
    threads: int = 0
    # torch.autocast("cuda") contexts the step made that torch turned off (no CUDA here).
    autocast_off: int = 0
    # Autocast contexts for another device type (torch.autocast("cpu") on meta): no cast ran.
    autocast_ignored: int = 0

    def live_at_peak(self) -> list[Event]:
        """Allocations live just after the peak's event, largest first."""
        live: dict[int, Event] = {}
        for event in self.events[: self.peak_index + 1]:
            if event.action == "alloc":
                live[event.storage] = event
            else:
                live.pop(event.storage, None)
        return sorted(live.values(), key=lambda e: e.nbytes, reverse=True)


@contextlib.contextmanager
def _fake_tensor_logs_off() -> Iterator[None]:
    """torch's fake tensors log an op that fails as a traceback on stderr (a sharded step
    of an MoE of 0 experts, at aten.histc): the failure is said once, as one line."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _named(device: str | torch.device) -> str:
    """A device as its name: a step that called trace_step with the ``torch.device`` it was
    given was told "trace_step runs on meta or cpu, not device(type='meta')"."""
    return str(device) if isinstance(device, torch.device) else device


def trace_step(
    step: Step,
    device: str | torch.device = "meta",
    *,
    capture_frames: bool = True,
    attention: str = "cpu",
    memo: bool = False,
    failure_hint: str | None = None,
    its_state: bool = True,
) -> TrackedStep:
    """Run ``step(torch.device(device))`` once under the tracker (``meta`` or ``cpu``).

    Phases (setup / forward / backward / optimizer) come from module, autograd and
    optimizer hooks (:mod:`memprobe.profile.phases`). Whatever the step returns is
    dropped before the trace ends, so its frees are recorded too. On meta,
    ``F.scaled_dot_product_attention`` runs the kernel the ``attention`` target would
    pick (:func:`memprobe.profile.attention.sdpa_on_meta`: ``cpu``, ``cuda`` or ``math``).

    ``memo``: on meta, answer repeated ops from memory where that is exact
    (:mod:`memprobe.measure.memo`): the same events, faster for a model whose layers
    repeat.

    ``its_state``: the step is the user's, and runs with what its modules left of torch
    as they were imported (False: memprobe's own step, a model built from a config, whose
    user kernel alone runs in its module's state).

    Raises :class:`UserError` when the step fails: on meta, one line naming the op that
    raised and suggesting ``--device cpu`` at a smaller size (or ``failure_hint``).
    """
    device = _named(device)
    if device not in ("meta", "cpu"):
        raise UserError(
            f"trace_step runs on meta or cpu, not {device!r}", "use profile_step for cuda"
        )
    remembered = trace_memo() if memo and device == "meta" else None
    tracker = StepTracker(capture_frames=capture_frames, device=device, memo=remembered)
    tracker.stop_code = _call.__code__
    tracker.install_hooks()
    # Fake tensors (a sharded step's fake world) hold no data either: routed like meta.
    from torch._guards import detect_fake_mode

    faked = detect_fake_mode() is not None
    simulated = device == "meta" or faked
    routing = sdpa_on_meta(attention) if simulated else contextlib.nullcontext(None)
    quiet = _fake_tensor_logs_off() if faked else contextlib.nullcontext()
    try:
        with (
            tracker,
            routing as chosen,
            threads_started() as started,
            quiet,
            cuda_autocast_off() as autocast_off,
            autocast_not_applied(device) as autocast_ignored,
        ):
            with garbage_collected_after():
                _call(step, torch.device(device), its_state)
    except Exception as exc:
        raise step_failed(exc, tracker, device, failure_hint) from None
    finally:
        tracker.remove_hooks()
    if not tracker.events:
        raise _nothing_tracked(device, tracker.elsewhere, started[0])
    return TrackedStep(
        device=device,
        events=tuple(tracker.events),
        peak_bytes=tracker.peak_bytes,
        peak_index=tracker.peak_index,
        phase_peaks=dict(tracker.phase_peaks),
        attention=dict(chosen or {}),
        marks=tuple(tracker.marks),
        threads=started[0],
        autocast_off=autocast_off[0],
        autocast_ignored=autocast_ignored[0],
    )


def _nothing_tracked(device: str, elsewhere: dict[str, int], threads: int) -> UserError:
    """No tensor made on the device the step was given: read as it stood, a peak of 0 B
    (exit 0), where the step made its tensors on another device (it ignored ``device``), in
    a thread of its own, or made none."""
    hint = (
        "a step builds its model and inputs on the device it is given "
        "(torch.zeros(..., device=device), model.to(device)) and runs forward, loss, backward"
    )
    if elsewhere:
        made = ", ".join(f"{count:,} on {kind}" for kind, count in sorted(elsewhere.items()))
        return UserError(
            f"the step made its tensors elsewhere ({made}), none on {device}, the device it "
            "was given: memprobe tracks that device",
            hint,
        )
    if threads:
        return UserError(
            f"the step made no tensor on {device} in the thread that runs it (it started "
            f"{threads:,} thread(s); what a thread allocates is not tracked)",
            "make the tensors in the step's own thread",
        )
    return UserError(f"the step made no tensor on {device}: there is no peak to show", hint)


def profile_step(
    step: Step,
    device: str | torch.device = "meta",
    *,
    capture_frames: bool = True,
    alloc_conf: AllocConf | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """The CUDA-format allocator snapshot of one run of ``step`` on ``device``.

    ``meta`` / ``cpu``: the tracked storages go through memprobe's model of the CUDA
    caching allocator (under ``alloc_conf``, the defaults when None), as
    :func:`memprobe.snapshot.synthesize.synthesize_snapshot` does: blocks at the
    addresses the allocator would give, segment events, final segments, Python frames,
    and each entry labelled with its phase, op, dtype and shape. ``cuda``: torch's own
    ``_record_memory_history`` around the step (fails loudly without CUDA).

    The dict is what ``torch.cuda.memory._snapshot()`` returns; write it with
    :func:`memprobe.snapshot.write.write_snapshot`, read it with
    :func:`memprobe.attribute.attribute`. ``name`` (the step's import path) is kept in
    the snapshot's ``memprobe`` record.
    """
    device = _named(device)
    if device not in PROFILE_DEVICES:
        raise UserError(f"unknown device {device!r}", f"use one of: {', '.join(PROFILE_DEVICES)}")
    if device == "cuda":
        from memprobe.profile.cuda import record_cuda_step

        snapshot = record_cuda_step(step)
    else:
        tracked = trace_step(step, device, capture_frames=capture_frames)
        clock = "simulation" if device == "meta" else "tracker"
        snapshot = synthesize_snapshot(tracked.events, conf=alloc_conf, clock=clock)
        snapshot["memprobe"]["device"] = device
        if tracked.threads:
            snapshot["memprobe"]["threads_started"] = tracked.threads
        if tracked.autocast_off:
            snapshot["memprobe"]["cuda_autocast_off"] = tracked.autocast_off
        if tracked.autocast_ignored:
            snapshot["memprobe"]["autocast_not_applied"] = tracked.autocast_ignored
    snapshot.setdefault("memprobe", {})["step"] = name
    return snapshot


def _call(step: Step, device: torch.device, its_state: bool = True) -> None:
    # Frames end below this one: the user's stack starts at their step.
    try:
        with user_code("the step", its_state=its_state):
            result = step(device)
    except UserCodeExit as exc:
        raise step_exited(exc) from None
    check_returned(result)
