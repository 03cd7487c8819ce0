"""A kernel's blocks over the step, from the one block-lifetime replay of its snapshot.

:func:`memprobe.snapshot.replay.replay` decides when each block lives (alloc to the
completed free, ring-buffer and pending-free rules included); this module only keeps
the positions where live bytes change, reads memprobe's labels (dtype, shape, op,
phase) off each block's allocation, and starts the window where the step starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from memprobe.snapshot.labels import op_words, parse_label, parse_shape
from memprobe.snapshot.replay import BEFORE_TRACE, ReplayBlock, replay


@dataclass(frozen=True)
class Block:
    """One allocation: where in the step it lived and what it was (when known)."""

    start: int  # position of the allocation (0: live when the step began)
    end: int | None  # position of the free; None when still live at the end
    nbytes: int
    dtype: str | None  # "torch.float32"; None when the source does not say
    shape: tuple[int, ...] | None
    op: str
    phase: str  # "setup" | "forward" | "backward" | "" (unknown)
    source: ReplayBlock  # the replay's block: its lifetime in trace entries


@dataclass(frozen=True)
class Trace:
    """A kernel's blocks over ``length`` positions, and where the peak is."""

    blocks: tuple[Block, ...]
    phases: tuple[str, ...]  # the phase at each position ("" when unknown)
    entries: tuple[int, ...]  # the trace entry each position stands for
    source: str  # "snapshot": said on the page

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
        """The blocks the replay has live at the peak's trace entry, largest first."""
        if not self.entries:
            return []
        entry = self.entries[self.peak_pos]
        return sorted((b for b in self.blocks if b.source.live_at(entry)), key=lambda b: -b.nbytes)

    def phase_spans(self) -> list[tuple[str, int, int]]:
        """Contiguous ``(phase, first, last + 1)`` runs, for shading."""
        spans: list[tuple[str, int, int]] = []
        for pos, phase in enumerate(self.phases):
            if spans and spans[-1][0] == phase:
                spans[-1] = (phase, spans[-1][1], pos + 1)
            else:
                spans.append((phase, pos, pos + 1))
        return spans


BEFORE_STEP = "before the step"


def from_snapshot(snapshot: dict[str, Any]) -> Trace:
    """The busiest device of a (normalised) snapshot, replayed.

    Positions are the trace entries where a block is allocated or freed. Where
    memprobe labelled the step's phases (a cuda run labels forward and backward), the
    window starts at the first labelled one: making the inputs (a float32 ``randn``
    cast to the logits' dtype) is not the step, and its temporary must not pass for
    the step's peak. What the inputs left live is kept as :data:`BEFORE_STEP` blocks
    from position 0.
    """
    rep = replay(snapshot)
    changes = sorted(
        {b.alloc_pos for b in rep.blocks if b.alloc_pos != BEFORE_TRACE}
        | {b.free_pos for b in rep.blocks if b.free_pos is not None}
    )
    at = {entry: pos for pos, entry in enumerate(changes)}
    labels = [parse_label(rep.entries[entry].get("user_metadata")) for entry in changes]
    first = next((i for i, lab in enumerate(labels) if lab.get("phase")), 0)
    phases: list[str] = []
    phase = ""
    for label in labels:
        phase = label.get("phase", phase)
        phases.append(phase)
    blocks = []
    for rb in rep.blocks:
        end = None if rb.free_pos is None else at[rb.free_pos]
        if end is not None and end <= first:
            continue  # freed before the step began
        start = 0 if rb.alloc_pos == BEFORE_TRACE else at[rb.alloc_pos]
        blocks.append(_from_step_start(_block(rb, start, end), first))
    blocks.sort(key=lambda b: b.start)
    return Trace(tuple(blocks), tuple(phases[first:]), tuple(changes[first:]), "snapshot")


def _from_step_start(block: Block, first: int) -> Block:
    """Shift a block to positions counted from the step's first entry."""
    end = None if block.end is None else block.end - first
    if block.start >= first and block.source.alloc_pos != BEFORE_TRACE:
        return replace(block, start=block.start - first, end=end)
    labelled = block.op.startswith("input") or block.phase
    return replace(block, start=0, end=end, op=block.op if labelled else BEFORE_STEP)


def _block(rb: ReplayBlock, start: int, end: int | None) -> Block:
    entry = rb.alloc_entry or rb.free_entry or {}
    label = parse_label(entry.get("user_metadata"))
    op = label.get("op") or _first_frame_name(entry.get("frames") or [])
    return Block(
        start=start,
        end=end,
        nbytes=rb.size,
        dtype=label.get("dtype"),
        shape=parse_shape(label.get("shape")),
        op=op_words(op),
        phase=label.get("phase", ""),
        source=rb,
    )


def _first_frame_name(frames: Iterable[Any]) -> str:
    for f in frames:
        name = f.get("name") if isinstance(f, dict) else None
        if isinstance(name, str) and name:  # str() of an int past 4,300 digits raises
            return name
    return "?"
