"""The parts of a :class:`memprobe.attribute.findings.Findings`, each read from one
device's replay through its :class:`memprobe.attribute.trace_context.TraceContext`: the
peak's breakdown, groups and sites, each listed block, each OOM, the timeline."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from memprobe.allocator.snapshot_replay import conf_from_snapshot, expandable_asked_not_run
from memprobe.attribute.allocator_view import (
    AllocatorView,
    block_bytes,
    largest_free_block_at,
    oom_verdict,
    segments_at,
)
from memprobe.attribute.categories import CATEGORIES
from memprobe.attribute.explain import Explanation
from memprobe.attribute.records import (
    BlockFinding,
    BlockGroup,
    OomFinding,
    SiteBytes,
    Timeline,
)
from memprobe.attribute.shapes import (
    ShapeInference,
)
from memprobe.attribute.sites import Site
from memprobe.attribute.trace_context import TraceContext
from memprobe.snapshot.replay import BEFORE_TRACE, Replay, ReplayBlock

TIMELINE_POINTS = 400
TIMELINE_MIN_BLOCK = 1 << 20  # smaller blocks are drawn together as "small blocks"
SMALL_BLOCKS = "small blocks (< 1 MiB)"


def phase_at_peak(rep: Replay, ctx: TraceContext, site: Site | None) -> str | None:
    if rep.peak_pos is None or rep.peak_pos < 0:
        return None
    return ctx.phases.phase(rep.peak_pos) or (site.phase if site else None)


def breakdown_of(live: list[ReplayBlock], ctx: TraceContext) -> tuple[tuple[str, int], ...]:
    totals: Counter[str] = Counter()
    for b in live:
        totals[ctx.verdict(b).category] += b.size
    return tuple(sorted(totals.items(), key=lambda kv: (-kv[1], CATEGORIES.index(kv[0]))))


def groups_of(live: list[ReplayBlock], ctx: TraceContext) -> tuple[BlockGroup, ...]:
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


def sites_of(live: list[ReplayBlock], ctx: TraceContext) -> tuple[SiteBytes, ...]:
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


def timeline_of(rep: Replay, ctx: TraceContext) -> Timeline:
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


def _count(meta: Any, key: str) -> int:
    """A count memprobe's own record in a snapshot holds: an int above 0, else 0 (a bool,
    a string or a negative number is no count memprobe wrote)."""
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def provenance_notes(snap: dict[str, Any], rep: Replay) -> tuple[str, ...]:
    notes = []
    meta = snap.get("memprobe")
    # memprobe writes a bool: a string ("no", "False") is true to bool(), and the note
    # called a real snapshot's segments memprobe's model.
    if isinstance(meta, dict) and meta.get("synthesized") is True:
        notes.append(
            "synthesized by memprobe from a tracked run: allocated bytes are exact; "
            "segments and reserved bytes are memprobe's model of the CUDA caching allocator"
        )
    threads = _count(meta, "threads_started")
    if threads:
        notes.append(
            f"the step started {threads:,} thread(s): memory allocated on them is not in this "
            "trace (memprobe tracks the thread that runs the step)"
        )
    off = _count(meta, "cuda_autocast_off")
    if off:
        notes.append(
            f"the step entered torch.autocast('cuda') {off:,} time(s), and torch turns it off "
            "without CUDA: this trace is the step in full precision, not the autocast step a "
            "GPU runs (memprobe cannot simulate CUDA autocast; profile it with --device cuda "
            "on a GPU)"
        )
    ignored = _count(meta, "autocast_not_applied")
    if ignored:
        on = meta.get("device") if isinstance(meta, dict) else None
        where = on if isinstance(on, str) and on in ("meta", "cpu") else "this device"
        hint = (
            "meta tensors take no autocast; profile CPU autocast with --device cpu"
            if where == "meta"
            else "autocast casts only its own device type's tensors"
        )
        notes.append(
            f"the step entered torch.autocast {ignored:,} time(s) for a device type its "
            f"tensors are not on: its autocast was not applied on {where}, so this trace is "
            f"the step in full precision ({hint})"
        )
    others = [d for d, t in enumerate(snap["device_traces"]) if t and d != rep.device]
    if others:
        listed = ", ".join(f"{d} ({len(snap['device_traces'][d]):,} entries)" for d in others)
        notes.append(f"attributed device {rep.device}; other devices with a trace: {listed}")
    return tuple(notes)


def largest_first(blocks: Any) -> list[ReplayBlock]:
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


def finding(
    b: ReplayBlock, ctx: TraceContext, live_at_peak: bool, oom_ids: list[set[int]]
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


def oom_finding(
    number: int,
    moment: Any,
    ctx: TraceContext,
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
        # What the allocator ran, not the text asked for ("expandable_segments:True"
        # is kept where the platform ignored it: "already on" was said of segments that
        # were never made).
        bool(view.expandable_segments) or conf_from_snapshot(snap).expandable_segments,
        expandable_ignored=expandable_asked_not_run(snap),
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
        breakdown=breakdown_of(live, ctx),
        verdict=verdict,
    )
