"""One kernel's allocation trace, in the shape the report draws: blocks with lifetimes.

Two sources feed it: the tracker's events from a meta/cpu simulation, and a CUDA
allocator snapshot (memprobe's own per-case file, or a real one). Both become a
:class:`Trace`: every block with the trace position where it was allocated and
freed, plus the phase at each position, so the plots never care where it came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from memprobe.records import Event
from memprobe.snapshot.labels import parse_label, parse_shape


@dataclass(frozen=True)
class Block:
    """One allocation: where in the trace it lived and what it was (when known)."""

    start: int  # trace position of the allocation
    end: int | None  # trace position of the free; None when still live at the end
    nbytes: int
    dtype: str | None  # "torch.float32"; None when the source does not say
    shape: tuple[int, ...] | None
    op: str
    phase: str  # "setup" | "forward" | "backward" | "" (unknown)

    def live_at(self, pos: int) -> bool:
        return self.start <= pos and (self.end is None or pos < self.end)


@dataclass(frozen=True)
class Trace:
    """A kernel's blocks over ``length`` trace positions, and where the peak is."""

    blocks: tuple[Block, ...]
    phases: tuple[str, ...]  # the phase at each position ("" when unknown)
    source: str  # "snapshot" or "simulation": said on the page

    @property
    def length(self) -> int:
        return len(self.phases)

    def live_bytes(self) -> np.ndarray:
        """Live bytes just after each position."""
        delta = np.zeros(self.length + 1, dtype=np.int64)
        for b in self.blocks:
            delta[b.start] += b.nbytes
            if b.end is not None:
                delta[b.end] -= b.nbytes
        return np.cumsum(delta[: self.length])

    @property
    def peak_pos(self) -> int:
        live = self.live_bytes()
        return int(np.argmax(live)) if len(live) else 0

    @property
    def peak_bytes(self) -> int:
        live = self.live_bytes()
        return int(live.max()) if len(live) else 0

    def live_at_peak(self) -> list[Block]:
        pos = self.peak_pos
        return sorted((b for b in self.blocks if b.live_at(pos)), key=lambda b: -b.nbytes)

    def phase_spans(self) -> list[tuple[str, int, int]]:
        """Contiguous ``(phase, first, last + 1)`` runs, for shading."""
        spans: list[tuple[str, int, int]] = []
        for pos, phase in enumerate(self.phases):
            if spans and spans[-1][0] == phase:
                spans[-1] = (phase, spans[-1][1], pos + 1)
            else:
                spans.append((phase, pos, pos + 1))
        return spans


def from_events(events: Sequence[Event]) -> Trace:
    """The tracker's alloc/free events (positions are the event indices)."""
    open_blocks: dict[int, Event] = {}
    blocks: list[Block] = []
    for pos, e in enumerate(events):
        if e.action == "alloc":
            open_blocks[e.storage] = e
            continue
        alloc = open_blocks.pop(e.storage, None)
        if alloc is not None:
            blocks.append(_block(alloc.index, pos, alloc))
    blocks.extend(_block(a.index, None, a) for a in open_blocks.values())
    blocks.sort(key=lambda b: b.start)
    return Trace(tuple(blocks), tuple(e.phase for e in events), "simulation")


def _block(start: int, end: int | None, e: Event) -> Block:
    return Block(start, end, e.nbytes, e.dtype, tuple(e.shape), e.op, e.phase)


def from_snapshot(snapshot: dict[str, Any]) -> Trace:
    """The busiest device trace of a (normalised) snapshot.

    Allocated bytes drop when a free *completes*; a trace without any
    ``free_completed`` (some recorders) is read with ``free_requested`` instead.
    A block freed but never seen allocated (a ring buffer dropped its alloc) was
    live since before the trace began: it counts from position 0.

    Where memprobe labelled the step's phases (a cuda run labels forward and
    backward), the trace starts at the first labelled entry: making the inputs
    (a float32 ``randn`` cast to the logits' dtype) is not the step, and its
    temporary must not pass for the step's peak. What the inputs left live is
    kept as :data:`BEFORE_STEP` blocks from position 0.
    """
    traces = [t for t in snapshot.get("device_traces") or [] if t]
    entries: list[dict[str, Any]] = max(traces, key=len) if traces else []
    has_completed = any(e.get("action") == "free_completed" for e in entries)
    free_action = "free_completed" if has_completed else "free_requested"
    kept = [e for e in entries if e.get("action") in ("alloc", free_action)]
    labels = [parse_label(e.get("user_metadata")) for e in kept]
    first = next((i for i, lab in enumerate(labels) if lab.get("phase")), 0)
    open_blocks: dict[int, tuple[int, dict[str, Any], dict[str, str]]] = {}
    blocks: list[Block] = []
    phases: list[str] = []
    phase = ""
    for pos, (e, label) in enumerate(zip(kept, labels, strict=True)):
        phase = label.get("phase", phase)
        phases.append(phase)
        if e["action"] == "alloc":
            open_blocks[e["addr"]] = (pos, e, label)
            continue
        start, alloc, alloc_label = open_blocks.pop(e["addr"], (0, e, label))
        blocks.append(_snapshot_block(start, pos, alloc, alloc_label))
    blocks.extend(_snapshot_block(s, None, a, lab) for s, a, lab in open_blocks.values())
    step = [_from_step_start(b, first) for b in blocks if b.end is None or b.end > first]
    step.sort(key=lambda b: b.start)
    return Trace(tuple(step), tuple(phases[first:]), "snapshot")


BEFORE_STEP = "before the step"


def _from_step_start(block: Block, first: int) -> Block:
    """Shift a block to positions counted from the step's first entry."""
    end = None if block.end is None else block.end - first
    if block.start >= first:
        return replace(block, start=block.start - first, end=end)
    labelled = block.op.startswith("input") or block.phase
    return replace(block, start=0, end=end, op=block.op if labelled else BEFORE_STEP)


def _snapshot_block(start: int, end: int | None, e: dict[str, Any], label: dict[str, str]) -> Block:
    op = label.get("op") or _first_frame_name(e.get("frames") or [])
    return Block(
        start=start,
        end=end,
        nbytes=int(e.get("size", 0)),
        dtype=label.get("dtype"),
        shape=parse_shape(label.get("shape")),
        op=op.replace("_", " ", 1) if op.startswith("input:_") else op,
        phase=label.get("phase", ""),
    )


def _first_frame_name(frames: Iterable[Any]) -> str:
    for f in frames:
        if isinstance(f, dict) and f.get("name"):
            return str(f["name"])
    return "?"
