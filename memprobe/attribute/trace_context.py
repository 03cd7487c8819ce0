"""One device's replay as attribution reads it: each block's site, phase and verdict,
computed once, and the step's shapes inferred from every block's op and size
(:mod:`memprobe.attribute.shapes`)."""

from __future__ import annotations

from collections import Counter, defaultdict

from memprobe.attribute.categories import Classification, classify
from memprobe.attribute.ops import (
    is_cast,
    is_matmul,
    is_opaque_generated,
    may_hold_ids,
    shape_op,
)
from memprobe.attribute.shapes import (
    MIN_LOSS_BLOCK,
    Direct,
    Hints,
    ShapeInference,
    infer_shapes,
)
from memprobe.attribute.sites import Phases, Site, SiteCache, resolve_phases
from memprobe.snapshot.replay import BEFORE_TRACE, Replay, ReplayBlock

LOSS_SAMPLES_PER_SIZE = 16  # blocks of one size whose sites are read to find the loss's sizes


class TraceContext:
    """Sites, phases and verdicts of one device's replay, computed once per block."""

    def __init__(self, rep: Replay, shapes_hints: Hints, *, simulated: bool = False) -> None:
        self.rep = rep
        self.simulated = simulated
        self.sites = SiteCache()
        self.phases: Phases = resolve_phases(rep.entries, self.sites)
        self.direct = Direct()
        self.shapes = self._infer(shapes_hints)
        self._verdicts: dict[int, Classification] = {}

    def site(self, b: ReplayBlock) -> Site:
        if b.alloc_entry is not None:
            return self.sites.site(b.alloc_entry)
        if b.segment_block is not None:
            return self.sites.site(b.segment_block)
        # Only its free was recorded: its stack describes the free, its label the block.
        free = b.free_entry or {}
        return self.sites.site({"user_metadata": free.get("user_metadata", ""), "size": b.size})

    def time_at(self, pos: int | None) -> int | None:
        """The entry's time, or None when the clock timed a simulation, not a device."""
        return None if self.simulated else self.rep.time_at(pos)

    def _infer(self, hints: Hints) -> ShapeInference:
        sizes: Counter[int] = Counter()
        by_size: dict[int, list[ReplayBlock]] = defaultdict(list)
        for b in self.rep.blocks:
            sizes[b.size] += 1
            by_size[b.size].append(b)
        # Samples spread over the whole trace: the first blocks of a size are often
        # another layer's (the lm_head's bmm and the loss's sub share one size).
        for size, group in by_size.items():
            if len(group) > LOSS_SAMPLES_PER_SIZE:
                stride = len(group) / LOSS_SAMPLES_PER_SIZE
                by_size[size] = [group[int(i * stride)] for i in range(LOSS_SAMPLES_PER_SIZE)]
        samples = [(size, self.site(b)) for size, group in by_size.items() for b in group]
        # A size made inside attention (scores, their softmax) is [B, h, S, S]: its
        # backward (SoftmaxBackward0 on the engine's thread, no Python frame to say
        # "attention") is not a loss over the vocabulary either.
        attention: Counter[int] = Counter()
        matmul_share: Counter[int] = Counter()
        arange, masks, rotary = set(), set(), set()
        stacks = False
        # Every block's op (its site is cached per stack; phases read them all already):
        # which ones a forward matmul made, exactly, and which ones name S.
        id_sizes: set[int] = set()
        copies: set[int] = set()
        persistent: Counter[int] = Counter()
        params: Counter[int] = Counter()
        for b in self.rep.blocks:
            s = self.site(b)
            stacks = stacks or s.op is not None
            if b.alloc_pos == BEFORE_TRACE or b.free_pos is None:
                persistent[b.size] += 1
            if b.alloc_pos == BEFORE_TRACE or b.free_pos is None or s.phase == "setup":
                params[b.size] += 1
            if b.size not in id_sizes and may_hold_ids(s.op) and shape_op(s.op) != "arange":
                id_sizes.add(b.size)
            if s.phase != "forward":
                continue
            if s.attention:
                attention[b.size] += 1
            elif is_matmul(s.op, s.node):
                matmul_share[b.size] += 1
            if is_cast(s.op) or s.autocast_cast:
                copies.add(b.size)
            kind = shape_op(s.op)
            if kind == "arange":
                arange.add(b.size)
            elif kind == "mask" and _square(s.label_shape):
                masks.add(b.size)
            elif kind == "rotary":
                rotary.add(b.size)
        direct = Direct(
            arange=frozenset(arange),
            masks=frozenset(masks),
            rotary=frozenset(rotary),
            attention=tuple(attention.items()),
            matmuls=tuple(matmul_share.items()),
            stacks=stacks,
            id_sizes=frozenset(id_sizes),
            persistent=tuple(persistent.items()),
            casts=frozenset(c for c in copies if persistent[2 * c]),
            steps=max(1, len(set(self.phases.backward_end.values()))),
            params=tuple(params.items()),
        )
        loss_sites = [(size, s) for size, s in samples if size >= MIN_LOSS_BLOCK]
        loss_sizes = {size for size, s in loss_sites if s.loss and size not in attention}
        labelled = {s.label_shape for _, s in loss_sites if s.loss and s.label_shape}
        # Forward matmul outputs (the lm_head is one), and buffers torch.compile's
        # generated code allocated with no op named (its matmuls write into them).
        matmuls = {
            size
            for size, s in loss_sites
            if s.phase == "forward"
            and not s.attention
            and (is_matmul(s.op, s.node) or is_opaque_generated(s.op, s.via))
        }
        matmul_labelled = {
            s.label_shape
            for size, s in loss_sites
            if size in matmuls
            and s.label_shape
            and s.phase == "forward"
            and not s.attention
            and (is_matmul(s.op, s.node) or is_opaque_generated(s.op, s.via))
        }
        # What memprobe's labels record of the blocks a reading splits into [N, V].
        label_sizes = {
            (size, s.label_shape)
            for size, s in loss_sites
            if s.label_shape
            and ((s.loss and size in loss_sizes) or s.label_shape in matmul_labelled)
        }
        collective = next(
            (s.collective for _, s in loss_sites if s.collective and (s.loss or s.node)), None
        )
        self.direct = direct
        return infer_shapes(
            sizes,
            loss_sizes,
            hints,
            labelled,
            matmuls,
            collective=collective,
            direct=direct,
            matmul_labelled=matmul_labelled,
            label_sizes=label_sizes,
        )

    def verdict(self, b: ReplayBlock) -> Classification:
        key = id(b)
        found = self._verdicts.get(key)
        if found is None:
            segment_site = self.sites.site(b.segment_block) if b.segment_block is not None else None
            # With torch's context='all' a free records the stack that freed it: for a
            # block from before the trace, the only stack there is.
            free_site = (
                self.sites.site(b.free_entry)
                if b.alloc_entry is None and b.free_entry is not None
                else None
            )
            found = classify(
                b,
                self.site(b),
                self.phases,
                self.shapes,
                trace_length=len(self.rep.entries),
                segment_site=segment_site,
                free_site=free_site,
                casts=self.direct.casts,
            )
            self._verdicts[key] = found
        return found


def _square(shape: tuple[int, ...] | None) -> bool:
    """Whether a block a mask's constructor made can be a mask [.., S, S]: a label that
    records its shape says (a scalar ``full`` is none); without one, its bytes decide."""
    return shape is None or (len(shape) >= 2 and shape[-1] == shape[-2] >= 2)
