"""The splice: a snapshot's loss step replaced by a simulated kernel's blocks.

The step's own bookkeeping is kept: blocks the recorded step freed inside the cut
(the gradient of the kernel's output) are freed where KERNEL's backward lets go of
its incoming gradient; the kernel's output, freed by the user's code after the cut,
is freed where the recorded output was; the logits' gradient, where the recorded one
was. Everything outside the cut stays as recorded.
"""

from __future__ import annotations

import bisect
import copy
from dataclasses import replace
from typing import Any

from memprobe.allocator.snapshot_format import (
    ALLOC,
    BLOCK_ACTIONS,
    FREE_COMPLETED,
    FREE_REQUESTED,
    FREES,
    INACTIVE,
)
from memprobe.attribute.kernel_trace import KernelTrace
from memprobe.attribute.loss_step_record import LossStep
from memprobe.records import Event
from memprobe.snapshot.labels import format_label
from memprobe.snapshot.replay import ReplayBlock
from memprobe.snapshot.synthesize import frames_to_dicts

# Spliced blocks get addresses far above any device's, so they never collide.
SPLICE_ADDRESS = 1 << 60


def splice(snap: dict[str, Any], dev: int, step: LossStep, kt: KernelTrace) -> dict[str, Any]:
    """The snapshot with the step's blocks replaced by the kernel's (see module notes)."""
    entries = snap["device_traces"][dev]
    (fs, fe), (bs, be) = step.forward, step.backward
    cut_pos: set[int] = set()
    by_addr: dict[int, list[int]] = {}
    for pos, e in enumerate(entries):
        if e["action"] in BLOCK_ACTIONS:
            by_addr.setdefault(e["addr"], []).append(pos)
    for b in step.cut:
        positions = by_addr[b.addr]
        i = bisect.bisect_left(positions, b.alloc_pos)
        cut_pos.add(b.alloc_pos)
        for pos in positions[i + 1 :]:
            if entries[pos]["action"] == ALLOC:
                break
            cut_pos.add(pos)

    # The logits, when only the loss held them, live as long as the kernel holds them.
    logits_entries: list[dict[str, Any]] = []
    logits_at: tuple[str, int] | None = None
    la, lf = step.logits.alloc_pos, step.logits.free_pos
    # Freed inside the step, or as its backward ended (nothing allocated in between: the
    # recorded kernel's saved tensors going), the logits were the loss's alone. Unless
    # their gradient went first: the loss lets go of what it saved as its backward
    # returns, before that gradient is consumed, so logits outliving their gradient were
    # held by the caller (a harness holding its inputs, as memprobe's sweep does).
    gf = step.gradient.free_pos
    held_by_loss = lf is not None and (
        lf <= be
        or not (
            (gf is not None and gf < lf)
            or any(entries[pos]["action"] == ALLOC for pos in range(be + 1, lf))
        )
    )
    if lf is not None and held_by_loss:
        where, k = kt.logits_release
        at = {"forward": fe, "backward": be}.get(where, step.gradient.free_pos)
        if at is None or at >= lf or lf > be:
            positions = by_addr[step.logits.addr]
            for pos in positions[bisect.bisect_right(positions, la) :]:
                if entries[pos]["action"] == ALLOC:
                    break
                cut_pos.add(pos)
                logits_entries.append(entries[pos])
            if where != "after":
                logits_at = (where, k)
            elif at is not None:
                logits_at = ("at", at)
            else:
                logits_entries = []  # the gradient (the logits' buffer) lives to the end

    def escapes(lo: int, hi: int) -> list[ReplayBlock]:
        return sorted(
            (
                b
                for b in step.cut
                if lo <= b.alloc_pos <= hi and (b.free_pos is None or not step.inside(b.free_pos))
            ),
            key=lambda b: b.alloc_pos,
        )

    # The kernel's blocks that outlive it are freed where the recorded ones were: its
    # gradient where the logits' gradient was, an output where the recorded block of its
    # size was (else the one freed last: what the user's code held); with no recorded
    # counterpart at all, at the end of the kernel's backward.
    frees_at: dict[int, list[Event]] = {}
    after_backward: list[Event] = []
    for outliving, theirs in (
        (kt.forward_escapes, escapes(fs, fe)),
        (kt.backward_escapes, escapes(bs, be)),
    ):
        unused = list(theirs)
        for made in outliving:
            e = replace(made, action="free")
            if outliving is kt.backward_escapes and made.nbytes == step.gradient.size:
                match: ReplayBlock | None = step.gradient
            else:
                same = [b for b in unused if b.size == made.nbytes]
                match = same[0] if same else _last_freed(theirs)
            if match is None:
                after_backward.append(e)
                continue
            if match in unused:
                unused.remove(match)
            if match.free_pos is not None:  # else alive at the end, as the recorded one was
                frees_at.setdefault(match.free_pos, []).append(e)

    template = step.cut[0].alloc_entry or {}
    stream = int(template.get("stream", 0))
    addresses: dict[int, int] = {}  # storage -> address, while live
    count = [0]
    out: list[dict[str, Any]] = []
    last_time: list[Any] = [None]

    # One frames list per distinct stack, shared by the entries made at it (as pickle
    # shares a real trace's): the stack is then read once, not once per entry (a step
    # 120,000 frames deep took minutes).
    stacks: dict[tuple[Any, int], list[Any]] = {}

    def stack(frames: Any, base_frames: list[Any]) -> list[Any]:
        key = (frames, id(base_frames))
        if key not in stacks:
            stacks[key] = frames_to_dicts(frames) + list(base_frames)
        return stacks[key]

    def emit(e: Event, base_frames: list[Any], phase: str) -> None:
        if e.action == "alloc":
            addr = addresses[e.storage] = SPLICE_ADDRESS + 512 * count[0]
            count[0] += 1
            actions: tuple[str, ...] = (ALLOC,)
        else:
            addr = addresses.pop(e.storage)
            actions = (FREE_REQUESTED, FREE_COMPLETED)
        for action in actions:
            entry = {
                "action": action,
                "addr": addr,
                "size": e.nbytes,
                "stream": stream,
                "frames": stack(e.frames, base_frames),
                "user_metadata": format_label(phase=phase, op=e.op, dtype=e.dtype, shape=e.shape),
            }
            if last_time[0] is not None:
                entry["time_us"] = last_time[0]
            out.append(entry)

    fwd_frames = (entries[fs].get("frames") or []) if fs < len(entries) else []
    bwd_frames = (entries[bs].get("frames") or []) if bs < len(entries) else []
    held_fwd: list[dict[str, Any]] = []
    held_bwd: list[dict[str, Any]] = []
    for pos, e in enumerate(entries):
        if "time_us" in e:
            last_time[0] = e["time_us"]
        for ev in frees_at.pop(pos, ()):
            emit(ev, fwd_frames, "backward")
        if logits_at == ("at", pos):
            out.extend(logits_entries)
        if pos not in cut_pos:
            keep_free = e["action"] in FREES
            if keep_free and fs <= pos <= fe:
                held_fwd.append(e)
            elif keep_free and bs <= pos <= be:
                held_bwd.append(e)
            else:
                out.append(e)
        if pos == fe:
            for k, ev in enumerate(kt.forward):
                if logits_at == ("forward", k):
                    out.extend(logits_entries)
                emit(ev, fwd_frames, "forward")
            if logits_at == ("forward", len(kt.forward)):
                out.extend(logits_entries)
            out.extend(held_fwd)
        if pos == be:
            for k, ev in enumerate(kt.backward):
                if k == kt.release_at:
                    out.extend(held_bwd)
                    held_bwd = []
                if logits_at == ("backward", k):
                    out.extend(logits_entries)
                emit(ev, bwd_frames, "backward")
            out.extend(held_bwd)
            if logits_at == ("backward", len(kt.backward)):
                out.extend(logits_entries)
            for ev in after_backward:
                emit(ev, bwd_frames, "backward")

    # Cut blocks still live at snapshot time are gone from the final segments too.
    gone = {b.addr for b in step.cut if b.free_pos is None}
    segments = copy.deepcopy(snap["segments"])
    for seg in segments:
        if seg.get("device", 0) != dev:
            continue
        for block in seg["blocks"]:
            if block["address"] in gone:
                block["state"] = INACTIVE
    traces = list(snap["device_traces"])
    traces[dev] = out
    return {**snap, "segments": segments, "device_traces": traces}


def _last_freed(blocks: list[ReplayBlock]) -> ReplayBlock | None:
    if not blocks:
        return None
    return max(blocks, key=lambda b: (b.free_pos is None, b.free_pos or 0))
