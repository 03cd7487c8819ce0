"""Build a torch-format allocator snapshot from memprobe's tracker trace.

On ``meta`` and ``cpu`` there is no CUDA allocator to ask, but the tracker saw every
storage come and go. This turns that trace into the dict ``torch.cuda.memory._snapshot()``
would give, so the same viewers (``torch.cuda._memory_viz``, pytorch.org/memory_viz)
and ``memprobe attribute`` read simulated and real runs alike.

The allocator is modelled without caching: each storage gets a fresh segment sized by
torch's rules (:mod:`memprobe.snapshot.allocator`), returned when the storage dies.
Reserved bytes in a synthesized snapshot are therefore "what a cache-less allocator
would hold", not a prediction of the caching allocator's reserve. Addresses are a bump
allocator (never reused), so every block in the file is unambiguous.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from memprobe.records import Case, Event, Frame
from memprobe.snapshot.allocator import (
    ROUND_LARGE,
    block_size_in_segment,
    is_small,
    round_up,
    segment_size,
)
from memprobe.snapshot.labels import format_label

# A plausible CUDA virtual address, 2 MiB aligned like real segments.
BASE_ADDRESS = 0x7F00_0000_0000
ALLOCATOR_MODEL = "memprobe synthesized: one segment per storage, no caching"


@dataclass
class _Block:
    addr: int
    nbytes: int
    seg_bytes: int
    block_bytes: int
    frames: list[dict[str, Any]]
    label: str = ""


class _Synth:
    def __init__(self, case_id: str | None) -> None:
        self.case_id = case_id
        self.next_addr = BASE_ADDRESS
        self.trace: list[dict[str, Any]] = []
        self.live: dict[int, _Block] = {}
        self.orphans: list[_Block] = []  # a second alloc of a live storage id
        self.last_time = 0

    def _time(self, t: float) -> int:
        # Snapshot times are integer microseconds and never go backwards.
        self.last_time = max(self.last_time, int(round(t)))
        return self.last_time

    def _label(self, ev: Event) -> str:
        return format_label(
            case=self.case_id, phase=ev.phase, op=ev.op, dtype=ev.dtype, shape=ev.shape
        )

    def _new_block(self, ev: Event) -> _Block:
        seg = segment_size(ev.nbytes)
        block = _Block(
            addr=self.next_addr,
            nbytes=ev.nbytes,
            seg_bytes=seg,
            block_bytes=block_size_in_segment(ev.nbytes, seg),
            frames=frames_to_dicts(ev.frames),
        )
        self.next_addr += round_up(seg, ROUND_LARGE)
        return block

    def _entry(self, action: str, addr: int, size: int, t: int, frames: list, label: str) -> None:
        self.trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": t,
                "frames": frames,
                "user_metadata": label,
            }
        )

    def alloc(self, ev: Event) -> None:
        block = self._new_block(ev)
        if ev.storage in self.live:
            self.orphans.append(self.live[ev.storage])
        self.live[ev.storage] = block
        t, label = self._time(ev.time_us), self._label(ev)
        block.label = label
        self._entry("segment_alloc", block.addr, block.seg_bytes, t, block.frames, label)
        self._entry("alloc", block.addr, block.nbytes, t, block.frames, label)

    def free(self, ev: Event) -> None:
        block = self.live.pop(ev.storage, None)
        if block is None:
            # Freed but never seen made: it existed before tracking began. Emit the
            # free anyway, as a ring-buffer-truncated CUDA trace would.
            block = self._new_block(ev)
        t, label = self._time(ev.time_us), self._label(ev)
        frames = frames_to_dicts(ev.frames) if ev.frames else block.frames
        self._entry("free_requested", block.addr, block.nbytes, t, frames, label)
        self._entry("free_completed", block.addr, block.nbytes, t, frames, label)
        self._entry("segment_free", block.addr, block.seg_bytes, t, frames, label)

    def segments(self, device: int) -> list[dict[str, Any]]:
        live = sorted([*self.live.values(), *self.orphans], key=lambda b: b.addr)
        return [_segment(b, device) for b in live]


def frames_to_dicts(frames: Iterable[Frame]) -> list[dict[str, Any]]:
    return [{"name": f.name, "filename": f.filename, "line": int(f.line)} for f in frames]


def _segment(b: _Block, device: int) -> dict[str, Any]:
    blocks = [
        {
            "address": b.addr,
            "size": b.block_bytes,
            "requested_size": b.nbytes,
            "state": "active_allocated",
            "frames": b.frames,
            # Not in torch's block dicts (viewers ignore it): keeps memprobe's label on
            # blocks whose alloc a trimmed trace no longer holds.
            "user_metadata": b.label,
        }
    ]
    if b.seg_bytes > b.block_bytes:
        blocks.append(
            {
                "address": b.addr + b.block_bytes,
                "size": b.seg_bytes - b.block_bytes,
                "requested_size": 0,
                "state": "inactive",
                "frames": [],
            }
        )
    return {
        "device": device,
        "address": b.addr,
        "total_size": b.seg_bytes,
        "allocated_size": b.block_bytes,
        "active_size": b.block_bytes,
        "requested_size": b.nbytes,
        "stream": 0,
        "segment_type": "small" if is_small(b.nbytes) else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": b.frames,
        "blocks": blocks,
    }


def synthesize_snapshot(
    events: Iterable[Event], *, case: Case | None = None, device: int = 0
) -> dict[str, Any]:
    """A torch snapshot dict from tracker events (``alloc`` / ``free``), in index order.

    The trace holds ``segment_alloc`` + ``alloc`` for each storage and
    ``free_requested`` + ``free_completed`` + ``segment_free`` when it dies, each with
    ``addr``, ``size`` (the storage's bytes), ``stream`` 0, ``time_us``, ``frames`` and a
    memprobe label in ``user_metadata`` (case, phase, op, dtype, shape). ``segments``
    describe what is live at the end of the trace, as in a snapshot taken then.
    Zero-byte storages are skipped: CUDA never allocates for them.
    """
    if device < 0:
        raise ValueError("device must be >= 0")
    synth = _Synth(case.case_id if case is not None else None)
    for ev in sorted(events, key=lambda e: e.index):
        if ev.action == "alloc":
            if ev.nbytes > 0:
                synth.alloc(ev)
        elif ev.action == "free":
            # A free matches its storage's alloc whatever bytes it reports.
            if ev.storage in synth.live or ev.nbytes > 0:
                synth.free(ev)
        else:
            raise ValueError(
                f"event {ev.index} has action {ev.action!r}; expected 'alloc' or 'free'"
            )
    traces: list[list[dict[str, Any]]] = [[] for _ in range(device)] + [synth.trace]
    return {
        "segments": synth.segments(device),
        "device_traces": traces,
        "allocator_settings": {},
        "external_annotations": [],
        "memprobe": {
            "synthesized": True,
            "case": case.case_id if case is not None else None,
            "allocator_model": ALLOCATOR_MODEL,
        },
    }
