"""Replay a CUDA memory snapshot's trace through the allocator model and compare.

For each device the replay:

1. rebuilds the allocator's state at the trace's first entry: the final ``segments`` walked
   backwards through the trace's ``segment_alloc``/``segment_free``/``segment_map``/
   ``segment_unmap`` entries give the segments (and mapped pages) that existed then; the
   blocks live then are those the trace frees before it allocates them, and those live at
   the end that the trace never touches; the gaps between them are free blocks (free
   neighbours always coalesce, so a gap is one block);
2. feeds the trace's requests to the model: ``alloc`` and ``free_completed`` carry the
   requested bytes; a ``free_requested`` without a later completion frees at the request,
   unless the final segments still show that block pending (then it stays live);
3. compares the modelled reserved bytes with the recorded ones (reserved grows with
   ``segment_alloc``/``segment_map`` and shrinks with ``segment_free``/``segment_unmap``)
   after every allocation. A trace with no segment entries but final ``segments`` held
   those segments, unchanged, over its whole window (torch records every cudaMalloc and
   cudaFree while it records history): that constant is what the model is held to.

With ``use_recorded_addresses`` a new segment is placed where the real cudaMalloc put it
(the address of the ``segment_alloc`` the same request recorded), so every allocation
should land at its recorded address; those that do not are counted.

This module reads a snapshot dict (as :func:`memprobe.snapshot.load.load_snapshot` returns
it) and never a file, so the model stays free of the snapshot floor above it.

Why one long module: the three steps above are the methods of ``_DeviceReplay``, over
one device's trace, its final segments and the free plan; they share that state and
run in that order, so they stay in one class.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeGuard

from memprobe.allocator.config import (
    MALLOC_ASYNC,
    MIB,
    MIN_SPLIT_MB,
    ROUNDUP_INTERVALS,
    AllocConf,
    parse_alloc_conf,
)
from memprobe.allocator.model import (
    SMALL_BUFFER,
    SMALL_SIZE,
    CachingAllocatorModel,
    round_size,
)
from memprobe.allocator.snapshot_format import (
    ACTIVE_PENDING_FREE,
    BLOCK_ACTIONS,
    FREED,
    FREES,
    LIVE_STATES,
    SEGMENT_GROW,
    SEGMENT_SHRINK,
    SETTINGS_CONF_KEYS,
    STATE_ALIASES,
)
from memprobe.errors import UserError

# A dict that did not come through the loader may still spell a state the old way.
_LIVE = (*LIVE_STATES, *STATE_ALIASES)
_PENDING = (ACTIVE_PENDING_FREE, *STATE_ALIASES)
_NO_LIMIT = 1 << 63  # torch reports "no max_split_size" as SIZE_MAX


@dataclass(frozen=True, slots=True)
class DeviceReplay:
    """What the model predicts for one device of a snapshot, beside what was recorded.

    Reserved figures include the segments that existed before the trace began.
    ``recorded_from``: "segment events" (reserved over time from the trace), "constant"
    (no segment entries: the final segments held throughout), or None (neither: the
    ``recorded_*`` reserved figures are None). ``timeline_mismatches``: allocations after
    which modelled and recorded reserved differ (None when nothing was recorded).
    ``address_mismatches``: allocations placed away from their recorded address (only
    with ``use_recorded_addresses``); ``first_address_mismatch`` is the first one as
    (trace index, recorded address, placed address).
    """

    device: int
    alloc_conf: str
    requests: int
    predicted_reserved_peak_bytes: int
    recorded_reserved_peak_bytes: int | None
    predicted_reserved_final_bytes: int
    recorded_reserved_final_bytes: int | None
    predicted_segments: int
    recorded_segments: int
    error_pct: float | None
    timeline_mismatches: int | None
    first_mismatch_index: int | None
    address_mismatches: int | None
    notes: tuple[str, ...]
    recorded_from: str | None = None
    first_address_mismatch: tuple[int, int, int] | None = None


def _asked_conf(settings: dict) -> AllocConf | None:
    """The settings text's conf (what the job asked for), or None: no text, or one that
    does not parse (then the parsed fields torch also writes are read)."""
    for key in SETTINGS_CONF_KEYS:
        text = settings.get(key)
        if isinstance(text, str) and text.strip():
            try:
                return parse_alloc_conf(text)
            except UserError:
                return None
    return None


def conf_from_snapshot(snapshot: dict) -> AllocConf:
    """The allocator settings a snapshot was recorded with (``allocator_settings``; older
    files without it: expandable segments when any segment is expandable, else defaults)."""
    settings = snapshot.get("allocator_settings") or {}
    conf = _asked_conf(settings)
    if conf is not None:
        # The text is what the job asked for, the field what its allocator ran: where
        # the platform has no expandable segments (Windows, ROCm builds), torch keeps
        # "expandable_segments:True" in the text, warns, and records False. Replayed
        # from the text, such a file was modelled with segments it never had.
        ran = settings.get("expandable_segments")
        if isinstance(ran, bool) and ran != conf.expandable_segments:
            conf = dataclasses.replace(conf, expandable_segments=ran)
        return conf
    fields: dict[str, Any] = {}
    split = settings.get("max_split_size")
    # torch refuses a limit under kLargeBuffer (as --alloc-conf does): a recorded 1,000
    # bytes was replayed as max_split_size_mb:0, a setting no allocator runs with.
    if isinstance(split, int) and MIN_SPLIT_MB * MIB <= split < _NO_LIMIT:
        fields["max_split_size_mb"] = split // MIB
    gc = settings.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and 0 < gc < 1:
        fields["garbage_collection_threshold"] = float(gc)
    divisions = settings.get("roundup_power2_divisions")
    if _torch_divisions(divisions):
        # torch writes {"1": d, "2": d, "4": d, ...}: one entry per interval, keyed in MiB.
        # Any other table (a ">" key, a negative or fractional count, intervals missing)
        # is no setting torch has: the defaults stand, as for a field that is not there.
        values = [int(v) for _, v in sorted(divisions.items(), key=lambda kv: int(kv[0]))]
        values = (values + [values[-1]] * ROUNDUP_INTERVALS)[:ROUNDUP_INTERVALS]
        fields["roundup_power2_divisions"] = tuple(values)
    expandable = settings.get("expandable_segments")
    if isinstance(expandable, bool):
        fields["expandable_segments"] = expandable
    elif any(s.get("is_expandable") for s in snapshot.get("segments") or []):
        fields["expandable_segments"] = True
    return AllocConf(**fields)


def expandable_asked_not_run(snapshot: dict) -> bool:
    """Whether the snapshot's settings text asks for expandable segments while its
    allocator recorded running without them (a platform that has none ignores the ask)."""
    settings = snapshot.get("allocator_settings") or {}
    asked = _asked_conf(settings)
    return settings.get("expandable_segments") is False and bool(
        asked and asked.expandable_segments
    )


def _torch_divisions(divisions: Any) -> TypeGuard[dict[Any, Any]]:
    """Whether ``divisions`` is a table as torch writes it: an entry for each interval
    from 1 MiB up, in turn. The counts are read in key order, one per interval: a table
    with intervals missing ({"1": 0, "64": 8}) put 64 MiB's 8 at 2 MiB, and was replayed
    as roundup_power2_divisions:[1:0,>:8], not the file's [32:0,>:8]."""
    if not (isinstance(divisions, dict) and divisions and all(map(_division, divisions.items()))):
        return False
    keys = sorted(int(k) for k in divisions)
    return keys == [1 << i for i in range(len(keys))]


def _division(item: tuple[Any, Any]) -> bool:
    """One entry of torch's divisions table: an interval in MiB (a power of two, as a
    number or its digits) and a count of 0 or a power of two."""
    key, value = item
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 6:
        key = int(key)
    whole = [v for v in (key, value) if isinstance(v, int) and not isinstance(v, bool)]
    return (
        len(whole) == 2
        and 0 < key <= 2**20
        and key & (key - 1) == 0
        and 0 <= value <= 2**20
        and value & (value - 1) == 0
    )


def replay_snapshot(
    snapshot: dict,
    *,
    conf: AllocConf | None = None,
    use_recorded_addresses: bool = False,
) -> tuple[DeviceReplay, ...]:
    """Replay every device of a normalised snapshot dict. ``conf`` None: the settings the
    snapshot records; another AllocConf answers the what-if (e.g. expandable segments)."""
    recorded_conf = conf_from_snapshot(snapshot)
    segments = snapshot.get("segments") or []
    traces = snapshot.get("device_traces") or []
    devices = sorted({int(s.get("device", 0)) for s in segments} | set(range(len(traces))))
    out = []
    for device in devices:
        trace = traces[device] if device < len(traces) and traces[device] else []
        segs = [s for s in segments if int(s.get("device", 0)) == device]
        if not trace and not segs:
            continue
        out.append(
            _DeviceReplay(
                device, segs, trace, conf or recorded_conf, recorded_conf, use_recorded_addresses
            ).run()
        )
    return tuple(out)


def _is_default_pool(pool_id: Any) -> bool:
    return pool_id is None or tuple(pool_id) == (0, 0)


def _free_plan(trace: list[dict], final_state: dict[int, str]) -> list[bool]:
    """For each entry, whether it frees its block in the replay (see the module doc)."""
    effective = [False] * len(trace)
    next_kind: dict[int, str] = {}
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        action = e["action"]
        if action not in BLOCK_ACTIONS:
            continue
        addr = e["addr"]
        if action in FREED:
            effective[i] = True
        elif action == "free_requested":
            later = next_kind.get(addr)
            if later == "free_completed":
                effective[i] = False
            elif later is None:
                effective[i] = final_state.get(addr) not in _PENDING
            else:
                effective[i] = True
        next_kind[addr] = action
    return effective


class _DeviceReplay:
    def __init__(
        self,
        device: int,
        segments: list[dict],
        trace: list[dict],
        conf: AllocConf,
        recorded_conf: AllocConf,
        use_recorded_addresses: bool,
    ) -> None:
        self.device = device
        self.segments = segments
        self.trace = trace
        self.conf = conf
        self.recorded_conf = recorded_conf
        self.recorded_mode = use_recorded_addresses
        self.notes: list[str] = []
        self.pending_malloc: list[int] = []
        self.pending_map: list[int] = []

    # -------------------------------------------------------------- the start state

    def _large_page(self) -> int:
        return self.recorded_conf.large_segment_size

    def _is_small_range(self, size: int) -> bool:
        """Whether a freed cudaMalloc segment of ``size`` bytes was a small-pool one."""
        return size == SMALL_BUFFER and self._large_page() != SMALL_BUFFER

    def _expandable_kind(self, e: dict, bounds: dict[tuple[int, bool], list[int]]) -> bool:
        """Whether a map/unmap entry is the small pool's: the pool whose expandable range is
        nearest its address (each pool reserves its own range); by size when none is known."""
        stream = int(e.get("stream", 0))
        addr = e["addr"]
        best: tuple[int, bool] | None = None
        for (s, small), (lo, hi) in bounds.items():
            if s != stream:
                continue
            gap = 0 if lo <= addr <= hi else min(abs(addr - lo), abs(addr - hi))
            if best is None or gap < best[0]:
                best = (gap, small)
        if best is not None:
            small = best[1]
        else:
            large = self._large_page()
            small = e["size"] % large != 0 or (e["size"] == SMALL_BUFFER != large)
        lo_hi = bounds.setdefault((stream, small), [addr, addr])
        lo_hi[0] = min(lo_hi[0], addr)
        lo_hi[1] = max(lo_hi[1], addr + e["size"])
        return small

    def _start_state(
        self,
    ) -> tuple[dict[int, tuple[int, int, bool]], dict[tuple[int, bool], set[int]]]:
        """Segments (addr -> size, stream, small) and expandable pages at the trace's start."""
        segs: dict[int, tuple[int, int, bool]] = {}
        pages: dict[tuple[int, bool], set[int]] = {}
        foreign = 0
        for s in self.segments:
            if not _is_default_pool(s.get("segment_pool_id")):
                foreign += 1
            small = s.get("segment_type") == "small"
            stream = int(s.get("stream", 0))
            if s.get("is_expandable"):
                page = SMALL_BUFFER if small else self._large_page()
                keyset = pages.setdefault((stream, small), set())
                keyset.update(range(s["address"], s["address"] + s["total_size"], page))
            else:
                segs[s["address"]] = (s["total_size"], stream, small)
        if foreign:
            self.notes.append(
                f"{foreign} segment(s) belong to a private pool (CUDA graphs or MemPool); "
                "the model puts their requests in the default pools"
            )
        missing = 0
        bounds = {k: [min(v), max(v)] for k, v in pages.items() if v}
        self._map_kind: dict[int, bool] = {}
        for i in range(len(self.trace) - 1, -1, -1):
            e = self.trace[i]
            action = e["action"]
            if action == "segment_alloc":
                if segs.pop(e["addr"], None) is None:
                    missing += 1
            elif action == "segment_free":
                segs[e["addr"]] = (
                    e["size"],
                    int(e.get("stream", 0)),
                    self._is_small_range(e["size"]),
                )
            elif action in ("segment_map", "segment_unmap"):
                small = self._map_kind[i] = self._expandable_kind(e, bounds)
                page = SMALL_BUFFER if small else self._large_page()
                keyset = pages.setdefault((int(e.get("stream", 0)), small), set())
                span = range(e["addr"], e["addr"] + e["size"], page)
                if action == "segment_map":
                    keyset.difference_update(span)
                else:
                    keyset.update(span)
        if missing:
            self.notes.append(f"{missing} segment_alloc entries name no segment of the final state")
        return segs, pages

    def _live_at_start(self, effective: list[bool]) -> list[tuple[int, int | None, int]]:
        """(addr, size or None when only the requested size is known, requested)."""
        first: dict[int, tuple[str, dict, int]] = {}
        for i, e in enumerate(self.trace):
            action = e["action"]
            if action == "alloc" or (action in FREES and effective[i]):
                first.setdefault(e["addr"], ("alloc" if action == "alloc" else "free", e, i))
        live: list[tuple[int, int | None, int]] = []
        for s in self.segments:
            for b in s.get("blocks") or []:
                if b.get("state") in _LIVE and b["address"] not in first:
                    live.append((b["address"], b["size"], b.get("requested_size", b["size"])))
        self._free_pos: dict[int, int] = {}
        for addr, (kind, e, pos) in first.items():
            if kind == "free":
                live.append((addr, None, e["size"]))
                self._free_pos[addr] = pos
        allocs = sorted((e["addr"], i) for i, e in enumerate(self.trace) if e["action"] == "alloc")
        self._alloc_addrs = [a for a, _ in allocs]
        self._alloc_pos = [i for _, i in allocs]
        return live

    def _install(self, model: CachingAllocatorModel, effective: list[bool]) -> set[int]:
        segs, pages = self._start_state()
        live = sorted(self._live_at_start(effective))
        installed: set[int] = set()
        placed = 0
        starts = sorted(segs)
        by_segment: dict[int, list[tuple[int, int | None, int]]] = {a: [] for a in starts}
        loose: list[tuple[int, int | None, int]] = []
        for item in live:
            i = bisect.bisect_right(starts, item[0]) - 1
            if i >= 0 and item[0] < starts[i] + segs[starts[i]][0]:
                by_segment[starts[i]].append(item)
            else:
                loose.append(item)
        for addr in starts:
            size, stream, small = segs[addr]
            blocks = self._sized(by_segment[addr], addr, addr + size, small, expandable=False)
            installed.update(
                model.install_segment(addr, size, stream=stream, small=small, live_blocks=blocks)
            )
            placed += len(blocks)
        for (stream, small), keyset in sorted(pages.items()):
            if not keyset:
                continue
            page = SMALL_BUFFER if small else self._large_page()
            ranges = _runs(sorted(keyset), page)
            base = min(
                [ranges[0][0]]
                + [
                    self.trace[i]["addr"]
                    for i, kind in self._map_kind.items()
                    if kind == small and int(self.trace[i].get("stream", 0)) == stream
                ]
            )
            inside = [b for b in loose if any(a <= b[0] < a + s for a, s in ranges)]
            loose = [b for b in loose if b not in inside]
            blocks = []
            for a, s in ranges:
                run = [b for b in inside if a <= b[0] < a + s]
                blocks += self._sized(run, a, a + s, small, expandable=True)
            installed.update(
                model.install_expandable(
                    base, ranges, stream=stream, small=small, live_blocks=blocks
                )
            )
        if loose:
            self.notes.append(
                f"{len(loose)} block(s) live at the trace's start lie in no segment known then; "
                "their frees are skipped"
            )
        return installed

    def _sized(
        self,
        items: list[tuple[int, int | None, int]],
        start: int,
        end: int,
        small: bool,
        *,
        expandable: bool,
    ) -> list[tuple[int, int, int]]:
        """Give blocks known only by their requested size a block size.

        A block is its rounded size, or more when the allocator handed out a whole free block
        because the rest was too small to split off (large pool: up to 1 MiB; an oversize
        block: up to ``max_non_split_rounding``). The trace shows where such a block ends: the
        first allocation carved, while it was live, from the free block after it starts
        exactly there. Without one, slack under 1 MiB before the next block is the block's own
        (a large-pool free block is always over 1 MiB)."""
        out = []
        items = sorted(items)
        conf = self.recorded_conf
        for k, (addr, size, req) in enumerate(items):
            if size is None:
                size = round_size(req, conf)
                limit = items[k + 1][0] if k + 1 < len(items) else end
                if not small and not expandable and addr + size < limit:
                    split_max = conf.max_split_size
                    oversize = split_max is not None and size >= split_max
                    slack = conf.max_non_split_rounding if oversize else SMALL_SIZE + 1
                    carved = self._first_alloc_between(addr + size, limit, self._free_pos[addr])
                    if carved is not None and carved - addr - size < slack:
                        size = carved - addr
                    elif carved is None and (
                        limit - addr - size <= SMALL_SIZE
                        or (
                            oversize
                            and k == 0
                            and addr == start
                            and limit == end
                            and end - addr - size < conf.max_non_split_rounding
                        )
                    ):
                        # The slack is no free block of its own, or the block is alone in
                        # a segment made for it and oversize blocks are never split.
                        size = limit - addr
            out.append((addr, size, req))
        return out

    def _first_alloc_between(self, lo: int, hi: int, before: int) -> int | None:
        """The address of the earliest ``alloc`` (trace position < ``before``) in [lo, hi)."""
        i = bisect.bisect_left(self._alloc_addrs, lo)
        best: tuple[int, int] | None = None
        while i < len(self._alloc_addrs) and self._alloc_addrs[i] < hi:
            pos = self._alloc_pos[i]
            if pos < before and (best is None or pos < best[0]):
                best = (pos, self._alloc_addrs[i])
            i += 1
        return None if best is None else best[1]

    # ------------------------------------------------------------------- the replay

    def _malloc_fails(self, attempt: int) -> bool:
        if not self._shrinks_seen:
            return False
        if self.model.num_alloc_retries > self._retries_before:
            # The last attempt, after empty_cache: the recorded allocation succeeded. A
            # trace that gave back segments the model never held (made with no block in
            # them) failed it too, and the replay ended in an OutOfMemory traceback.
            return False
        if attempt == 0:
            return True
        freed = self.model.num_device_free - self._frees_before
        return freed < self._shrinks_seen and attempt == 1

    def _address_source(self, kind: str, nbytes: int) -> int | None:
        if kind == "cudaMalloc" and self.pending_malloc:
            return self.pending_malloc.pop(0)
        if kind == "reserve" and self.pending_map:
            return self.pending_map[0]
        return None

    def run(self) -> DeviceReplay:
        conf = self.conf
        if self.recorded_conf.backend == MALLOC_ASYNC or conf.backend == MALLOC_ASYNC:
            self.notes.append("the cudaMallocAsync backend is not modelled; replayed as native")
        final_state = {
            b["address"]: b.get("state", "") for s in self.segments for b in s.get("blocks") or []
        }
        effective = _free_plan(self.trace, final_state)
        model = CachingAllocatorModel(
            conf,
            device=self.device,
            address_source=self._address_source if self.recorded_mode else None,
            cuda_malloc_fails=self._malloc_fails,
            keep_segment_events=False,
        )
        self.model = model
        installed = self._install(model, effective)
        handles = {a: a for a in installed}
        has_segment_events = any(e["action"] in SEGMENT_GROW + SEGMENT_SHRINK for e in self.trace)
        recorded_from = (
            "segment events" if has_segment_events else "constant" if self.segments else None
        )
        compared = recorded_from is not None
        recorded = model.reserved
        recorded_peak = recorded
        mismatches = 0
        first_mismatch: int | None = None
        address_mismatches = 0
        first_address: tuple[int, int, int] | None = None
        requests = 0
        flushes = 0
        retries = 0
        shrinks = 0
        self._shrinks_seen = 0
        self._frees_before = 0
        self._retries_before = 0
        shrink_pending = False
        grew_after_shrink = False
        skipped_frees = 0
        ooms = 0
        streams = set()
        for i, e in enumerate(self.trace):
            action = e["action"]
            if action in SEGMENT_GROW:
                grew_after_shrink = shrink_pending
                recorded += e["size"]
                recorded_peak = max(recorded_peak, recorded)
                (self.pending_malloc if action == "segment_alloc" else self.pending_map).append(
                    e["addr"]
                )
                continue
            if action in SEGMENT_SHRINK:
                recorded -= e["size"]
                if not shrink_pending:
                    shrinks = 0
                    grew_after_shrink = False
                shrinks += 1
                shrink_pending = True
                continue
            is_free = action in FREES and effective[i]
            if action != "alloc" and not is_free and action != "oom":
                continue
            if shrink_pending and (
                action != "alloc"
                or not grew_after_shrink
                or model.fits_cached(e["size"], int(e.get("stream", 0)))
            ):
                # An allocation that a cached block would have served cannot have found
                # the device full: the memory went back before it, by empty_cache().
                # The real allocator gave memory back with no allocation following:
                # empty_cache(), or the retry before an OOM. Do the same.
                model.empty_cache()
                flushes += 1
                shrink_pending = False
            if action == "oom":
                ooms += 1
                self.pending_malloc.clear()
                self.pending_map.clear()
                continue
            if action == "alloc":
                requests += 1
                stream = int(e.get("stream", 0))
                streams.add(stream)
                if shrink_pending:
                    # The real cudaMalloc failed and the allocator freed cached memory
                    # before it succeeded: let the model's first attempt fail too, and
                    # the next succeed once it has freed as many segments.
                    retries += 1
                    self._shrinks_seen = shrinks
                    self._frees_before = model.num_device_free
                    self._retries_before = model.num_alloc_retries
                    shrink_pending = False
                else:
                    self._shrinks_seen = 0
                handle = model.malloc(e["size"], stream)
                handles[e["addr"]] = handle
                if handle != e["addr"]:
                    address_mismatches += 1
                    if first_address is None:
                        first_address = (i, e["addr"], handle)
                self.pending_malloc.clear()
                self.pending_map.clear()
                if compared and model.reserved != recorded:
                    mismatches += 1
                    if first_mismatch is None:
                        first_mismatch = i
            else:
                freed = handles.pop(e["addr"], None)
                if freed is None:
                    skipped_frees += 1
                    continue
                model.free(freed)
        if shrink_pending:
            model.empty_cache()
            flushes += 1
        if len(streams) > 1:
            self.notes.append(
                f"{len(streams)} streams: pools are kept per stream as recorded; frees delayed by "
                "record_stream are taken at their free_completed"
            )
        if flushes:
            self.notes.append(
                f"{flushes} point(s) where the trace gives memory back with no allocation "
                "following (empty_cache, or the retry before an OOM) were replayed as empty_cache"
            )
        if retries:
            self.notes.append(
                f"{retries} allocation(s) found the device full and freed cached segments "
                "first; the model was made to fail the same cudaMalloc calls"
            )
        if ooms:
            self.notes.append(f"{ooms} OOM entr{'y' if ooms == 1 else 'ies'} in the trace")
        if skipped_frees:
            self.notes.append(
                f"{skipped_frees} free(s) of blocks the replay never saw were skipped"
            )
        if conf != self.recorded_conf:
            self.notes.append(
                f"what-if: replayed with {conf.to_string() or 'defaults'} instead of the recorded "
                f"{self.recorded_conf.to_string() or 'defaults'}; the state at the trace's start "
                "is the recorded one"
            )
        if address_mismatches and self.recorded_mode:
            self.notes.append(self._address_note(first_address, address_mismatches))
        stats = model.stats
        rec_peak = recorded_peak if compared else None
        error = 100.0 * (stats.reserved_peak_bytes - rec_peak) / rec_peak if rec_peak else None
        return DeviceReplay(
            device=self.device,
            alloc_conf=conf.to_string(),
            requests=requests,
            predicted_reserved_peak_bytes=stats.reserved_peak_bytes,
            recorded_reserved_peak_bytes=rec_peak,
            predicted_reserved_final_bytes=stats.reserved_bytes,
            recorded_reserved_final_bytes=recorded if compared else None,
            predicted_segments=stats.segments,
            recorded_segments=len(self.segments),
            error_pct=error,
            timeline_mismatches=mismatches if compared else None,
            first_mismatch_index=first_mismatch,
            address_mismatches=address_mismatches if self.recorded_mode else None,
            notes=tuple(self.notes),
            recorded_from=recorded_from,
            first_address_mismatch=first_address if self.recorded_mode else None,
        )

    def _address_note(self, first: tuple[int, int, int] | None, count: int) -> str:
        """Why allocations left their recorded addresses, as far as the trace shows it."""
        assert first is not None
        index, recorded, placed = first
        where = f"the first at entry #{index}: recorded at {recorded:#x}, placed at {placed:#x}"
        expandable = any(s.get("is_expandable") for s in self.segments) or any(
            e["action"] in ("segment_map", "segment_unmap") for e in self.trace
        )
        # Facts the trace gives, not a guess at the cause: what the model could not see.
        if expandable:
            why = (
                "with expandable segments the model places blocks in the pages the trace's "
                "segment_map entries name; torch reserves each range's base without a trace "
                "entry, so a range the trace never maps is placed by the model's own choice"
            )
        else:
            why = "from there on the model's free blocks differ from the real allocator's"
        return f"{count:,} allocation(s) away from their recorded address, {where}; {why}"


def _runs(pages: Iterable[int], page: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for p in pages:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + page)
        else:
            runs.append((p, page))
    return runs
