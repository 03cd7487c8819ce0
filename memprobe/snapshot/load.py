"""Load a CUDA allocator snapshot safely and normalise the variants real files have.

A pickle can run code while it loads. A real snapshot holds only plain data (dict,
list, tuple, str, int, float, bool, None), so the unpickler here refuses every
global: a file that names one is rejected before anything it names is touched.
"""

from __future__ import annotations

import gc
import io
import math
import os
import pickle
from pathlib import Path
from typing import Any, TypeGuard

from memprobe.allocator.snapshot_format import (
    ACTIONS,
    ACTIVE_ALLOCATED,
    ADDRESSED_ACTIONS,
    FREE,
    INACTIVE,
    LIVE_STATES,
    OOM,
    STATE_ALIASES,
)
from memprobe.errors import UserError
from memprobe.snapshot.mistaken import read_snapshot_file
from memprobe.snapshot.nesting import check_tuple_nesting
from memprobe.snapshot.segments import check_segment_kinds, reconcile_segment_allocs, segment_kind

DEFAULT_MAX_BYTES = 2 * 2**30
# What normalization and attribution will walk: trace entries, segments and blocks, and
# the frames of each (a shared frames list counts once per holder, as it is walked).
# A 10^6-entry file attributes in ~9 s and ~1.2 GiB: 5x that is the most read.
MAX_ENTRIES = 5_000_000
MAX_FRAMES = 100_000_000
# Sizes, addresses and times are 64-bit in the allocator; a larger number is tampering
# (and one of 4,300+ digits cannot even be printed).
_U64 = 2**64
# allocator_settings hold numbers, strings and (roundup divisions) one flat dict or list.
MAX_SETTINGS_DEPTH = 4
_HINT = "expected the pickle written by torch.cuda.memory._dump_snapshot() or memprobe"
# Actions whose entry must name a block or segment address and a size (early history
# files' single free action too).
_NEEDS_ADDR = frozenset([*ADDRESSED_ACTIONS, FREE])
_NEEDS_SIZE = _NEEDS_ADDR | {OOM}


class _Refused(Exception):
    """The pickle asked for something a plain-data snapshot never needs."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # Every class, function and reduce target arrives through here; refusing
        # them all means nothing named in the file can run.
        raise _Refused(f"the Python object {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent object (an id the loader is to resolve)")


def load_snapshot(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """Read ``path`` and return the snapshot dict, normalised (see :func:`normalize_snapshot`).

    Raises :class:`UserError` with one clear line for a missing, empty, oversized,
    truncated, corrupt, unsafe, or not-a-snapshot file.
    """
    p = Path(path)
    data = _read_bytes(p, max_bytes)
    raw = _unpickle(data, p)
    return normalize_snapshot(raw, source=str(p))


def _read_bytes(p: Path, max_bytes: int) -> bytes:
    data = read_snapshot_file(
        p,
        what="snapshot",
        max_bytes=max_bytes,
        too_big="record fewer entries (max_entries=...) or raise max_bytes in load_snapshot()",
    )
    if not data:
        raise UserError(f"snapshot {p} is empty (0 bytes)", _HINT)
    return data


def _sniff(data: bytes) -> str | None:
    """Name what a non-pickle file looks like, so the error says what to do instead."""
    head = data[:64].lstrip()
    if data[:2] == b"\x1f\x8b":
        return "gzip-compressed; decompress it first (gunzip)"
    if data[:4] == b"PK\x03\x04":
        return "a zip archive (a torch.save file?), not a snapshot pickle"
    if head[:1] == b"<":
        return "an HTML/XML page (a memory_viz export?), not the snapshot pickle"
    if head[:1] in (b"{", b"["):
        return "JSON or text, not a pickle"
    return None


def _unpickle(data: bytes, p: Path) -> Any:
    is_pickle = data[:1] == b"\x80"  # PROTO opcode: every protocol ≥ 2 pickle starts with it
    if not is_pickle:
        looks = _sniff(data)
        if looks:
            raise UserError(f"snapshot {p} is {looks}", _HINT)
    check_tuple_nesting(data, str(p), _HINT)
    # A snapshot is millions of small dicts and lists: the cyclic GC would scan them
    # again and again while they are built (none of them can form a cycle worth it).
    was_enabled = gc.isenabled()
    gc.disable()
    stream = io.BytesIO(data)
    try:
        raw = _PlainDataUnpickler(stream).load()
    except _Refused as exc:
        raise UserError(
            f"refused to load snapshot {p}: it references {exc}, "
            "which a real snapshot never does (loading it could run code)",
            "only load snapshots you trust; memprobe reads plain data only",
        ) from None
    except EOFError:
        raise UserError(f"snapshot {p} is truncated (the pickle ends early)", _HINT) from None
    except pickle.UnpicklingError as exc:
        if "truncated" in str(exc):
            raise UserError(f"snapshot {p} is truncated (the pickle ends early)", _HINT) from None
        what = "corrupt" if is_pickle else "not a pickle"
        raise UserError(f"snapshot {p} is {what} ({exc})", _HINT) from None
    except (MemoryError, RecursionError):
        raise UserError(f"snapshot {p} is too large or too deeply nested to load", _HINT) from None
    except Exception as exc:  # any other unpickling failure means a bad file
        what = "corrupt" if is_pickle else "not a pickle"
        raise UserError(f"snapshot {p} is {what} ({type(exc).__name__}: {exc})", _HINT) from None
    finally:
        if was_enabled:
            gc.enable()
    left = len(data) - stream.tell()
    if left:
        # The unpickler stops at the first pickle's end: the rest of a file of two joined
        # snapshots (cat rank0.pickle rank1.pickle), or of a damaged copy, went unread,
        # and the first one's numbers were printed as the file's.
        raise UserError(
            f"snapshot {p} holds {left:,} bytes after its pickle ends "
            "(two files joined, or a damaged copy)",
            _HINT,
        )
    return raw


# How much of a value from the file one message quotes: a key or action of megabytes would
# make the one line megabytes long.
_QUOTE_CHARS = 60


def _quoted(value: Any) -> str:
    """``value`` as a message quotes it: its repr, cut to :data:`_QUOTE_CHARS`. An int past
    64 bits is said by its size (repr raises past 4,300 digits); a tuple or any other
    container by its type (its repr would hold such ints, or megabytes)."""
    if isinstance(value, int) and not isinstance(value, bool) and not -_U64 < value < _U64:
        return f"(an integer of {value.bit_length():,} bits)"
    if not isinstance(value, (str, bytes, int, float, bool, type(None))):
        return f"(a {type(value).__name__})"
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        keys = ", ".join(_quoted(k) for k in list(value)[:5])
        return f"a dict with keys {keys}" if value else "an empty dict"
    if isinstance(value, (list, tuple)):
        n = len(value)
        return f"a {type(value).__name__} of {n} item{'' if n == 1 else 's'}"
    return f"a {type(value).__name__}"


def _is_int(value: object) -> TypeGuard[int]:
    """A whole number in the allocator's 64-bit range (signed or not)."""
    return isinstance(value, int) and not isinstance(value, bool) and -_U64 < value < _U64


class _Bad:
    """Builds the one-line error for a malformed part of the snapshot."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, where: str, problem: str) -> UserError:
        return UserError(
            f"snapshot {self.source} is not a valid CUDA memory snapshot: {where} {problem}", _HINT
        )


def normalize_snapshot(raw: Any, *, source: str = "<snapshot>") -> dict:
    """Return a torch-shaped snapshot dict with the variants of real files made uniform.

    - A bare list of segments (the oldest format) becomes ``{"segments": [...]}``.
    - Missing ``device_traces``, ``segments``, ``allocator_settings`` and
      ``external_annotations`` become empty.
    - Block state ``active_awaiting_free`` becomes ``active_pending_free``; blocks get
      ``address``, ``requested_size`` and ``frames`` (from legacy ``history`` when that
      is all they have); segments get their size totals when absent.
    - Trace entries keep torch's keys; ``time_us`` stays absent when the file has none
      (no time is invented), ``oom`` keeps ``device_free`` and has no ``addr``.

    Frames are passed through as they are: they are cleaned lazily by the code that
    reads them (:mod:`memprobe.attribute.frames`), which keeps large traces fast.
    """
    bad = _Bad(source)
    if isinstance(raw, list) and raw and all(isinstance(s, dict) and "blocks" in s for s in raw):
        raw = {"segments": raw}
    if not isinstance(raw, dict) or not ({"segments", "device_traces"} & set(raw)):
        raise UserError(
            f"snapshot {source} is a pickle but not a CUDA memory snapshot: "
            f"it holds {_describe(raw)}",
            "expected the dict from torch.cuda.memory._snapshot() "
            "with 'segments' and 'device_traces'",
        )
    segments = raw.get("segments") or []
    traces = raw.get("device_traces") or []
    if not isinstance(segments, list):
        raise bad("'segments'", f"is {_describe(segments)}, not a list")
    if not isinstance(traces, list):
        raise bad("'device_traces'", f"is {_describe(traces)}, not a list")
    _check_expansion(segments, traces, source)
    out: dict[str, Any] = {k: v for k, v in raw.items()}
    out["segments"] = [_segment(s, i, bad) for i, s in enumerate(segments)]
    _check_segments_apart(out["segments"], bad)
    out["device_traces"] = [_trace(t, d, bad) for d, t in enumerate(traces)]
    reconcile_segment_allocs(out["segments"], out["device_traces"])
    check_segment_kinds(out["segments"], out["device_traces"], bad)
    settings = raw.get("allocator_settings")
    out["allocator_settings"] = settings if isinstance(settings, dict) else {}
    if _depth(out["allocator_settings"], MAX_SETTINGS_DEPTH) > MAX_SETTINGS_DEPTH:
        raise bad("'allocator_settings'", f"nest more than {MAX_SETTINGS_DEPTH} levels deep")
    annotations = raw.get("external_annotations")
    out["external_annotations"] = annotations if isinstance(annotations, list) else []
    return out


def _depth(value: Any, limit: int) -> int:
    """How deep lists and dicts nest in ``value``, counted without recursion, up to
    ``limit + 1`` (deeper is not explored: a file can nest a million levels)."""
    deepest, level = 0, [value]
    while level and deepest <= limit:
        deepest += 1
        inner: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                inner.extend(v.values())
            elif isinstance(v, (list, tuple)):
                inner.extend(v)
        level = [v for v in inner if isinstance(v, (dict, list, tuple))]
    return deepest if not level else limit + 1


def _check_expansion(segments: list, traces: list, source: str) -> None:
    """Refuse a file whose shared pickle references would expand past what any real
    snapshot holds: a few MB of repeated references can stand for billions of entries.

    Counted before anything is copied, from list lengths alone (cheap)."""
    entries = len(segments) + sum(len(t) for t in traces if isinstance(t, list))
    entries += sum(
        len(s.get("blocks") or [])
        for s in segments
        if isinstance(s, dict) and isinstance(s.get("blocks"), list)
    )
    frames = 0
    if entries <= MAX_ENTRIES:
        holders: list[list] = [t for t in traces if isinstance(t, list)]
        holders.append(segments)
        holders.extend(
            s["blocks"]
            for s in segments
            if isinstance(s, dict) and isinstance(s.get("blocks"), list)
        )
        for holder in holders:
            for e in holder:
                f = e.get("frames") if isinstance(e, dict) else None
                frames += len(f) if isinstance(f, list) else 0
            if frames > MAX_FRAMES:
                break
    if entries > MAX_ENTRIES or frames > MAX_FRAMES:
        raise UserError(
            f"snapshot {source} expands to {entries:,} entries and {frames:,}+ stack frames, "
            f"beyond the {MAX_ENTRIES:,} entries (trace entries, segments, blocks) and "
            f"{MAX_FRAMES:,} frames memprobe reads",
            "a real snapshot is far smaller; record fewer entries (max_entries) or check the file",
        )


def _trace(trace: Any, device: int, bad: _Bad) -> list[dict]:
    if trace is None:
        return []
    if not isinstance(trace, list):
        raise bad(f"device_traces[{device}]", f"is {_describe(trace)}, not a list")
    entries = [_entry(e, f"device_traces[{device}][{i}]", bad) for i, e in enumerate(trace)]
    if entries and not any(e["action"] in _KNOWN_ACTIONS for e in entries):
        # Unknown actions are skipped one by one (a newer torch may add some); a trace of
        # nothing else ('ALLOC', 'alloc ') would read as a step that allocated 0 B.
        raise bad(
            f"device_traces[{device}]",
            f"has {len(entries):,} entries and none is an action memprobe reads "
            f"(the first is {_quoted(entries[0]['action'])}; torch writes {', '.join(ACTIONS)})",
        )
    return entries


_PLAIN_ACTIONS = frozenset(ADDRESSED_ACTIONS)
_KNOWN_ACTIONS = frozenset([*ACTIONS, FREE])
_PLAIN_KEYS = frozenset(
    {"action", "addr", "size", "stream", "time_us", "frames", "user_metadata", "compile_context"}
)


def _is_plain(e: Any) -> bool:
    """Already in normal form (what torch writes for block/segment events): kept as is,
    which keeps a million-entry trace from being copied."""
    return (
        type(e) is dict
        # str first: an unhashable action (a list) raised TypeError from the set lookup
        and type(e.get("action")) is str
        and e["action"] in _PLAIN_ACTIONS
        and type(e.get("addr")) is int
        and type(e.get("size")) is int
        and 0 <= e["size"] < _U64
        and -_U64 < e["addr"] < _U64
        and type(e.get("stream")) is int
        and type(e.get("time_us", 0)) is int
        and -_U64 < e.get("time_us", 0) < _U64
        and type(e.get("frames")) is list
        and type(e.get("user_metadata", "x")) is str
        and e.get("user_metadata", "x") != ""
        and _PLAIN_KEYS.issuperset(e)
    )


def _entry(e: Any, where: str, bad: _Bad) -> dict:
    if _is_plain(e):
        return e
    if not isinstance(e, dict):
        raise bad(where, f"is {_describe(e)}, not a dict")
    action = e.get("action")
    if not isinstance(action, str):
        raise bad(where, "has no 'action'")
    # Actions memprobe does not know are kept (and ignored later), size or not.
    size = e.get("size", None if action in _NEEDS_SIZE else 0)
    if not _is_int(size) or size < 0:
        raise bad(where, f"({action}) has no valid 'size'")
    out: dict[str, Any] = {"action": action}
    if action in _NEEDS_ADDR:
        addr = e.get("addr")
        if not _is_int(addr):
            raise bad(where, f"({action}) has no valid 'addr'")
        out["addr"] = addr
    elif _is_int(e.get("addr")):
        out["addr"] = e["addr"]
    if action == "oom":
        if size == 0:
            # An OOM is a request the device could not meet: one of no bytes never fails.
            raise bad(where, "(oom) requests 0 bytes")
        free = e.get("device_free")
        out["device_free"] = free if _is_int(free) and free >= 0 else None
    out["size"] = size
    stream = e.get("stream", 0)
    out["stream"] = stream if _is_int(stream) else 0
    t = e.get("time_us")
    if isinstance(t, (int, float)) and (
        _is_int(t) or (isinstance(t, float) and math.isfinite(t) and abs(t) < _U64)
    ):
        out["time_us"] = int(t)
    frames = e.get("frames")
    out["frames"] = frames if isinstance(frames, list) else []
    meta = e.get("user_metadata")
    if isinstance(meta, str) and meta:
        out["user_metadata"] = meta
    if "compile_context" in e:
        out["compile_context"] = e["compile_context"]
    return out


def _segment(seg: Any, i: int, bad: _Bad) -> dict:
    where = f"segments[{i}]"
    if not isinstance(seg, dict):
        raise bad(where, f"is {_describe(seg)}, not a dict")
    address = seg.get("address")
    if not _is_int(address):
        raise bad(where, "has no valid 'address'")
    raw_blocks = seg.get("blocks") or []
    if not isinstance(raw_blocks, list):
        raise bad(where, "'blocks' is not a list")
    blocks = []
    offset: int = address if isinstance(address, int) else 0  # checked above: an int
    for j, b in enumerate(raw_blocks):
        block = _block(b, offset, f"{where}.blocks[{j}]", bad)
        if block["address"] < offset:
            # Blocks lie in their segment in address order; an overlap is a tampered file
            # (the allocator replay would have to place two blocks in one place).
            problem = "overlaps the block before it" if j else "starts before its segment"
            raise bad(f"{where}.blocks[{j}]", problem)
        blocks.append(block)
        offset = block["address"] + block["size"]
    if not blocks:
        # torch's allocator always splits a segment into blocks (one inactive at least);
        # an empty one has no layout the replay could place.
        raise bad(where, "has no blocks (a segment holds at least one)")
    # Some tools write segments without totals: the segment reaches to its last block's end
    # (bytes no block covers are free space, see memprobe.snapshot.segments).
    total = seg.get("total_size")
    size: int = total if _is_int(total) else offset - address
    if size < 0:
        raise bad(where, f"has a negative 'total_size' ({size})")
    if size == 0:
        # A segment of no bytes has no layout the allocator replay could place (IndexError).
        raise bad(where, "holds 0 bytes (a segment is memory the allocator reserved)")
    if offset > address + size:
        reach = f"they reach {offset - address:,} bytes into its {size:,}"
        raise bad(where, f"has blocks past its end ({reach})")
    device = seg["device"] if _is_int(seg.get("device")) else 0
    if device < 0:
        # CUDA numbers devices from 0: -1 was chosen as the device to read, then refused
        # as one the snapshot "has nothing for" while naming it as the one with data.
        raise bad(where, f"is on device {device} (CUDA numbers its devices from 0)")
    out = {k: v for k, v in seg.items()}
    live = [b for b in blocks if b["state"] in LIVE_STATES]
    out.update(
        address=address,
        total_size=size,
        blocks=blocks,
        device=device,
        stream=seg["stream"] if _is_int(seg.get("stream")) else 0,
        frames=seg["frames"] if isinstance(seg.get("frames"), list) else [],
        # torch writes a bool: a string "False" is true to bool(), an expandable segment
        # to the replay.
        is_expandable=seg.get("is_expandable") is True,
    )
    out["segment_type"] = segment_kind(seg, size, lambda problem: bad(where, problem))
    for key, value in (
        ("allocated_size", sum(b["size"] for b in blocks if b["state"] == ACTIVE_ALLOCATED)),
        ("active_size", sum(b["size"] for b in live)),
        ("requested_size", sum(b["requested_size"] for b in live)),
    ):
        if not _is_int(seg.get(key)):
            out[key] = value
    return out


def _check_segments_apart(segments: list[dict], bad: _Bad) -> None:
    """A device's segments are separate cudaMalloc ranges: two that share addresses (one
    segment listed twice, or two files' segments merged) would be counted twice in the
    reserved bytes and placed twice by the allocator replay."""
    last: dict[int, tuple[int, int]] = {}  # device -> (index, end) of the segment before
    for i in sorted(
        range(len(segments)), key=lambda i: (segments[i]["device"], segments[i]["address"])
    ):
        seg = segments[i]
        before = last.get(seg["device"])
        if before is not None and seg["address"] < before[1]:
            raise bad(f"segments[{i}]", f"overlaps segments[{before[0]}] on device {seg['device']}")
        last[seg["device"]] = (i, seg["address"] + seg["total_size"])


def _block(b: Any, default_address: int, where: str, bad: _Bad) -> dict:
    if not isinstance(b, dict):
        raise bad(where, f"is {_describe(b)}, not a dict")
    size = b.get("size")
    if not _is_int(size) or size < 0:
        raise bad(where, "has no valid 'size'")
    state = b.get("state")
    if not isinstance(state, str):
        raise bad(where, "has no 'state'")
    state = STATE_ALIASES.get(state, state)
    if state not in (*LIVE_STATES, INACTIVE):
        # Neither live nor free, it was counted nowhere: an empty segment's largest free
        # block read 0 B, its bytes in no total.
        raise bad(where, f"has state {_quoted(state)}, which torch never writes")
    out = {k: v for k, v in b.items()}
    history = b.get("history")
    first = (
        history[0] if isinstance(history, list) and history and isinstance(history[0], dict) else {}
    )
    requested = b.get("requested_size", first.get("real_size", size))
    if _is_int(requested) and (requested < 0 or (requested > size and state in LIVE_STATES)):
        # The allocator rounds a request up to its block: what a live block was asked for
        # is never more than the block, nor less than nothing. Counted as it stood, a live
        # block of -1 TiB (or 1 PiB in a 20 MiB segment) was the step's "peak allocated".
        # A free block may keep a larger stale request (the remainder of a split keeps
        # the whole block's, in torch as in memprobe's model): it is not counted.
        raise bad(where, f"requested {requested:,} bytes, outside its block of {size:,}")
    frames = b.get("frames", first.get("frames"))
    address = b.get("address")
    out.update(
        address=address if _is_int(address) else default_address,
        size=size,
        state=state,
        requested_size=requested if _is_int(requested) else size,
        frames=frames if isinstance(frames, list) else [],
    )
    return out
