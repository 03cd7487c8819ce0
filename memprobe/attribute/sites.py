"""Where each allocation came from: its op, autograd node, phase, the user's line.

A *site* is what one stack of frames says. Sites are cached per frames object: a
trace of a million entries repeats a few thousand stacks, and pickle keeps repeated
lists shared, so each distinct stack is read once.

Phases come from the frames when they say (autograd's backward, torch.optim), and
from the neighbours when they do not: allocations without frames are made on the
autograd engine's thread, so a run of them between forward and the optimizer step
(or inside backward) is "backward (autograd engine)".
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import Any

from memprobe.attribute.frames import (
    autograd_node,
    call_site,
    clean_frames,
    op_from_frames,
    phase_from_frames,
)
from memprobe.attribute.ops import (
    collective_evidence,
    in_attention,
    is_autocast_cast,
    is_autotune,
    is_checkpoint,
    is_comm_buffer,
    is_optimizer,
    is_parameter_setup,
    is_zero_grad,
    loss_evidence,
)
from memprobe.records import Frame
from memprobe.snapshot.labels import label_bytes, parse_label, parse_shape

PHASES = ("setup", "forward", "backward", "optimizer")


@dataclass(frozen=True, slots=True)
class Site:
    """What an allocation's stack (and memprobe's label, when present) says."""

    op: str | None
    op_source: str | None  # "label" | "frames" | None
    node: str | None  # autograd node, when C++ frames name one
    phase: str | None
    phase_reason: str
    chain: tuple[Frame, ...]  # the user's line first, then up to two callers
    via: tuple[str, ...]  # libraries the call went through ("einops.einsum")
    loss: str | None  # why it is part of a softmax/loss over V, or None
    optimizer: bool
    zero_grad: bool
    autotune: bool
    param_setup: bool
    has_frames: bool
    label_dtype: str | None
    label_shape: tuple[int, ...] | None
    collective: str | None = None  # a frame naming a collective / vocab-parallel layer
    attention: bool = False  # made inside an attention function (scores, not the vocabulary)
    checkpoint: bool = False  # made under torch.utils.checkpoint
    collective_buffer: bool = False  # a DDP bucket / c10d buffer, not just a collective's op
    autocast_cast: bool = False  # made by autocast's weight cast (at::autocast::cached_cast)
    # The line inside memprobe's own kernel when the user's code called it (``chain``
    # then starts at the user's call): what made the block, beside the op.
    kernel: Frame | None = None

    @property
    def frame(self) -> Frame | None:
        return self.chain[0] if self.chain else None


@dataclass(frozen=True, eq=False)
class Stack:
    """What a stack of frames alone says (no label): read once per distinct stack, however
    many entries share it with labels of their own (a memprobe run labels every block)."""

    frames: tuple[Frame, ...]
    node: str | None
    op: str | None
    phase: str | None
    phase_reason: str
    optimizer: bool
    chain: tuple[Frame, ...]
    via: tuple[str, ...]
    kernel: Frame | None
    zero_grad: bool
    autotune: bool
    param_setup: bool
    collective: str | None
    attention: bool
    checkpoint: bool
    collective_buffer: bool
    autocast_cast: bool

    @functools.cached_property
    def _loss_by_op(self) -> dict[str | None, str | None]:
        return {}

    def loss(self, op: str | None) -> str | None:
        """:func:`loss_evidence` for this stack with ``op`` (a label's, or the frames')."""
        if op not in self._loss_by_op:
            self._loss_by_op[op] = loss_evidence(op, self.node, self.frames)
        return self._loss_by_op[op]


def read_stack(raw_frames: Any) -> Stack:
    frames = tuple(clean_frames(raw_frames))
    phase, reason = phase_from_frames(frames)
    chain, via, kernel = call_site(frames)
    return Stack(
        frames=frames,
        node=autograd_node(frames),
        op=op_from_frames(frames),
        phase=phase,
        phase_reason=reason,
        optimizer=is_optimizer(frames),
        chain=chain,
        via=via,
        kernel=kernel,
        zero_grad=is_zero_grad(frames),
        autotune=is_autotune(frames),
        param_setup=is_parameter_setup(frames),
        collective=collective_evidence(frames),
        attention=in_attention(frames),
        checkpoint=is_checkpoint(frames),
        collective_buffer=is_comm_buffer(frames),
        autocast_cast=is_autocast_cast(frames),
    )


def read_site(
    raw_frames: Any, label_text: Any, size: int | None = None, stack: Stack | None = None
) -> Site:
    """``size``: the bytes of the block the label is on, when known. A label whose shape
    and dtype are not that block (a tampered or foreign file: a zero dimension, twice the
    bytes) records nothing: its shape would be read as the logits'. ``stack``: the frames
    already read (:func:`read_stack`)."""
    stack = stack or read_stack(raw_frames)
    label = parse_label(label_text)
    op = label.get("op")
    op_source = "label" if op else None
    if op is None:
        op = stack.op
        op_source = "frames" if op else None
    phase: str | None
    if label.get("phase") in PHASES:
        phase, reason = label["phase"], "memprobe's label"
    else:
        phase, reason = stack.phase, stack.phase_reason
    if stack.optimizer and phase != "backward":
        phase, reason = "optimizer", "allocated under the optimizer's step"
    dtype = label["dtype"].removeprefix("torch.") if label.get("dtype") else None
    shape = parse_shape(label.get("shape"))
    if shape is not None and size is not None and label_bytes(dtype, shape) != size:
        dtype, shape = None, None
    return Site(
        op=op,
        op_source=op_source,
        node=stack.node,
        phase=phase,
        phase_reason=reason,
        chain=stack.chain,
        via=stack.via,
        loss=stack.loss(op),
        optimizer=stack.optimizer,
        zero_grad=stack.zero_grad,
        autotune=stack.autotune,
        param_setup=stack.param_setup,
        has_frames=bool(stack.frames),
        label_dtype=dtype,
        label_shape=shape,
        collective=stack.collective,
        attention=stack.attention,
        checkpoint=stack.checkpoint,
        collective_buffer=stack.collective_buffer,
        autocast_cast=stack.autocast_cast,
        kernel=stack.kernel,
    )


class SiteCache:
    """``site(entry)`` reads each distinct stack once.

    A loaded file gives every entry its own frames list, but pickle keeps repeated
    frame dicts shared: the tuple of the dicts' ids names a stack by content, cheaply.
    Ids are only stable while the snapshot is alive, so a cache lives for one call.
    """

    def __init__(self) -> None:
        self._sites: dict[tuple[tuple[int, ...], str, int | None], Site] = {}
        # The frames' part, by the stack alone: entries that share a stack but not a label.
        self._stacks: dict[tuple[int, ...], Stack] = {}
        self._keep: list[Any] = []  # the frames objects keyed by id stay alive with us
        # Each entry is asked for again and again (phases, shapes, categories): its
        # site by the entry's id, the entry kept alive with it.
        self._by_entry: dict[int, tuple[dict[str, Any], Site]] = {}

    def site(self, entry: dict[str, Any] | None) -> Site:
        if entry is None:
            entry = {}
        seen = self._by_entry.get(id(entry))
        if seen is not None and seen[0] is entry:
            return seen[1]
        found = self._read(entry)
        self._by_entry[id(entry)] = (entry, found)
        return found

    def _read(self, entry: dict[str, Any]) -> Site:
        frames = entry.get("frames")
        label = entry.get("user_metadata", "")
        label = label if isinstance(label, str) else ""
        ids = tuple(map(id, frames)) if isinstance(frames, list) else ()
        # A label that records a shape is checked against the block's size (read_site).
        size = entry.get("size") if "shape=" in label else None
        size = size if isinstance(size, int) else None
        key = (ids, label, size)
        found = self._sites.get(key)
        if found is None:
            stack = self._stacks.get(ids)
            if stack is None:
                stack = self._stacks[ids] = read_stack(frames)
                self._keep.append(frames)
            found = read_site(frames, label, size, stack)
            self._sites[key] = found
        return found


@dataclass(frozen=True, eq=False)
class Phases:
    """Phase of every alloc position, with the frameless ones resolved, and where each
    backward pass ends (for telling gradients from backward temporaries)."""

    phase_at: dict[int, str | None]
    reason_at: dict[int, str]
    backward_end: dict[int, int]  # alloc position in a backward pass -> where that pass ends

    def phase(self, pos: int) -> str | None:
        return self.phase_at.get(pos)

    @functools.cached_property
    def _alloc_positions(self) -> list[int]:
        return sorted(self.phase_at)

    def phase_near(self, pos: int) -> str | None:
        """The phase of the allocation just before trace position ``pos`` (a free's
        phase is its neighbours')."""
        allocs = self._alloc_positions
        i = bisect.bisect_right(allocs, pos) - 1
        return self.phase_at[allocs[i]] if i >= 0 else None

    @functools.cached_property
    def backward_starts(self) -> list[int]:
        return sorted(self.backward_end)


def resolve_phases(entries: list[dict[str, Any]], sites: SiteCache) -> Phases:
    """Phase per ``alloc`` position; allocations with no frames take the phase their
    neighbours imply (see module notes)."""
    allocs = [pos for pos, e in enumerate(entries) if e["action"] == "alloc"]
    raw: list[str | None] = []
    for pos in allocs:
        s = sites.site(entries[pos])
        raw.append(s.phase if s.has_frames or s.op_source == "label" else "?")
    phase_at: dict[int, str | None] = {}
    reason_at: dict[int, str] = {}
    n = len(allocs)
    i = 0
    while i < n:
        if raw[i] != "?":
            phase_at[allocs[i]] = raw[i]
            i += 1
            continue
        j = i
        while j < n and raw[j] == "?":
            j += 1
        left = raw[i - 1] if i > 0 else None
        right = raw[j] if j < n else None
        after_forward = left == "forward" and right in ("optimizer", "forward", None)
        backward = "backward" in (left, right) or after_forward
        for k in range(i, j):
            phase_at[allocs[k]] = "backward" if backward else None
            reason_at[allocs[k]] = (
                "no frames: made on the autograd engine's thread between "
                f"{left or 'the trace start'} and {right or 'the trace end'} allocations"
                if backward
                else "no frames recorded"
            )
        i = j
    # A backward pass ends where the next forward or optimizer allocation begins: a
    # block made in it and still live there survives backward (a gradient).
    backward_end: dict[int, int] = {}
    run: list[int] = []
    for pos in allocs:
        phase = phase_at.get(pos)
        if phase == "backward":
            run.append(pos)
        elif phase is not None and run:
            for p in run:
                backward_end[p] = pos
            run = []
    for p in run:
        backward_end[p] = len(entries)
    return Phases(phase_at, reason_at, backward_end)
