"""Snapshot → Findings: what the peak (and each OOM) is made of, and what the big blocks are.

Steps, per device: replay the trace (block lives, the peak, reserved bytes, OOMs);
read each allocation's site (op, autograd node, phase, the user's line); infer the
step's shapes from the trace (:mod:`memprobe.attribute.shapes`); classify every live
byte at the peak and at each OOM (:mod:`memprobe.attribute.categories`); group
identical blocks; list every logits-family block of the trace; describe the
allocator's state. ``Findings`` is a frozen record with a plain JSON form
(:mod:`memprobe.io.codec`).
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from memprobe.attribute.allocator_view import (
    AllocatorView,
    allocator_view,
    block_bytes,
    largest_free_block_at,
    oom_verdict,
    segments_at,
)
from memprobe.attribute.categories import CATEGORIES, Classification, classify
from memprobe.attribute.explain import Explanation
from memprobe.attribute.ops import (
    is_cast,
    is_matmul,
    is_opaque_generated,
    may_hold_ids,
    shape_op,
)
from memprobe.attribute.records import (
    BlockFinding,
    BlockGroup,
    OomFinding,
    SiteBytes,
    Timeline,
)
from memprobe.attribute.shapes import (
    MIN_LOSS_BLOCK,
    Direct,
    Hints,
    ShapeInference,
    infer_shapes,
)
from memprobe.attribute.sites import Phases, Site, SiteCache, resolve_phases
from memprobe.errors import UserError
from memprobe.records import Frame
from memprobe.snapshot.load import DEFAULT_MAX_BYTES, load_snapshot, normalize_snapshot
from memprobe.snapshot.replay import BEFORE_TRACE, Replay, ReplayBlock, replay

DEFAULT_TOP = 10
DEFAULT_MIN_BLOCK_BYTES = 64 << 20  # "large": blocks listed even when not live at a peak/OOM
LOSS_SAMPLES_PER_SIZE = 16  # blocks of one size whose sites are read to find the loss's sizes
TIMELINE_POINTS = 400
TIMELINE_MIN_BLOCK = 1 << 20  # smaller blocks are drawn together as "small blocks"
SMALL_BLOCKS = "small blocks (< 1 MiB)"

__all__ = [
    "DEFAULT_TOP",
    "BlockFinding",
    "Findings",
    "OomFinding",
    "attribute",
    "attribute_devices",
    "attribute_file",
    "attribute_file_devices",
]


@dataclass(frozen=True)
class Findings:
    """What attribution concluded about one snapshot (one device)."""

    path: str | None
    source: str  # "trace" | "segments"
    device: int
    trace_entries: int
    trace_start_us: int | None
    peak_allocated_bytes: int
    peak_index: int | None  # -1: before the first entry; None: snapshot time
    peak_time_us: int | None
    peak_phase: str | None
    peak_op: str | None
    peak_frame: Frame | None
    peak_reserved_bytes: int | None
    peak_reserved_index: int | None
    peak_reserved_time_us: int | None
    reserved_at_snapshot_bytes: int | None
    live_at_peak_count: int
    vocab: int | None  # as given by the user
    tokens: int | None
    batch: int | None
    inference: ShapeInference
    breakdown: tuple[tuple[str, int], ...]  # category -> bytes live at the peak, largest first
    groups: tuple[BlockGroup, ...]  # identical blocks live at the peak, largest total first
    peak_sites: tuple[SiteBytes, ...]  # bytes live at the peak by (line, op, category)
    findings: tuple[BlockFinding, ...]
    ooms: tuple[OomFinding, ...]
    allocator: AllocatorView
    timeline: Timeline | None
    notes: tuple[str, ...]
    # "measured": the trace's time_us are the recording's clock; "none": it has none;
    # "simulated": memprobe synthesized it on meta, its times are dropped (all None).
    times: str = "measured"
    peak_kernel: Frame | None = None  # the line in memprobe's kernel ``peak_frame`` called

    @property
    def logits_family(self) -> tuple[BlockFinding, ...]:
        """Every logits-family block of the trace, in the order they were made."""
        blocks = [f for f in self.findings if f.logits]
        return tuple(
            sorted(blocks, key=lambda f: BEFORE_TRACE if f.alloc_index is None else f.alloc_index)
        )


def attribute_file(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES, **options: Any
) -> Findings:
    """Load ``path`` safely and attribute its lead device (see :func:`attribute_devices`)."""
    return attribute_file_devices(path, max_bytes=max_bytes, **options)[0]


def attribute_file_devices(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES, **options: Any
) -> tuple[Findings, ...]:
    snapshot = load_snapshot(path, max_bytes=max_bytes)
    return attribute_devices(snapshot, path=str(path), normalized=True, **options)


def devices_with_data(snapshot: dict[str, Any]) -> list[int]:
    traces = snapshot.get("device_traces", [])
    with_trace = [d for d, t in enumerate(traces) if t]
    if with_trace:
        return with_trace
    return sorted({s.get("device", 0) for s in snapshot.get("segments", [])}) or [0]


def attribute_devices(
    snapshot: dict[str, Any],
    *,
    device: int | None = None,
    normalized: bool = False,
    **options: Any,
) -> tuple[Findings, ...]:
    """Attribute every device with a trace (or only ``device``); the device that hit an
    OOM comes first, then the others by peak. ``normalized``: the dict is what
    ``load_snapshot`` returned (normalising it again costs seconds on 10^6 entries)."""
    snap = (
        snapshot
        if normalized
        else normalize_snapshot(snapshot, source=options.get("path") or "<snapshot>")
    )
    if device is not None:
        return (_attribute_normalized(snap, device=device, **options),)
    found = [_attribute_normalized(snap, device=d, **options) for d in devices_with_data(snap)]
    found.sort(key=lambda f: (not f.ooms, -f.peak_allocated_bytes, f.device))
    return tuple(found)


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UserError(f"{name} must be a positive integer, got {value!r}")


class _Context:
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
        return self.sites.site({"user_metadata": free.get("user_metadata", "")})

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
        for b in self.rep.blocks:
            s = self.site(b)
            stacks = stacks or s.op is not None
            if b.alloc_pos == BEFORE_TRACE or b.free_pos is None:
                persistent[b.size] += 1
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


def attribute(
    snapshot: dict[str, Any],
    *,
    vocab: int | None = None,
    tokens: int | None = None,
    batch: int | None = None,
    top: int = DEFAULT_TOP,
    min_block_bytes: int = DEFAULT_MIN_BLOCK_BYTES,
    device: int | None = None,
    path: str | None = None,
    timeline: bool = False,
) -> Findings:
    """Attribute one device of a snapshot dict (as loaded, or as synthesized).

    ``vocab`` / ``tokens`` (S) / ``batch`` override what inference finds; ``top`` bounds
    the blocks listed at the peak, at each OOM and among other large blocks (the
    logits-family blocks are always all listed); ``timeline`` adds a sampled
    allocated-by-category curve (for the HTML page).
    """
    # Normalising is idempotent, so any dict (loaded, synthesized, hand-made) reads alike.
    snap = normalize_snapshot(snapshot, source=path or "<snapshot>")
    return _attribute_normalized(
        snap,
        vocab=vocab,
        tokens=tokens,
        batch=batch,
        top=top,
        min_block_bytes=min_block_bytes,
        device=device,
        path=path,
        timeline=timeline,
    )


def _attribute_normalized(
    snap: dict[str, Any],
    *,
    vocab: int | None = None,
    tokens: int | None = None,
    batch: int | None = None,
    top: int = DEFAULT_TOP,
    min_block_bytes: int = DEFAULT_MIN_BLOCK_BYTES,
    device: int | None = None,
    path: str | None = None,
    timeline: bool = False,
) -> Findings:
    for name, value in (("vocab", vocab), ("tokens", tokens), ("batch", batch), ("top", top)):
        _check_positive(name, value)
    rep = replay(snap, device=device)
    recorded = recorded_case_hints(snap)
    hints = Hints(
        vocab if vocab is not None else recorded.vocab,
        tokens if tokens is not None else recorded.tokens,
        batch if batch is not None else recorded.batch,
        recorded.hidden,
    )
    ctx = _Context(rep, hints, simulated=simulated_clock(snap))
    live_peak = _largest(rep.live_at(rep.peak_pos))
    oom_live = [_largest(rep.live_at(m.pos)) for m in rep.ooms]

    chosen: dict[int, ReplayBlock] = {}
    for group in (live_peak, *oom_live):
        for b in group[:top]:
            chosen.setdefault(id(b), b)
    family_sizes = {size for size, _ in ctx.shapes.family} | ctx.shapes.family_sizes()
    for b in rep.blocks:
        if (b.size in family_sizes or ctx.site(b).label_shape) and ctx.verdict(b).logits:
            chosen.setdefault(id(b), b)
    rest = _largest(b for b in rep.blocks if b.size >= min_block_bytes and id(b) not in chosen)
    for b in rest[:top]:
        chosen[id(b)] = b

    peak_ids = {id(b) for b in live_peak}
    oom_ids = [{id(b) for b in group} for group in oom_live]
    findings = [_finding(b, ctx, id(b) in peak_ids, oom_ids) for b in chosen.values()]
    findings.sort(
        key=lambda f: (
            not f.live_at_peak,
            not f.live_at_oom,
            -f.size,
            BEFORE_TRACE if f.alloc_index is None else f.alloc_index,
        )
    )
    segments = [s for s in snap["segments"] if s.get("device", 0) == rep.device]
    view = allocator_view(
        segments,
        snap.get("allocator_settings") or {},
        reserved_at_peak=rep.reserved_at_peak_bytes,
        allocated_at_peak=rep.peak_allocated_bytes,
    )
    ooms = tuple(
        _oom(n, m, ctx, group, top, view, snap)
        for n, (m, group) in enumerate(zip(rep.ooms, oom_live, strict=True))
    )
    peak_entry = (
        rep.entries[rep.peak_pos] if rep.peak_pos is not None and rep.peak_pos >= 0 else None
    )
    peak_site = ctx.sites.site(peak_entry) if peak_entry else None
    start = (
        None if ctx.simulated else next((e["time_us"] for e in rep.entries if "time_us" in e), None)
    )
    return Findings(
        path=path,
        source=rep.source,
        device=rep.device,
        trace_entries=len(rep.entries),
        trace_start_us=start,
        peak_allocated_bytes=rep.peak_allocated_bytes,
        peak_index=rep.peak_pos,
        peak_time_us=ctx.time_at(rep.peak_pos),
        peak_phase=_peak_phase(rep, ctx, peak_site),
        peak_op=peak_site.op if peak_site else None,
        peak_frame=peak_site.frame if peak_site else None,
        peak_kernel=peak_site.kernel if peak_site else None,
        peak_reserved_bytes=rep.peak_reserved_bytes,
        peak_reserved_index=rep.peak_reserved_pos,
        peak_reserved_time_us=ctx.time_at(rep.peak_reserved_pos),
        reserved_at_snapshot_bytes=rep.reserved_at_end_bytes,
        live_at_peak_count=len(live_peak),
        vocab=vocab,
        tokens=tokens,
        batch=batch,
        inference=ctx.shapes,
        breakdown=_breakdown(live_peak, ctx),
        groups=_groups(live_peak, ctx),
        peak_sites=_peak_sites(live_peak, ctx),
        findings=tuple(findings),
        ooms=ooms,
        allocator=view,
        timeline=_timeline(rep, ctx) if timeline else None,
        notes=rep.notes + _provenance_notes(snap, rep),
        times="simulated" if ctx.simulated else ("measured" if start is not None else "none"),
    )


def _square(shape: tuple[int, ...] | None) -> bool:
    """Whether a block a mask's constructor made can be a mask [.., S, S]: a label that
    records its shape says (a scalar ``full`` is none); without one, its bytes decide."""
    return shape is None or (len(shape) >= 2 and shape[-1] == shape[-2] >= 2)


def simulated_clock(snap: dict[str, Any]) -> bool:
    """Whether the trace's times are memprobe's simulation clock (a meta run): they
    time Python on the host, not the device, and must never read as measured."""
    meta = snap.get("memprobe")
    return isinstance(meta, dict) and meta.get("clock") == "simulation"


def _peak_phase(rep: Replay, ctx: _Context, site: Site | None) -> str | None:
    if rep.peak_pos is None or rep.peak_pos < 0:
        return None
    return ctx.phases.phase(rep.peak_pos) or (site.phase if site else None)


def _breakdown(live: list[ReplayBlock], ctx: _Context) -> tuple[tuple[str, int], ...]:
    totals: Counter[str] = Counter()
    for b in live:
        totals[ctx.verdict(b).category] += b.size
    return tuple(sorted(totals.items(), key=lambda kv: (-kv[1], CATEGORIES.index(kv[0]))))


def _groups(live: list[ReplayBlock], ctx: _Context) -> tuple[BlockGroup, ...]:
    groups: dict[tuple[Any, ...], list[ReplayBlock]] = defaultdict(list)
    for b in live:
        v, s = ctx.verdict(b), ctx.site(b)
        key = (
            b.size, v.category, s.op, s.frame, v.phase, b.alloc_pos == BEFORE_TRACE, v.logits,
            s.kernel,
        )  # fmt: skip
        groups[key].append(b)
    out = [
        BlockGroup(
            len(bs),
            k[0],
            k[0] * len(bs),
            k[1],
            k[2],
            k[3],
            k[4],
            k[5],
            k[6],
            Counter(ctx.verdict(b).reason for b in bs).most_common(1)[0][0],
            k[7],
        )  # fmt: skip
        for k, bs in groups.items()
    ]
    out.sort(key=lambda g: (-g.total_bytes, -g.size))
    return tuple(out)


def _peak_sites(live: list[ReplayBlock], ctx: _Context) -> tuple[SiteBytes, ...]:
    sites: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0])
    for b in live:
        s = ctx.site(b)
        caller = s.chain[1] if len(s.chain) > 1 else None
        acc = sites[(s.frame, caller, s.op, ctx.verdict(b).category)]
        acc[0] += b.size
        acc[1] += 1
    out = [SiteBytes(f, op, c, n, k, caller) for (f, caller, op, c), (n, k) in sites.items()]
    out.sort(key=lambda s: -s.bytes)
    return tuple(out)


def _timeline(rep: Replay, ctx: _Context) -> Timeline:
    """Allocated bytes per category at evenly spaced trace positions (and the peak)."""
    n = len(rep.entries)
    if n == 0:
        return Timeline((), ())
    step = max(1, n // TIMELINE_POINTS)
    positions = sorted(
        set(range(0, n, step))
        | {n - 1}
        | ({rep.peak_pos} if rep.peak_pos and rep.peak_pos >= 0 else set())
    )
    deltas: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for b in rep.blocks:
        cat = ctx.verdict(b).category if b.size >= TIMELINE_MIN_BLOCK else SMALL_BLOCKS
        deltas[cat].append((max(b.alloc_pos, 0), b.size))
        if b.free_pos is not None:
            deltas[cat].append((b.free_pos, -b.size))
    series = []
    for cat in (*CATEGORIES, SMALL_BLOCKS):
        events = sorted(deltas.get(cat, ()))
        if not events:
            continue
        values, total, i = [], 0, 0
        for pos in positions:
            while i < len(events) and events[i][0] <= pos:
                total += events[i][1]
                i += 1
            values.append(total)
        series.append((cat, tuple(values)))
    return Timeline(tuple(positions), tuple(series))


# A case id's shapes: "-h4096" only for the hidden family.
_CASE_SHAPE = re.compile(
    r"(?:-h(\d+))?-b(\d+)-s(\d+)-v(\d+)-[a-z0-9]+-c(?:\d+|none)-tp(\d+)-cp(\d+)-"
)


def recorded_case_hints(snap: dict[str, Any]) -> Hints:
    """The shapes a memprobe run recorded for its own snapshot (one rank's B, S, V), so
    a chunked kernel's per-chunk blocks are never mistaken for the whole sequence."""
    meta = snap.get("memprobe")
    case = meta.get("case") if isinstance(meta, dict) else None
    match = _CASE_SHAPE.search(case) if isinstance(case, str) else None
    if match is None:
        return Hints()
    h, (b, s, v, tp, cp) = match.group(1), (int(g) for g in match.groups()[1:])
    if tp < 1 or cp < 1:
        return Hints()
    return Hints(vocab=v // tp, tokens=s // cp, batch=b, hidden=int(h) if h else None)


def _provenance_notes(snap: dict[str, Any], rep: Replay) -> tuple[str, ...]:
    notes = []
    meta = snap.get("memprobe")
    if isinstance(meta, dict) and meta.get("synthesized"):
        notes.append(
            "synthesized by memprobe from a tracked run: allocated bytes are exact; "
            "segments and reserved bytes are memprobe's model of the CUDA caching allocator"
        )
    threads = meta.get("threads_started") if isinstance(meta, dict) else None
    if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0:
        notes.append(
            f"the step started {threads:,} thread(s): memory allocated on them is not in this "
            "trace (memprobe tracks the thread that runs the step)"
        )
    others = [d for d, t in enumerate(snap["device_traces"]) if t and d != rep.device]
    if others:
        listed = ", ".join(f"{d} ({len(snap['device_traces'][d]):,} entries)" for d in others)
        notes.append(f"attributed device {rep.device}; other devices with a trace: {listed}")
    return tuple(notes)


def _largest(blocks: Any) -> list[ReplayBlock]:
    return sorted(blocks, key=lambda b: (-b.size, b.alloc_pos))


def _explanation(b: ReplayBlock, shapes: ShapeInference, reason: str) -> Explanation | None:
    fit = shapes.fit(b.size)
    if fit is None:
        return None
    dtype, rows = fit
    split = shapes.batch is not None and shapes.seq is not None
    # A shifted loss's blocks have S − 1 positions per sequence: [B, S−1, V].
    seq = (shapes.seq or 0) - (1 if rows != shapes.tokens else 0)
    return Explanation(
        dtype=dtype,
        batch=shapes.batch if split and shapes.batch is not None else 1,
        tokens=seq if split else rows,
        vocab=shapes.vocab or 0,
        exact=True,
        score=0,
        reasons=(reason, *shapes.evidence),
        split=split,
    )


def _finding(
    b: ReplayBlock, ctx: _Context, live_at_peak: bool, oom_ids: list[set[int]]
) -> BlockFinding:
    site, verdict = ctx.site(b), ctx.verdict(b)
    origin = b.alloc_entry or b.segment_block or b.free_entry or {}
    label_text = origin.get("user_metadata", "")
    label_text = label_text if isinstance(label_text, str) else ""
    explanations: tuple[Explanation, ...] = ()
    dtype: str | None
    shape: tuple[int, ...] | None
    dtype_source: str | None
    if site.label_dtype:
        dtype, shape, dtype_source = site.label_dtype, site.label_shape, "label"
        if verdict.logits and site.label_shape and len(site.label_shape) == 3:
            bb, ss, vv = site.label_shape
            explanations = (
                Explanation(
                    site.label_dtype, bb, ss, vv, True, 0,
                    (f"memprobe's label records {site.label_dtype} [{bb}, {ss}, {vv}]",),
                ),
            )  # fmt: skip
    elif verdict.logits and (e := _explanation(b, ctx.shapes, verdict.logits_reason)):
        explanations = (e,)
        dtype, shape, dtype_source = e.dtype, e.shape, "inferred"
    else:
        dtype = shape = dtype_source = None
    alloc_index = None if b.alloc_pos == BEFORE_TRACE else b.alloc_pos
    alloc_time = ctx.time_at(alloc_index)
    free_time = ctx.time_at(b.free_pos)
    numbers = tuple(n for n, ids in enumerate(oom_ids) if id(b) in ids)
    return BlockFinding(
        address=b.addr,
        size=b.size,
        block_size=b.segment_block.get("size") if b.segment_block else None,
        dtype=dtype,
        shape=shape,
        dtype_source=dtype_source,
        op=site.op,
        op_source=site.op_source,
        node=site.node,
        frame=site.frame,
        chain=site.chain,
        via=site.via,
        phase=verdict.phase,
        phase_reason=verdict.phase_reason,
        category=verdict.category,
        category_reason=verdict.reason,
        logits=verdict.logits,
        logits_reason=verdict.logits_reason,
        alloc_index=alloc_index,
        alloc_time_us=alloc_time,
        free_index=b.free_pos,
        free_time_us=free_time,
        lifetime_us=None if alloc_time is None or free_time is None else free_time - alloc_time,
        lifetime_entries=None
        if alloc_index is None or b.free_pos is None
        else b.free_pos - alloc_index,
        live_at_peak=live_at_peak,
        live_at_oom=bool(numbers),
        oom_numbers=numbers,
        explanations=explanations,
        more_explanations=0,
        label=label_text,
        stream=origin.get("stream", 0),
        kernel=site.kernel,
    )


def _oom(
    number: int,
    moment: Any,
    ctx: _Context,
    live: list[ReplayBlock],
    top: int,
    view: AllocatorView,
    snap: dict[str, Any],
) -> OomFinding:
    e = moment.entry
    site = ctx.sites.site(e)
    # The allocator at the OOM moment, not at snapshot time: what was freed after the
    # failure (the exception unwinding) coalesced into free blocks the request never saw.
    segments = [s for s in snap["segments"] if s.get("device", 0) == ctx.rep.device]
    held = segments_at(ctx.rep.entries, moment.pos, segments)
    reserved, largest = moment.reserved_bytes, None
    if held is not None:
        _, largest = largest_free_block_at(
            held, ((b.addr, block_bytes(b.size, b.segment_block)) for b in live)
        )
        if reserved is None:  # no segment events: reserved held still over the window
            reserved = sum(held.values())
    verdict = oom_verdict(
        e["size"],
        moment.allocated_bytes,
        reserved,
        e.get("device_free"),
        largest,
        bool(view.expandable_segments)
        or "expandable_segments:True" in str(snap.get("allocator_settings")),
    )
    return OomFinding(
        number=number,
        index=moment.pos,
        time_us=None if ctx.simulated else e.get("time_us"),
        requested_bytes=e["size"],
        device_free_bytes=e.get("device_free"),
        allocated_bytes=moment.allocated_bytes,
        live_count=len(live),
        live_addresses=tuple(b.addr for b in live[:top]),
        op=site.op,
        frame=site.frame,
        phase=site.phase or ctx.phases.phase(moment.pos),
        breakdown=_breakdown(live, ctx),
        verdict=verdict,
    )
