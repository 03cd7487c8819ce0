"""Replay a snapshot's trace: every block's life, the peak moment, reserved bytes, OOMs.

Counting follows torch: a block counts from its ``alloc`` until its ``free_completed``
(a ``free_requested`` only marks the program letting go; the bytes stay allocated
until the stream work that used them is done). A ``free_requested`` that is never
completed (older files, or trimmed traces) frees at the request, unless the
segments still show that block pending, in which case it is still live.

A trace is a ring buffer window: blocks made before the window show up as frees
with no alloc, or as live blocks in ``segments`` that the trace never mentions.
Both were live from the start of the window; counting them makes the window's
allocated bytes absolute, not relative.

Sizes are what the trace records: the requested bytes of each tensor, before the
allocator rounds them up (the rounded block sizes are in ``segments``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from memprobe.allocator.snapshot_format import (
    ACTIVE_PENDING_FREE,
    FREED,
    LIVE_STATES,
    SEGMENT_GROW,
    SEGMENT_SHRINK,
)
from memprobe.errors import UserError
from memprobe.snapshot.segments import reserved_bytes

BEFORE_TRACE = -1  # position of "before the first recorded entry"


@dataclass(slots=True)
class ReplayBlock:
    """One block's life in trace positions (``alloc_pos`` −1: already live at the start;
    ``free_pos`` None: still live at the end)."""

    addr: int
    size: int
    alloc_pos: int
    free_pos: int | None
    alloc_entry: dict[str, Any] | None
    free_entry: dict[str, Any] | None = None
    segment_block: dict[str, Any] | None = None

    def live_at(self, pos: int | None) -> bool:
        if pos is None:  # "at snapshot time"
            return self.free_pos is None
        return self.alloc_pos <= pos and (self.free_pos is None or self.free_pos > pos)


@dataclass(frozen=True, slots=True)
class OomMoment:
    pos: int
    entry: dict[str, Any]
    allocated_bytes: int
    reserved_bytes: int | None = None  # None: no segment events to count them from


@dataclass(frozen=True)
class Replay:
    device: int
    source: str  # "trace" or "segments" (no trace: what is live at snapshot time)
    entries: list[dict[str, Any]]
    blocks: list[ReplayBlock]
    peak_allocated_bytes: int
    peak_pos: int | None  # BEFORE_TRACE, an entry position, or None for "snapshot time"
    peak_reserved_bytes: int | None
    peak_reserved_pos: int | None
    allocated_at_end_bytes: int
    reserved_at_end_bytes: int | None
    ooms: tuple[OomMoment, ...]
    notes: tuple[str, ...] = field(default=())
    reserved_at_peak_bytes: int | None = None

    def live_at(self, pos: int | None) -> list[ReplayBlock]:
        return [b for b in self.blocks if b.live_at(pos)]

    def time_at(self, pos: int | None) -> int | None:
        if pos is None or pos < 0 or pos >= len(self.entries):
            return None
        return self.entries[pos].get("time_us")


def choose_device(snapshot: dict[str, Any], device: int | None = None) -> int:
    """The device to attribute: as asked, else the one with the longest trace, else the
    one whose segments hold the most live bytes."""
    traces = snapshot.get("device_traces", [])
    seg_devices = {s.get("device", 0) for s in snapshot.get("segments", [])}
    if device is not None:
        if device < 0 or (device >= len(traces) and device not in seg_devices):
            known = sorted({d for d, t in enumerate(traces) if t} | seg_devices)
            raise UserError(
                f"the snapshot has nothing for device {device}",
                f"devices with data: {', '.join(map(str, known)) or 'none'}",
            )
        return device
    lengths = [(len(t), -d) for d, t in enumerate(traces) if t]
    if lengths:
        return -max(lengths)[1]
    live: Counter[int] = Counter()
    for s in snapshot.get("segments", []):
        live[s.get("device", 0)] += sum(b["size"] for b in s["blocks"] if b["state"] in LIVE_STATES)
    return live.most_common(1)[0][0] if live else 0


def _unpaired_requests(entries: list[dict[str, Any]], pending_at_end: set[int]) -> set[int]:
    """Positions of ``free_requested`` entries no ``free_completed`` follows: those free
    at the request (a block still pending in ``segments`` stays live instead)."""
    pending: dict[int, int] = {}
    unpaired: set[int] = set()
    for pos, e in enumerate(entries):
        action = e["action"]
        if action == "free_requested":
            previous = pending.get(e["addr"])
            if previous is not None:
                unpaired.add(previous)
            pending[e["addr"]] = pos
        elif action in FREED:
            pending.pop(e["addr"], None)
        elif action == "alloc":
            previous = pending.pop(e["addr"], None)
            if previous is not None:
                unpaired.add(previous)
    unpaired.update(pos for addr, pos in pending.items() if addr not in pending_at_end)
    return unpaired


def _untimed_if_clock_goes_back(
    entries: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], str | None]:
    """The entries, without their times when the trace's clock runs backwards (an edited
    file, or another tool's clock): every moment and lifetime is a difference of two
    times, and such a trace printed "t=+-23 us" and "lived -46 us". Entry numbers still
    order the trace; the note says why its times are not shown.

    So are the times of a trace that gives some entries one and not others (torch times
    every entry or none: two traces merged, or an edited file): the peak at an untimed
    entry read beside "t=+0 us" of a timed one, under the note that the entries "carry
    no time_us"."""
    last_pos = last = None
    for pos, e in enumerate(entries):
        t = e.get("time_us")
        if t is None:
            continue
        if last is not None and last_pos is not None and t < last:
            note = (
                f"the trace's clock runs backwards (entry #{pos} is {last - t:,} us before "
                f"entry #{last_pos}): its times are not shown; moments are entry numbers"
            )
            return [{k: v for k, v in x.items() if k != "time_us"} for x in entries], note
        last_pos, last = pos, t
    timed = sum("time_us" in e for e in entries)
    if 0 < timed < len(entries):
        note = (
            f"only {timed:,} of the trace's {len(entries):,} entries carry a time_us: its "
            "times are not shown; moments are entry numbers"
        )
        return [{k: v for k, v in x.items() if k != "time_us"} for x in entries], note
    return entries, None


def replay(snapshot: dict[str, Any], *, device: int | None = None) -> Replay:
    """Replay one device of a normalised snapshot (see ``load.normalize_snapshot``)."""
    dev = choose_device(snapshot, device)
    traces = snapshot.get("device_traces", [])
    entries: list[dict[str, Any]] = traces[dev] if dev < len(traces) else []
    segments = [s for s in snapshot.get("segments", []) if s.get("device", 0) == dev]
    end_live = {b["address"]: b for s in segments for b in s["blocks"] if b["state"] in LIVE_STATES}
    reserved_end = reserved_bytes(segments)
    if not entries:
        return _from_segments(dev, entries, end_live, reserved_end, bool(segments))
    entries, clock_note = _untimed_if_clock_goes_back(entries)

    pending_at_end = {a for a, b in end_live.items() if b["state"] == ACTIVE_PENDING_FREE}
    unpaired = _unpaired_requests(entries, pending_at_end)
    live: dict[int, ReplayBlock] = {}
    blocks: list[ReplayBlock] = []
    seen: set[int] = set()
    delta = max_delta = 0
    peak_pos = BEFORE_TRACE
    initial = 0  # bytes live before the window, found as we go
    r_delta = r_max = 0
    r_peak_pos = BEFORE_TRACE
    r_at_peak = 0
    segment_events = 0
    oom_marks: list[tuple[int, dict[str, Any], int, int]] = []
    before_window = implicit = 0
    unknown: Counter[str] = Counter()

    for pos, e in enumerate(entries):
        action = e["action"]
        if action == "alloc":
            addr, size = e["addr"], e["size"]
            seen.add(addr)
            old = live.pop(addr, None)
            if old is not None:  # two allocs at one address with no free between
                old.free_pos = pos
                delta -= old.size
                implicit += 1
            block = ReplayBlock(addr, size, pos, None, e)
            live[addr] = block
            blocks.append(block)
            delta += size
            if delta > max_delta:
                max_delta, peak_pos, r_at_peak = delta, pos, r_delta
        elif action in FREED or (action == "free_requested" and pos in unpaired):
            addr = e["addr"]
            seen.add(addr)
            freed = live.pop(addr, None)
            if freed is None:
                freed = ReplayBlock(addr, e["size"], BEFORE_TRACE, pos, None, e)
                blocks.append(freed)
                initial += freed.size
                before_window += 1
            else:
                freed.free_pos, freed.free_entry = pos, e
            delta -= freed.size
        elif action in SEGMENT_GROW:
            segment_events += 1
            r_delta += e["size"]
            if r_delta > r_max:
                r_max, r_peak_pos = r_delta, pos
        elif action in SEGMENT_SHRINK:
            segment_events += 1
            r_delta -= e["size"]
        elif action == "oom":
            oom_marks.append((pos, e, delta, r_delta))
        elif action not in ("free_requested", "snapshot"):
            unknown[action] += 1

    notes: list[str] = []
    # Live at the end per segments but never mentioned by the trace: live throughout.
    untouched = 0
    for addr, sb in end_live.items():
        tracked = live.get(addr)
        if tracked is not None:
            tracked.segment_block = sb
        elif addr not in seen:
            blocks.append(
                ReplayBlock(addr, sb["requested_size"], BEFORE_TRACE, None, None, None, sb)
            )
            initial += sb["requested_size"]
            untouched += 1
    if before_window:
        notes.append(
            f"{before_window} block(s) are freed in the trace but never allocated in it: the "
            "trace is a ring buffer that dropped older entries, so the peak is the peak of the "
            "recorded window (those blocks are counted from its start)"
        )
    if untouched:
        notes.append(
            f"{untouched} block(s) live at snapshot time were allocated before the trace began"
        )
    if implicit:
        notes.append(
            f"{implicit} alloc(s) reused a live address with no free between; "
            "the older block was counted as freed there"
        )
    if unknown:
        names = ", ".join(f"{a} ×{n}" for a, n in sorted(unknown.items()))
        notes.append(f"ignored trace actions memprobe does not know: {names}")
    if clock_note is not None:
        notes.append(clock_note)
    elif "time_us" not in entries[0]:
        notes.append("trace entries carry no time_us (older torch): moments are entry numbers")

    allocated_end = initial + delta
    seg_requested = sum(b["requested_size"] for b in end_live.values())
    if segments and seg_requested != allocated_end:
        notes.append(
            f"the trace ends with {allocated_end} bytes allocated but the segments hold "
            f"{seg_requested}: segments and trace disagree (private pools or another process?)"
        )
    peak_reserved = peak_reserved_pos = None
    baseline: int | None = None
    if segment_events:
        baseline = reserved_end - r_delta
        lower_bound = baseline < 0  # said once: the note below
        if lower_bound:
            notes.append(
                "segment events free more than the segments held: reserved bytes are a lower bound"
            )
            baseline = 0
        peak_reserved, peak_reserved_pos = baseline + r_max, r_peak_pos
        held = baseline + r_at_peak
        if held < initial + max_delta and not lower_bound:
            # torch allocates inside segments: its trace never holds more than they
            # reserve. A file that does (an alloc's size edited, devices mixed) gave
            # "peak allocated 1 GiB, peak reserved 2 MiB" and "0 B of it not allocated".
            notes.append(
                f"at the peak the trace holds {initial + max_delta:,} bytes allocated but its "
                f"segments reserve {held:,}: allocation and segment sizes disagree, so "
                "reserved bytes are a lower bound"
            )

    elif segments and reserved_end < initial + max_delta:
        # No segment events: what the segments reserve now, they reserved throughout.
        notes.append(
            f"at the peak the trace holds {initial + max_delta:,} bytes allocated but, with no "
            f"segment events, its segments reserved {reserved_end:,} throughout: allocation "
            "and segment sizes disagree"
        )

    return Replay(
        device=dev,
        source="trace",
        entries=entries,
        blocks=blocks,
        peak_allocated_bytes=initial + max_delta,
        peak_pos=peak_pos,
        peak_reserved_bytes=peak_reserved,
        peak_reserved_pos=peak_reserved_pos,
        allocated_at_end_bytes=allocated_end,
        reserved_at_end_bytes=reserved_end if segments or segment_events else None,
        ooms=tuple(
            OomMoment(pos, e, initial + d, None if baseline is None else baseline + r)
            for pos, e, d, r in oom_marks
        ),
        notes=tuple(notes),
        reserved_at_peak_bytes=None if baseline is None else baseline + r_at_peak,
    )


def _from_segments(
    dev: int,
    entries: list[dict[str, Any]],
    end_live: dict[int, dict[str, Any]],
    reserved_end: int,
    has_segments: bool,
) -> Replay:
    """No trace: all that is known is what the segments hold at snapshot time."""
    blocks = [
        ReplayBlock(addr, sb["requested_size"], BEFORE_TRACE, None, None, None, sb)
        for addr, sb in end_live.items()
    ]
    allocated = sum(b.size for b in blocks)
    reserved = reserved_end if has_segments else None
    return Replay(
        device=dev,
        source="segments",
        entries=entries,
        blocks=blocks,
        peak_allocated_bytes=allocated,
        peak_pos=None,
        peak_reserved_bytes=reserved,
        peak_reserved_pos=None,
        allocated_at_end_bytes=allocated,
        reserved_at_end_bytes=reserved,
        ooms=(),
        reserved_at_peak_bytes=reserved,
        notes=(
            "the snapshot has no trace (recorded without history, or an empty trace): "
            "figures are what was live when the snapshot was taken, not a peak",
        ),
    )
