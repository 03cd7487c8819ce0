"""Snapshot → Findings: name the big blocks at the peak and at each out-of-memory.

For every block that matters (live at the peak, live at an OOM, or simply large) the
findings say how big it is, which ``[B, S, V] × dtype`` tensors it could be (most
likely first, with reasons), the op and the first user frame that made it, whether
it was made in forward or backward, how long it lived, and whether it was live at
the peak and at each OOM. ``Findings`` is a frozen record with a plain JSON form.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from memprobe.attribute.explain import Explanation, Hints, explain_block
from memprobe.attribute.frames import (
    clean_frames,
    first_user_frame,
    op_from_frames,
    phase_from_frames,
)
from memprobe.errors import UserError
from memprobe.records import Frame
from memprobe.snapshot.labels import parse_label, parse_shape
from memprobe.snapshot.load import DEFAULT_MAX_BYTES, load_snapshot, normalize_snapshot
from memprobe.snapshot.replay import BEFORE_TRACE, Replay, ReplayBlock, replay

DEFAULT_TOP = 10
DEFAULT_MIN_BLOCK_BYTES = 64 << 20  # "large": blocks listed even when not live at a peak/OOM
MAX_EXPLANATIONS = 8
PHASES = ("setup", "forward", "backward", "optimizer")


def _frame_json(frame: Frame | None) -> dict[str, Any] | None:
    return (
        None
        if frame is None
        else {"name": frame.name, "filename": frame.filename, "line": frame.line}
    )


def _frame_from_json(d: dict[str, Any] | None) -> Frame | None:
    return None if d is None else Frame(d["name"], d["filename"], d["line"])


@dataclass(frozen=True)
class BlockFinding:
    """One block: what it likely is, who made it, when, and whether it mattered."""

    address: int
    size: int  # requested bytes, as the trace records them
    block_size: int | None  # the allocator's block (rounded) when the segments show it
    dtype: str | None  # recorded by memprobe's label, else the best explanation's
    shape: tuple[int, ...] | None
    dtype_source: str | None  # "label" | "explanation" | None
    op: str | None
    op_source: str | None  # "label" | "frames" | None
    frame: Frame | None  # first user-code frame of the allocation
    phase: str | None  # "setup" | "forward" | "backward" | "optimizer" | None
    phase_reason: str
    alloc_index: int | None  # trace position; None: allocated before the trace began
    alloc_time_us: int | None
    free_index: int | None  # None: still live at the end of the trace
    free_time_us: int | None
    lifetime_us: int | None
    lifetime_entries: int | None
    live_at_peak: bool
    live_at_oom: bool
    oom_numbers: tuple[int, ...]  # which OOMs (positions in Findings.ooms) it was live at
    explanations: tuple[Explanation, ...]
    more_explanations: int  # fits left off the list
    label: str  # user_metadata as recorded
    stream: int

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "size": self.size,
            "block_size": self.block_size,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "dtype_source": self.dtype_source,
            "op": self.op,
            "op_source": self.op_source,
            "frame": _frame_json(self.frame),
            "phase": self.phase,
            "phase_reason": self.phase_reason,
            "alloc_index": self.alloc_index,
            "alloc_time_us": self.alloc_time_us,
            "free_index": self.free_index,
            "free_time_us": self.free_time_us,
            "lifetime_us": self.lifetime_us,
            "lifetime_entries": self.lifetime_entries,
            "live_at_peak": self.live_at_peak,
            "live_at_oom": self.live_at_oom,
            "oom_numbers": list(self.oom_numbers),
            "explanations": [e.to_json() for e in self.explanations],
            "more_explanations": self.more_explanations,
            "label": self.label,
            "stream": self.stream,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BlockFinding:
        return cls(
            **{
                **d,
                "shape": None if d["shape"] is None else tuple(d["shape"]),
                "frame": _frame_from_json(d["frame"]),
                "oom_numbers": tuple(d["oom_numbers"]),
                "explanations": tuple(Explanation.from_json(e) for e in d["explanations"]),
            }
        )


@dataclass(frozen=True)
class OomFinding:
    """One failed request and what held the memory then."""

    number: int
    index: int
    time_us: int | None
    requested_bytes: int
    device_free_bytes: int | None
    allocated_bytes: int  # allocated (by the trace's count) when the request failed
    live_count: int
    live_addresses: tuple[int, ...]  # listed findings live then, largest first
    op: str | None
    frame: Frame | None
    phase: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "index": self.index,
            "time_us": self.time_us,
            "requested_bytes": self.requested_bytes,
            "device_free_bytes": self.device_free_bytes,
            "allocated_bytes": self.allocated_bytes,
            "live_count": self.live_count,
            "live_addresses": list(self.live_addresses),
            "op": self.op,
            "frame": _frame_json(self.frame),
            "phase": self.phase,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OomFinding:
        return cls(
            **{
                **d,
                "live_addresses": tuple(d["live_addresses"]),
                "frame": _frame_from_json(d["frame"]),
            }
        )


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
    peak_reserved_bytes: int | None
    peak_reserved_index: int | None
    peak_reserved_time_us: int | None
    reserved_at_snapshot_bytes: int | None
    live_at_peak_count: int
    vocab: int | None
    tokens: int | None
    batch: int | None
    findings: tuple[BlockFinding, ...]
    ooms: tuple[OomFinding, ...]
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        scalars = {
            k: getattr(self, k)
            for k in self.__dataclass_fields__
            if k not in ("findings", "ooms", "notes")
        }
        return {
            **scalars,
            "findings": [f.to_json() for f in self.findings],
            "ooms": [o.to_json() for o in self.ooms],
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Findings:
        return cls(
            **{
                **d,
                "findings": tuple(BlockFinding.from_json(f) for f in d["findings"]),
                "ooms": tuple(OomFinding.from_json(o) for o in d["ooms"]),
                "notes": tuple(d["notes"]),
            }
        )


def attribute_file(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES, **options: Any
) -> Findings:
    """Load ``path`` safely and attribute it (options as for :func:`attribute`)."""
    snapshot = load_snapshot(path, max_bytes=max_bytes)
    return attribute(snapshot, path=str(path), **options)


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
) -> Findings:
    """Attribute a snapshot dict (as loaded, or as :func:`synthesize_snapshot` builds it).

    ``vocab`` / ``tokens`` / ``batch`` narrow the ``[B, S, V]`` explanations; ``top``
    bounds how many blocks are listed at the peak, at each OOM, and among the other
    blocks of at least ``min_block_bytes``.
    """
    for name, value in (("vocab", vocab), ("tokens", tokens), ("batch", batch), ("top", top)):
        _check_positive(name, value)
    # Normalising is idempotent and cheap (~0.1 s per 100k entries), so a dict from
    # load_snapshot, synthesize_snapshot or anywhere else is read the same way.
    snap = normalize_snapshot(snapshot, source=path or "<snapshot>")
    rep = replay(snap, device=device)
    live_peak = _largest(rep.live_at(rep.peak_pos))
    oom_live = [_largest(rep.live_at(m.pos)) for m in rep.ooms]

    chosen: dict[int, ReplayBlock] = {}
    for group in (live_peak, *oom_live):
        for b in group[:top]:
            chosen.setdefault(id(b), b)
    rest = _largest(b for b in rep.blocks if b.size >= min_block_bytes and id(b) not in chosen)
    for b in rest[:top]:
        chosen[id(b)] = b

    peak_ids = {id(b) for b in live_peak}
    oom_ids = [{id(b) for b in group} for group in oom_live]
    hints = (vocab, tokens, batch)
    sizes = frozenset(b.size for b in rep.blocks)
    findings = [_finding(b, rep, hints, id(b) in peak_ids, oom_ids, sizes) for b in chosen.values()]
    # Live at the peak first, then live at an OOM, then the rest; largest first in each.
    findings.sort(
        key=lambda f: (
            not f.live_at_peak,
            not f.live_at_oom,
            -f.size,
            BEFORE_TRACE if f.alloc_index is None else f.alloc_index,
        )
    )
    ooms = tuple(
        _oom(n, m, rep, group, top)
        for n, (m, group) in enumerate(zip(rep.ooms, oom_live, strict=True))
    )
    start = next((e["time_us"] for e in rep.entries if "time_us" in e), None)
    return Findings(
        path=path,
        source=rep.source,
        device=rep.device,
        trace_entries=len(rep.entries),
        trace_start_us=start,
        peak_allocated_bytes=rep.peak_allocated_bytes,
        peak_index=rep.peak_pos,
        peak_time_us=rep.time_at(rep.peak_pos),
        peak_reserved_bytes=rep.peak_reserved_bytes,
        peak_reserved_index=rep.peak_reserved_pos,
        peak_reserved_time_us=rep.time_at(rep.peak_reserved_pos),
        reserved_at_snapshot_bytes=rep.reserved_at_end_bytes,
        live_at_peak_count=len(live_peak),
        vocab=vocab,
        tokens=tokens,
        batch=batch,
        findings=tuple(findings),
        ooms=ooms,
        notes=rep.notes + _provenance_notes(snap, rep),
    )


def _provenance_notes(snap: dict[str, Any], rep: Replay) -> tuple[str, ...]:
    notes = []
    meta = snap.get("memprobe")
    if isinstance(meta, dict) and meta.get("synthesized"):
        notes.append(
            "synthesized by memprobe from a tracked (simulated) run: allocated bytes are "
            "exact; reserved bytes model an allocator without caching"
        )
    others = [d for d, t in enumerate(snap["device_traces"]) if t and d != rep.device]
    if others:
        listed = ", ".join(f"{d} ({len(snap['device_traces'][d]):,} entries)" for d in others)
        notes.append(f"attributed device {rep.device}; other devices with a trace: {listed}")
    return tuple(notes)


def _largest(blocks: Any) -> list[ReplayBlock]:
    return sorted(blocks, key=lambda b: (-b.size, b.alloc_pos))


def _origin(b: ReplayBlock) -> tuple[dict[str, Any], str]:
    """What best describes how the block was made (its alloc entry, else its block in
    ``segments``, else its free entry) and which of those it is."""
    if b.alloc_entry is not None:
        return b.alloc_entry, "alloc"
    if b.segment_block is not None:
        return b.segment_block, "segment"
    return b.free_entry or {}, "free"


def _finding(
    b: ReplayBlock,
    rep: Replay,
    hints: tuple[int | None, int | None, int | None],
    live_at_peak: bool,
    oom_ids: list[set[int]],
    block_sizes: frozenset[int],
) -> BlockFinding:
    origin, kind = _origin(b)
    frames = clean_frames(origin.get("frames"))
    label_text = origin.get("user_metadata", "")
    label_text = label_text if isinstance(label_text, str) else ""
    label = parse_label(label_text)
    op, op_source = label.get("op"), "label" if label.get("op") else None
    if op is None:
        op = op_from_frames(frames)
        op_source = "frames" if op else None
    phase = label.get("phase") if label.get("phase") in PHASES else None
    phase_reason = "memprobe's label" if phase else ""
    if kind == "free":
        # Only its free was recorded: a label or stack there describes the free.
        phase, phase_reason = None, "allocated before the recorded trace (only its free is in it)"
    elif phase is None:
        phase, phase_reason = phase_from_frames(frames)
    recorded_dtype = label["dtype"].removeprefix("torch.") if label.get("dtype") else None
    recorded_shape = parse_shape(label.get("shape"))
    vocab, tokens, batch = hints
    exact_size = (
        b.alloc_entry is not None
        or b.free_entry is not None
        or (
            b.segment_block is not None
            and b.segment_block.get("requested_size") != b.segment_block.get("size")
        )
    )
    explanations = explain_block(
        b.size,
        Hints(vocab, tokens, batch, op, recorded_dtype, recorded_shape, block_sizes),
        exact_size=exact_size,
    )
    if recorded_dtype:
        dtype, shape, dtype_source = recorded_dtype, recorded_shape, "label"
    elif explanations:
        dtype, shape, dtype_source = explanations[0].dtype, explanations[0].shape, "explanation"
    else:
        dtype = shape = dtype_source = None
    alloc_index = None if b.alloc_pos == BEFORE_TRACE else b.alloc_pos
    alloc_time = rep.time_at(alloc_index)
    free_time = rep.time_at(b.free_pos)
    numbers = tuple(n for n, ids in enumerate(oom_ids) if id(b) in ids)
    return BlockFinding(
        address=b.addr,
        size=b.size,
        block_size=b.segment_block.get("size") if b.segment_block else None,
        dtype=dtype,
        shape=shape,
        dtype_source=dtype_source,
        op=op,
        op_source=op_source,
        frame=first_user_frame(frames),
        phase=phase,
        phase_reason=phase_reason,
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
        explanations=tuple(explanations[:MAX_EXPLANATIONS]),
        more_explanations=max(0, len(explanations) - MAX_EXPLANATIONS),
        label=label_text,
        stream=origin.get("stream", 0),
    )


def _oom(number: int, moment: Any, rep: Replay, live: list[ReplayBlock], top: int) -> OomFinding:
    e = moment.entry
    frames = clean_frames(e.get("frames"))
    label = parse_label(e.get("user_metadata", ""))
    phase = label.get("phase") if label.get("phase") in PHASES else phase_from_frames(frames)[0]
    return OomFinding(
        number=number,
        index=moment.pos,
        time_us=e.get("time_us"),
        requested_bytes=e["size"],
        device_free_bytes=e.get("device_free"),
        allocated_bytes=moment.allocated_bytes,
        live_count=len(live),
        live_addresses=tuple(b.addr for b in live[:top]),
        op=label.get("op") or op_from_frames(frames),
        frame=first_user_frame(frames),
        phase=phase,
    )
