"""A model of PyTorch's native CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``).

The model follows the device allocator's code path for path, so that fed the same requests it
reserves the same bytes, makes the same segments, and (given the same cudaMalloc addresses)
hands out the same addresses:

- ``round_size``: requests round up to 512 B, or to a power-of-two division when
  ``roundup_power2_divisions`` applies; ≤ 1 MiB goes to the small pool, the rest to the large.
- ``get_allocation_size``: a new small segment is 2 MiB, a 1–10 MiB request gets a
  ``large_segment_size`` (20 MiB) segment, larger requests round up to 2 MiB.
- ``get_free_block``: best fit within the (stream, pool) free list ordered by (size, address);
  an oversize block (≥ ``max_split_size``) serves only requests at least that large, and only
  within ``max_non_split_rounding`` of their size.
- ``should_split``: small pool (and expandable segments) split when ≥ 512 B remain, the large
  pool when more than 1 MiB remains and the request is under ``max_split_size``.
- ``free_block`` / ``try_merge_blocks``: a freed block coalesces with free neighbours of its own
  segment, never across segments.
- ``malloc``'s fallbacks when no cached block fits: garbage collection (only with a memory
  fraction set), cudaMalloc, freeing oversize cached blocks and retrying, freeing every
  unsplit cached block and retrying, and then out of memory.
- expandable segments: one virtual range per (stream, pool) mapped in 2 MiB (small) or
  ``large_segment_size`` (large) pages at its lowest free address; ``empty_cache`` unmaps
  whole free pages.

Not modelled: cross-stream frees deferred by ``record_stream`` (a replay takes the moment
from the trace's ``free_completed``), CUDA-graph private pools, free-memory callbacks.

Cost: free blocks sit in per-(stream, pool) sorted lists searched with ``bisect``, so one
request costs a few microseconds in CPython (see ``benchmarks/bench_allocator.py``).

Why one long module: ``CachingAllocatorModel`` is torch's ``DeviceCachingAllocator``, one
class over one state (blocks, pools, segments, stats) whose methods call each other as
torch's do; kept whole and in torch's order, it can be read beside the C++ file.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from memprobe.allocator.config import AllocConf

# The model records what it does on device memory in torch's trace words.
from memprobe.allocator.snapshot_format import (
    ACTIVE_ALLOCATED,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    INACTIVE,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)

MIN_BLOCK = 512  # kMinBlockSize: every block is a multiple of this
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to 1 MiB use the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small segments (and small expandable pages) are 2 MiB
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: below this a large request gets a whole segment
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments round up to 2 MiB
# Where the default address source starts handing out segments. Any 2 MiB-aligned value
# works: only the order of addresses matters to the allocator (it breaks best-fit ties).
ADDRESS_BASE = 0x7F0000000000
# Virtual bytes an expandable segment reserves when the device size is unknown; torch
# reserves 9/8 of the device memory. Only addresses depend on it, never reserved bytes.
DEFAULT_VA_BYTES = 1 << 40
DEFAULT_POOL_ID = (0, 0)

# address_source(kind, nbytes) -> address, where kind is "cudaMalloc" (a new segment) or
# "reserve" (the virtual range of a new expandable segment). None: use the next free address.
AddressSource = Callable[[str, int], "int | None"]
# cuda_malloc_fails(attempt) -> True to make that cudaMalloc (or page map) attempt of the
# current request fail, as a full device would; attempt counts from 0 within one malloc.
# A replay uses it to follow a trace that shows the allocator freeing its cache.
MallocFailureOracle = Callable[[int], bool]


class OutOfMemory(Exception):
    """The modelled device had no room for a request even after freeing the cache."""

    def __init__(self, nbytes: int, alloc_size: int, reserved: int, allocated: int) -> None:
        super().__init__(
            f"modelled CUDA out of memory: tried to allocate {alloc_size} bytes "
            f"(request {nbytes}); {reserved} bytes reserved, {allocated} allocated"
        )
        self.nbytes = nbytes
        self.alloc_size = alloc_size
        self.reserved = reserved
        self.allocated = allocated


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def round_size(nbytes: int, conf: AllocConf) -> int:
    """torch's ``round_size``: the block size a request of ``nbytes`` asks the pools for."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    divisions = conf.divisions_for(nbytes)
    if divisions > 1 and nbytes > MIN_BLOCK * divisions:
        if nbytes & (nbytes - 1) == 0:
            return nbytes
        floor = 1 << (nbytes.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        rounded = nbytes & ~(step - 1)
        return nbytes if rounded == nbytes else rounded + step
    return round_up(nbytes, MIN_BLOCK)


def allocation_size(size: int, conf: AllocConf) -> int:
    """torch's ``get_allocation_size``: bytes cudaMalloc-ed for a rounded request."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return conf.large_segment_size
    return round_up(size, ROUND_LARGE)


class _Block:
    """One block (torch's ``Block``): a piece of a segment, linked to its neighbours."""

    __slots__ = (
        "addr",
        "size",
        "requested",
        "allocated",
        "prev",
        "next",
        "pool",
        "mapped",
        "es",
        "gc_base",
    )

    def __init__(self, addr: int, size: int, pool: _Pool, es: _Expandable | None = None) -> None:
        self.addr = addr
        self.size = size
        self.requested = 0
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.pool = pool
        self.mapped = True
        self.es = es
        self.gc_base = 0

    def splice(self, before: _Block | None, after: _Block | None) -> None:
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after


class _Pool:
    """The free blocks of one (stream, small|large) pool: ``free`` holds (size, addr, block)
    sorted, the order torch's ``BlockComparatorSize`` gives within a stream; ``unmapped``
    holds (addr, block) of unmapped expandable ranges."""

    __slots__ = ("stream", "small", "free", "unmapped")

    def __init__(self, stream: int, small: bool) -> None:
        self.stream = stream
        self.small = small
        self.free: list[tuple[int, int, _Block]] = []
        self.unmapped: list[tuple[int, _Block]] = []


class _Expandable:
    """One expandable segment: a virtual range mapped page by page."""

    __slots__ = ("base", "page", "size", "stream", "small")

    def __init__(self, base: int, page: int, size: int, stream: int, small: bool) -> None:
        self.base = base
        self.page = page
        self.size = size
        self.stream = stream
        self.small = small


@dataclass(frozen=True, slots=True)
class AllocatorStats:
    """torch's ``memory_stats()`` figures the model keeps (aggregate over pools), in bytes."""

    allocated_bytes: int
    allocated_peak_bytes: int
    reserved_bytes: int
    reserved_peak_bytes: int
    requested_bytes: int
    requested_peak_bytes: int
    active_bytes: int
    inactive_split_bytes: int
    inactive_split: int
    segments: int  # segments as a snapshot lists them (an expandable one per mapped range)
    segments_peak: int  # most cudaMalloc segments held at once (torch's stats.segment.peak)
    largest_free_block_bytes: int
    num_device_alloc: int
    num_device_free: int
    num_alloc_retries: int
    num_ooms: int


class CachingAllocatorModel:
    """One device's caching allocator.

    ``capacity_bytes``: how much the allocator may reserve before cudaMalloc fails (None:
    unlimited). With ``conf.per_process_memory_fraction`` below 1 the allowed maximum is that
    fraction of the capacity, and only then does ``garbage_collection_threshold`` act, as in
    torch. ``record_trace``: keep torch-format trace entries in :attr:`trace` (``alloc``,
    ``free_requested``, ``free_completed`` and the segment events); the segment events alone
    are always kept in :attr:`segment_events` unless ``keep_segment_events`` is False.
    """

    def __init__(
        self,
        conf: AllocConf | None = None,
        *,
        capacity_bytes: int | None = None,
        device: int = 0,
        address_source: AddressSource | None = None,
        cuda_malloc_fails: MallocFailureOracle | None = None,
        record_trace: bool = False,
        keep_segment_events: bool = True,
    ) -> None:
        self.conf = conf or AllocConf()
        self.device = device
        self.capacity = capacity_bytes
        fraction = self.conf.per_process_memory_fraction
        self.allowed_max = (
            int(fraction * capacity_bytes)
            if capacity_bytes is not None and fraction < 1.0
            else None
        )
        self._address_source = address_source
        self._malloc_fails = cuda_malloc_fails
        self._attempt = 0
        self._next_address = ADDRESS_BASE
        self._max_split = self.conf.max_split_size
        self._max_split_cmp = self._max_split if self._max_split is not None else 1 << 64
        self._non_split_rounding = self.conf.max_non_split_rounding
        self._expandable = self.conf.expandable_segments
        self._gc_on = self.conf.garbage_collection_threshold > 0 and self.allowed_max is not None
        self._pools: dict[tuple[int, bool], _Pool] = {}
        self._gc_calls = {True: 0, False: 0}  # get_free_blocks_call_count per pool kind
        self._active: dict[int, _Block] = {}
        self._expandables: list[_Expandable] = []
        self._cuda_ranges: dict[int, int] = {}  # live cudaMalloc segments: address -> size
        self.trace: list[dict[str, Any]] | None = [] if record_trace else None
        self.segment_events: list[dict[str, Any]] | None = [] if keep_segment_events else None
        # Stats (torch's DeviceStats, aggregate).
        self.reserved = 0
        self.reserved_peak = 0
        self.allocated = 0
        self.allocated_peak = 0
        self.requested = 0
        self.requested_peak = 0
        self.active_bytes = 0
        self.inactive_split = 0
        self.inactive_split_bytes = 0
        self.cuda_segments = 0
        self.cuda_segments_peak = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0

    # ------------------------------------------------------------------ public API

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """Allocate ``nbytes`` on ``stream``; return the block's address (the handle to free).

        Raises :class:`OutOfMemory` when the modelled device is full after freeing the cache.
        """
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        size = round_size(nbytes, self.conf)
        small = size <= SMALL_SIZE
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[(stream, small)] = _Pool(stream, small)
        block = self._get_free_block(pool, size)
        if block is None:
            alloc_size = allocation_size(size, self.conf)
            self._attempt = 0
            if self._gc_on:
                self._garbage_collect()
            block = self._alloc_block(pool, size, alloc_size, False)
            if block is None and self._release_available_cached_blocks(pool, size):
                block = self._alloc_block(pool, size, alloc_size, False)
            if block is None:
                self.empty_cache()
                block = self._alloc_block(pool, size, alloc_size, True)
            if block is None:
                self.num_ooms += 1
                self._record(OOM, 0, size, stream)
                raise OutOfMemory(nbytes, alloc_size, self.reserved, self.allocated)
        return self._alloc_found_block(block, pool, size, nbytes)

    def free(self, addr: int) -> None:
        """Free the block :meth:`malloc` returned at ``addr``."""
        block = self._active.pop(addr, None)
        if block is None:
            raise KeyError(f"no live block at address {addr:#x}")
        block.allocated = False
        self.allocated -= block.size
        if self.trace is not None:
            self._record(FREE_REQUESTED, block.addr, block.requested, block.pool.stream)
            self._record(FREE_COMPLETED, block.addr, block.requested, block.pool.stream)
        self._free_block(block)

    def empty_cache(self) -> None:
        """torch's ``release_cached_blocks``: give every unsplit cached block back, and unmap
        the free pages of expandable segments."""
        for small in (False, True):
            pools = [p for (s, sm), p in sorted(self._pools.items()) if sm == small]
            to_unmap: list[_Block] = []
            for pool in pools:
                for _, _, block in list(pool.free):
                    if block.es is not None:
                        to_unmap.append(block)
                    elif block.prev is None and block.next is None:
                        self._release_block(block)
            for block in to_unmap:
                self._unmap_block(block)
                if block.prev is None and block.next is None:
                    self._release_expandable(block)

    @property
    def stats(self) -> AllocatorStats:
        largest = max((p.free[-1][0] for p in self._pools.values() if p.free), default=0)
        return AllocatorStats(
            allocated_bytes=self.allocated,
            allocated_peak_bytes=self.allocated_peak,
            reserved_bytes=self.reserved,
            reserved_peak_bytes=self.reserved_peak,
            requested_bytes=self.requested,
            requested_peak_bytes=self.requested_peak,
            active_bytes=self.active_bytes,
            inactive_split_bytes=self.inactive_split_bytes,
            inactive_split=self.inactive_split,
            segments=len(self._segment_heads()),
            segments_peak=self.cuda_segments_peak,
            largest_free_block_bytes=largest,
            num_device_alloc=self.num_device_alloc,
            num_device_free=self.num_device_free,
            num_alloc_retries=self.num_alloc_retries,
            num_ooms=self.num_ooms,
        )

    def block_size(self, addr: int) -> int:
        """The size of the live block at ``addr`` (its rounded size, with any unsplit slack)."""
        return self._active[addr].size

    def snapshot_segments(self) -> list[dict[str, Any]]:
        """The state as torch's ``_snapshot()['segments']`` lists it: one entry per cudaMalloc
        segment, or per contiguous mapped range of an expandable segment, by address."""
        out = []
        for head in self._segment_heads():
            blocks: list[dict[str, Any]] = []
            allocated = active = requested = 0
            b: _Block | None = head
            while b is not None and b.mapped:
                blocks.append(
                    {
                        "address": b.addr,
                        "size": b.size,
                        "requested_size": b.requested,
                        "state": ACTIVE_ALLOCATED if b.allocated else INACTIVE,
                        "frames": [],
                    }
                )
                if b.allocated:
                    allocated += b.size
                    active += b.size
                    requested += b.requested
                b = b.next
            out.append(
                {
                    "device": self.device,
                    "address": head.addr,
                    "total_size": sum(x["size"] for x in blocks),
                    "allocated_size": allocated,
                    "active_size": active,
                    "requested_size": requested,
                    "stream": head.pool.stream,
                    "segment_type": "small" if head.pool.small else "large",
                    "segment_pool_id": DEFAULT_POOL_ID,
                    "is_expandable": head.es is not None,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        return out

    # ------------------------------------------------ starting from a known state

    def install_segment(
        self,
        addr: int,
        size: int,
        *,
        stream: int = 0,
        small: bool,
        live_blocks: Iterable[tuple[int, int, int]] = (),
    ) -> list[int]:
        """Add a cudaMalloc segment that already exists, with ``live_blocks`` (address, size,
        requested) allocated in it and the gaps between them free; return the live addresses.
        Used to start a replay from the state a snapshot implies."""
        pool = self._pool(stream, small)
        self._cuda_ranges[addr] = size
        self.reserved += size
        self.reserved_peak = max(self.reserved_peak, self.reserved)
        self.cuda_segments += 1
        self.cuda_segments_peak = max(self.cuda_segments_peak, self.cuda_segments)
        self._next_address = max(self._next_address, round_up(addr + size, ROUND_LARGE))
        return self._lay_out(pool, addr, size, None, live_blocks, split_stats=True)[0]

    def install_expandable(
        self,
        base: int,
        mapped: list[tuple[int, int]],
        *,
        stream: int = 0,
        small: bool,
        live_blocks: Iterable[tuple[int, int, int]] = (),
        va_bytes: int | None = None,
    ) -> list[int]:
        """Add an expandable segment at ``base`` whose ``mapped`` ranges (address, size) are
        backed, with ``live_blocks`` allocated in them; return the live addresses."""
        pool = self._pool(stream, small)
        page = SMALL_BUFFER if small else self.conf.large_segment_size
        end = max((a + s for a, s in mapped), default=base)
        total = round_up(
            max(self._va_bytes(page) if va_bytes is None else va_bytes, end - base), page
        )
        es = _Expandable(base, page, total, stream, small)
        self._expandables.append(es)
        self._next_address = max(self._next_address, round_up(base + total, ROUND_LARGE))
        live = list(live_blocks)
        live_addrs: list[int] = []
        prev: _Block | None = None
        cursor = base
        for a, s in sorted(mapped) + [(base + total, 0)]:
            if a > cursor:  # an unmapped gap
                gap = _Block(cursor, a - cursor, pool, es)
                gap.mapped = False
                gap.splice(prev, None)
                insort(pool.unmapped, (gap.addr, gap))
                prev = gap
            if s:
                inside = [lb for lb in live if a <= lb[0] < a + s]
                addrs, prev = self._lay_out(pool, a, s, es, inside, split_stats=False, prev=prev)
                live_addrs += addrs
                self._grow_reserved(s)
            cursor = a + s
        return live_addrs

    # ---------------------------------------------------------------- internals

    def _pool(self, stream: int, small: bool) -> _Pool:
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[(stream, small)] = _Pool(stream, small)
        return pool

    def _va_bytes(self, page: int) -> int:
        if self.capacity is None:
            return DEFAULT_VA_BYTES
        return round_up(self.capacity + self.capacity // 8, page)

    def _lay_out(
        self,
        pool: _Pool,
        addr: int,
        size: int,
        es: _Expandable | None,
        live_blocks: Iterable[tuple[int, int, int]],
        *,
        split_stats: bool,
        prev: _Block | None = None,
    ) -> tuple[list[int], _Block]:
        blocks: list[_Block] = []
        cursor = addr
        end = addr + size
        for b_addr, b_size, b_req in sorted(live_blocks):
            if b_addr < cursor or b_addr + b_size > end:
                raise ValueError(f"live block {b_addr:#x}+{b_size} overlaps or leaves its segment")
            if b_addr > cursor:
                blocks.append(_Block(cursor, b_addr - cursor, pool, es))
            live = _Block(b_addr, b_size, pool, es)
            live.allocated = True
            live.requested = b_req
            blocks.append(live)
            cursor = b_addr + b_size
        if cursor < end:
            blocks.append(_Block(cursor, end - cursor, pool, es))
        for b in blocks:
            b.splice(prev, None)
            prev = b
        split = len(blocks) > 1 or blocks[0].prev is not None
        out = []
        for b in blocks:
            if b.allocated:
                self._active[b.addr] = b
                self.allocated += b.size
                self.active_bytes += b.size
                self.requested += b.requested
                out.append(b.addr)
            else:
                self._insert_free(pool, b)
                if split_stats and split:
                    self.inactive_split += 1
                    self.inactive_split_bytes += b.size
        self.allocated_peak = max(self.allocated_peak, self.allocated)
        self.requested_peak = max(self.requested_peak, self.requested)
        return out, blocks[-1]

    def _insert_free(self, pool: _Pool, block: _Block) -> None:
        block.gc_base = self._gc_calls[pool.small]
        insort(pool.free, (block.size, block.addr, block))

    @staticmethod
    def _remove_free(pool: _Pool, block: _Block) -> None:
        lst = pool.free
        i = bisect_left(lst, (block.size, block.addr))
        del lst[i]

    def _record(self, action: str, addr: int, size: int, stream: int) -> None:
        entry = {"action": action, "addr": addr, "size": size, "stream": stream}
        if self.trace is not None:
            self.trace.append(entry)
        if self.segment_events is not None and action.startswith("segment_"):
            self.segment_events.append(entry)

    def _in_use(self, addr: int, nbytes: int) -> bool:
        """Whether [addr, addr + nbytes) overlaps memory the model holds (a replay's recorded
        address can, once the model has gone its own way)."""
        end = addr + nbytes
        if any(a < end and addr < a + n for a, n in self._cuda_ranges.items()):
            return True
        return any(es.base < end and addr < es.base + es.size for es in self._expandables)

    def _new_address(self, kind: str, nbytes: int) -> int:
        if self._address_source is not None:
            addr = self._address_source(kind, nbytes)
            if addr is not None and not self._in_use(addr, nbytes):
                self._next_address = max(self._next_address, round_up(addr + nbytes, ROUND_LARGE))
                return addr
        addr = self._next_address
        self._next_address = round_up(addr + nbytes, ROUND_LARGE)
        return addr

    def fits_cached(self, nbytes: int, stream: int = 0) -> bool:
        """Whether a request would be served from a cached free block (no new memory)."""
        size = round_size(nbytes, self.conf)
        pool = self._pools.get((stream, size <= SMALL_SIZE))
        return pool is not None and self._find_free(pool, size) is not None

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        if self._gc_on:
            self._gc_calls[pool.small] += 1
        i = self._find_free(pool, size)
        if i is None:
            return None
        block = pool.free[i][2]
        del pool.free[i]
        return block

    def _find_free(self, pool: _Pool, size: int) -> int | None:
        lst = pool.free
        i = bisect_left(lst, (size,))
        n = len(lst)
        if i == n:
            return None
        if lst[i][2].es is not None:
            if self._expandable:
                # Best fit counts what an expandable block can grow into (torch's
                # expandable_size): its size plus the unmapped range after it.
                def grow(b: _Block) -> int:
                    nxt = b.next
                    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

                j = i + 1
                while lst[i][2].es is not None and j < n and grow(lst[j][2]) < grow(lst[i][2]):
                    i = j
                    j += 1
            else:
                i += 1
                while i < n and lst[i][2].es is not None:
                    i += 1
                if i == n:
                    return None
        block_size = lst[i][0]
        if size < self._max_split_cmp <= block_size:
            return None  # an oversize block is not split for a smaller request
        if size >= self._max_split_cmp and block_size >= size + self._non_split_rounding:
            return None
        return i

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.small or self._expandable:
            return remaining >= MIN_BLOCK
        return size < self._max_split_cmp and remaining > SMALL_SIZE

    def _alloc_found_block(self, block: _Block, pool: _Pool, size: int, nbytes: int) -> int:
        already_split = block.prev is not None or block.next is not None
        if self._should_split(block, size):
            remaining = block
            block = _Block(remaining.addr, size, pool, remaining.es)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            self._insert_free(pool, remaining)
            if remaining.es is None:
                if already_split:
                    self.inactive_split_bytes -= size
                else:
                    self.inactive_split_bytes += remaining.size
                    self.inactive_split += 1
        elif already_split and block.es is None:
            self.inactive_split_bytes -= block.size
            self.inactive_split -= 1
        block.allocated = True
        block.requested = nbytes
        addr = block.addr
        self._active[addr] = block
        self.allocated += block.size
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated
        self.active_bytes += block.size
        self.requested += nbytes
        if self.requested > self.requested_peak:
            self.requested_peak = self.requested
        if self.trace is not None:
            self._record(ALLOC, addr, nbytes, pool.stream)
        return addr

    def _free_block(self, block: _Block) -> None:
        pool = block.pool
        original_size = block.size
        net_blocks = 0
        net_size = 0
        for candidate in (block.prev, block.next):
            subsumed = self._try_merge(block, candidate, pool)
            if subsumed:
                net_blocks -= 1
                net_size -= subsumed
        self._insert_free(pool, block)
        if block.prev is not None or block.next is not None:
            net_blocks += 1
            net_size += block.size
        if block.es is None:
            self.inactive_split += net_blocks
            self.inactive_split_bytes += net_size
        self.active_bytes -= original_size
        self.requested -= block.requested

    def _try_merge(self, dst: _Block, src: _Block | None, pool: _Pool) -> int:
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            self._remove_free(pool, src)
        else:
            i = bisect_left(pool.unmapped, (src.addr,))
            del pool.unmapped[i]
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _grow_reserved(self, nbytes: int) -> None:
        self.reserved += nbytes
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved

    def _alloc_block(
        self, pool: _Pool, size: int, alloc_size: int, is_retry: bool
    ) -> _Block | None:
        if is_retry:
            self.num_alloc_retries += 1
        if self.allowed_max is not None and self.reserved + alloc_size > self.allowed_max:
            return None
        attempt = self._attempt
        self._attempt += 1
        if self._malloc_fails is not None and self._malloc_fails(attempt):
            return None
        if self._expandable:
            return self._try_allocate_expandable(pool, size)
        if self.capacity is not None and self.reserved + alloc_size > self.capacity:
            return None
        addr = self._new_address("cudaMalloc", alloc_size)
        block = _Block(addr, alloc_size, pool)
        self._cuda_ranges[addr] = alloc_size
        self._grow_reserved(alloc_size)
        self.cuda_segments += 1
        if self.cuda_segments > self.cuda_segments_peak:
            self.cuda_segments_peak = self.cuda_segments
        self.num_device_alloc += 1
        self._record(SEGMENT_ALLOC, addr, alloc_size, pool.stream)
        return block

    def _release_block(self, block: _Block) -> None:
        pool = block.pool
        self._record(SEGMENT_FREE, block.addr, block.size, pool.stream)
        self.num_device_free += 1
        self.reserved -= block.size
        self.cuda_segments -= 1
        self._cuda_ranges.pop(block.addr, None)
        self._remove_free(pool, block)

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        max_split = self._max_split
        if max_split is None:
            return False
        key = max(size, max_split)
        lst = pool.free
        i = bisect_left(lst, (key,))
        if i == len(lst) or lst[i][2].es is not None:
            # No single block is large enough: free oversize blocks, largest first.
            if i == 0:
                return False
            released = 0
            i -= 1
            while released < key and lst[i][0] >= max_split:
                cur = i
                first = cur == 0
                if not first:
                    i -= 1
                block = lst[cur][2]
                if block.es is None:
                    released += block.size
                    self._release_block(block)
                if first:
                    break
            return released >= key
        self._release_block(lst[i][2])
        return True

    def _garbage_collect(self) -> None:
        assert self.allowed_max is not None
        threshold = int(self.conf.garbage_collection_threshold * self.allowed_max)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        calls = self._gc_calls[False]
        large = [b for (s, sm), p in sorted(self._pools.items()) if not sm for _, _, b in p.free]
        unsplit = [b for b in large if b.prev is None and b.next is None]
        total_age = sum(calls - b.gc_base for b in unsplit)
        count = len(unsplit)
        if count == 0:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            large = [
                b for (s, sm), p in sorted(self._pools.items()) if not sm for _, _, b in p.free
            ]
            for b in large:
                if b.prev is None and b.next is None and b.es is None:
                    age = calls - b.gc_base
                    if age >= age_threshold:
                        freed = True
                        reclaimed += b.size
                        total_age -= age
                        count -= 1
                        self._release_block(b)

    # ------------------------------------------------------- expandable segments

    def _try_allocate_expandable(self, pool: _Pool, size: int) -> _Block | None:
        candidate = self._find_expandable_block(pool, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            nxt = candidate.next
            assert nxt is not None
            if not self._map_block(nxt, min(size - candidate.size, nxt.size)):
                return None
            candidate = nxt
        self._remove_free(pool, candidate)
        return candidate

    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        def space(b: _Block | None) -> int:
            total = 0
            while total < size and b is not None and not b.allocated:
                total += b.size
                b = b.next
            return total

        for _, c in list(pool.unmapped):
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            if space(c) >= size:
                return c
        page = SMALL_BUFFER if pool.small else self.conf.large_segment_size
        va = self._va_bytes(page)
        es = _Expandable(self._new_address("reserve", va), page, va, pool.stream, pool.small)
        self._expandables.append(es)
        candidate = _Block(es.base, es.size, pool, es)
        candidate.mapped = False
        insort(pool.unmapped, (candidate.addr, candidate))
        return candidate

    def _map_block(self, to_map: _Block, size: int) -> bool:
        es = to_map.es
        assert es is not None
        begin = (to_map.addr - es.base) // es.page
        end = -(-(to_map.addr + size - es.base) // es.page)
        nbytes = (end - begin) * es.page
        if nbytes == 0:
            return False
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            return False
        pool = to_map.pool
        i = bisect_left(pool.unmapped, (to_map.addr,))
        del pool.unmapped[i]
        to_map.mapped = True
        mapped_addr = to_map.addr
        if nbytes < to_map.size:
            rest = _Block(to_map.addr + nbytes, to_map.size - nbytes, pool, es)
            rest.mapped = False
            rest.splice(to_map, to_map.next)
            insort(pool.unmapped, (rest.addr, rest))
            to_map.size = nbytes
        self._try_merge(to_map, to_map.prev, pool)
        self._try_merge(to_map, to_map.next, pool)
        self._insert_free(pool, to_map)
        self._grow_reserved(nbytes)
        self.num_device_alloc += 1
        self._record(SEGMENT_MAP, mapped_addr, nbytes, pool.stream)
        return True

    def _unmap_block(self, block: _Block) -> None:
        es = block.es
        assert es is not None
        begin = -(-(block.addr - es.base) // es.page)
        end = (block.addr + block.size - es.base) // es.page
        if begin >= end:
            return
        pool = block.pool
        self._remove_free(pool, block)
        u_addr = es.base + begin * es.page
        u_size = (end - begin) * es.page
        before = u_addr - block.addr
        if before > 0:
            head = _Block(block.addr, before, pool, es)
            head.splice(block.prev, block)
            self._insert_free(pool, head)
        after = block.size - (before + u_size)
        if after > 0:
            tail = _Block(u_addr + u_size, after, pool, es)
            tail.splice(block, block.next)
            self._insert_free(pool, tail)
        block.addr = u_addr
        block.size = u_size
        block.mapped = False
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        insort(pool.unmapped, (block.addr, block))
        self.reserved -= u_size
        self.num_device_free += 1
        self._record(SEGMENT_UNMAP, u_addr, u_size, pool.stream)

    def _release_expandable(self, block: _Block) -> None:
        pool = block.pool
        i = bisect_left(pool.unmapped, (block.addr,))
        del pool.unmapped[i]
        self._expandables.remove(block.es)  # type: ignore[arg-type]

    def _segment_heads(self) -> list[_Block]:
        blocks = list(self._active.values())
        for pool in self._pools.values():
            blocks.extend(b for _, _, b in pool.free)
        heads = [b for b in blocks if b.prev is None or not b.prev.mapped]
        heads.sort(key=lambda b: b.addr)
        return heads
