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
from dataclasses import dataclass
from typing import Any

from memprobe.attribute.allocator_view import (
    AllocatorView,
    allocator_view,
)
from memprobe.attribute.finding_parts import (
    breakdown_of,
    finding,
    groups_of,
    largest_first,
    oom_finding,
    phase_at_peak,
    provenance_notes,
    sites_of,
    timeline_of,
)
from memprobe.attribute.records import (
    BlockFinding,
    BlockGroup,
    OomFinding,
    SiteBytes,
    Timeline,
)
from memprobe.attribute.shapes import (
    Hints,
    ShapeInference,
)
from memprobe.attribute.trace_context import TraceContext
from memprobe.errors import UserError
from memprobe.records import MAX_COUNT, Frame
from memprobe.snapshot.load import DEFAULT_MAX_BYTES, load_snapshot, normalize_snapshot
from memprobe.snapshot.replay import BEFORE_TRACE, OomMoment, ReplayBlock, replay

DEFAULT_TOP = 10
DEFAULT_MIN_BLOCK_BYTES = 64 << 20  # "large": blocks listed even when not live at a peak/OOM
# OOMs detailed (what was live, the allocator at that moment): each one walks the trace
# after it and the blocks live then, so a trace of thousands of OOMs (a loop that catches
# OOM and retries) took minutes. The first are the failure; the rest are counted.
MAX_OOMS_DETAILED = 20

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
    more_ooms: int = 0  # OOMs in the trace past the MAX_OOMS_DETAILED in ``ooms``

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
    """Each device with a trace, then each that only holds segments: a device idle while
    history was recorded (or whose memory was allocated before) has an empty trace, yet
    its live blocks are the file's too; they were left out of every reading."""
    traces = snapshot.get("device_traces", [])
    with_trace = [d for d, t in enumerate(traces) if t]
    held = sorted({s.get("device", 0) for s in snapshot.get("segments", [])} - set(with_trace))
    return [*with_trace, *held] or [0]


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
    # A device without a trace is never the lead: its "peak" is only what it held at the
    # end, and the lead is the device whose step was recorded.
    found.sort(key=lambda f: (not f.ooms, not f.trace_entries, -f.peak_allocated_bytes, f.device))
    return tuple(found)


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UserError(f"{name} must be a positive integer, got {value!r}")


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
    _check_vocab_against_record(snap, vocab)
    hints = _given_over_recorded(recorded_case_hints(snap), vocab, tokens, batch)
    ctx = TraceContext(rep, hints, simulated=simulated_clock(snap))
    live_peak = largest_first(rep.live_at(rep.peak_pos))
    detailed = rep.ooms[:MAX_OOMS_DETAILED]
    oom_live = [largest_first(rep.live_at(m.pos)) for m in detailed]

    chosen: dict[int, ReplayBlock] = {}
    for group in (live_peak, *oom_live):
        for b in group[:top]:
            chosen.setdefault(id(b), b)
    family_sizes = {size for size, _ in ctx.shapes.family} | ctx.shapes.family_sizes()
    for b in rep.blocks:
        if (b.size in family_sizes or ctx.site(b).label_shape) and ctx.verdict(b).logits:
            chosen.setdefault(id(b), b)
    rest = largest_first(b for b in rep.blocks if b.size >= min_block_bytes and id(b) not in chosen)
    for b in rest[:top]:
        chosen[id(b)] = b

    peak_ids = {id(b) for b in live_peak}
    oom_ids = [{id(b) for b in group} for group in oom_live]
    findings = [finding(b, ctx, id(b) in peak_ids, oom_ids) for b in chosen.values()]
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
        oom_finding(n, m, ctx, group, top, view, snap)
        for n, (m, group) in enumerate(zip(detailed, oom_live, strict=True))
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
        peak_phase=phase_at_peak(rep, ctx, peak_site),
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
        breakdown=breakdown_of(live_peak, ctx),
        groups=groups_of(live_peak, ctx),
        peak_sites=sites_of(live_peak, ctx),
        findings=tuple(findings),
        ooms=ooms,
        allocator=view,
        timeline=timeline_of(rep, ctx) if timeline else None,
        notes=rep.notes + provenance_notes(snap, rep) + _more_ooms_note(rep.ooms),
        more_ooms=len(rep.ooms) - len(detailed),
        times="simulated" if ctx.simulated else ("measured" if start is not None else "none"),
    )


def _more_ooms_note(ooms: tuple[OomMoment, ...]) -> tuple[str, ...]:
    if len(ooms) <= MAX_OOMS_DETAILED:
        return ()
    return (
        f"{len(ooms):,} OOMs in the trace: the first {MAX_OOMS_DETAILED} are detailed "
        f"(the last is at entry #{ooms[-1].pos})",
    )


def _given_over_recorded(
    recorded: Hints, vocab: int | None, tokens: int | None, batch: int | None
) -> Hints:
    """The shape flags over what a memprobe run recorded for its snapshot. The record's
    N = B·S is exact (its blocks were made at it): one of --tokens/--batch splits it, and
    two that make another N contradict it (taken as given, they read a B=1 record at
    --batch 2 as a chunked loop over twice its tokens)."""
    hidden = recorded.hidden
    vocab = vocab if vocab is not None else recorded.vocab
    if recorded.tokens is None or recorded.batch is None or (tokens is None and batch is None):
        return Hints(vocab, tokens or recorded.tokens, batch or recorded.batch, hidden)
    n = recorded.tokens * recorded.batch
    record = f"memprobe recorded B={recorded.batch:,}, S={recorded.tokens:,}"
    if tokens is not None and batch is not None:
        if tokens * batch != n:
            raise UserError(
                f"--batch {batch:,} × --tokens {tokens:,} = {tokens * batch:,} tokens, but this "
                f"snapshot's case has {n:,} ({record})",
                f"drop --batch/--tokens (the record gives them), or two whose product is {n:,}",
            )
        return Hints(vocab, tokens, batch, hidden)
    given, flag = (batch, "--batch") if batch is not None else (tokens, "--tokens")
    assert given is not None
    if n % given:
        raise UserError(
            f"{flag} {given:,} does not divide the {n:,} tokens of this snapshot's case ({record})",
            f"drop {flag} (the record gives it), or give a divisor of {n:,}",
        )
    other = n // given
    if batch is not None:
        return Hints(vocab, other, batch, hidden)
    return Hints(vocab, tokens, other, hidden)


def _check_vocab_against_record(snap: dict[str, Any], vocab: int | None) -> None:
    """--vocab against the V a memprobe run recorded for its snapshot's case: the case's V
    (or, vocabulary-parallel, a rank's V/tp), as exact as its N. Taken as given, --vocab
    256 on a V=128 case read its float32 [64, 128] loss blocks as bfloat16 [64, 256] logits
    and --vocab 64 its logits as [V, H] weights, "confidence given"."""
    recorded = recorded_case_hints(snap)
    if vocab is None or recorded.vocab is None:
        return
    meta = snap.get("memprobe")
    match = _CASE_SHAPE.search(str(meta.get("case") if isinstance(meta, dict) else ""))
    whole = int(match.group(4)) if match else recorded.vocab
    if vocab not in (whole, recorded.vocab):
        per_rank = f", {recorded.vocab:,} per rank" if whole != recorded.vocab else ""
        raise UserError(
            f"--vocab {vocab:,}, but this snapshot's case has V={whole:,}{per_rank} "
            "(memprobe recorded it)",
            "drop --vocab (the record gives it)",
        )


def simulated_clock(snap: dict[str, Any]) -> bool:
    """Whether the trace's times are memprobe's simulation clock (a meta run): they
    time Python on the host, not the device, and must never read as measured."""
    meta = snap.get("memprobe")
    return isinstance(meta, dict) and meta.get("clock") == "simulation"


# A case id's shapes: "-h4096" only for the hidden family. Its numbers are the digits
# 0-9, at most 13 of them (a count memprobe runs is below 2^40): \d read any script's
# digits, and int() of a 5,000-digit one raised past Python's 4,300 (a traceback).
_N = "([0-9]{1,13})"
_CASE_SHAPE = re.compile(
    rf"(?:-h{_N})?-b{_N}-s{_N}-v{_N}-[a-z0-9]+-c(?:[0-9]{{1,13}}|none)-tp{_N}-cp{_N}-"
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
    if min(b, s, v, tp, cp) < 1 or max(b, s, v, tp, cp, int(h or 0)) > MAX_COUNT:
        return Hints()
    sizes = Hints(vocab=v // tp, tokens=s // cp, batch=b, hidden=int(h) if h else None)
    # memprobe never runs a case with a size of 0 (nor a shard of none: V < tp, S < cp):
    # such an id is an edited file's, no record, and read as one its 0 divided shapes.
    if min(x for x in (sizes.vocab, sizes.tokens, sizes.batch, sizes.hidden) if x is not None) < 1:
        return Hints()
    return sizes
