"""The shape of torch's CUDA allocator snapshot, as memprobe reads and writes it.

These are documentation types over the plain dict that ``torch.cuda.memory._snapshot()``
returns (and that :func:`memprobe.snapshot.load_snapshot` hands back normalised):
a snapshot stays a dict so that torch's own tools (``torch.cuda._memory_viz``) and
the pytorch.org/memory_viz page read what memprobe writes without conversion.
"""

from __future__ import annotations

from typing import Any, TypedDict

# Every action a trace entry can carry (torch 2.x). ``oom`` has ``device_free``
# instead of ``addr``; ``snapshot`` marks the moment a snapshot was taken.
ACTIONS: tuple[str, ...] = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
)
# Reserved memory grows with these and shrinks with their opposites.
SEGMENT_GROW = ("segment_alloc", "segment_map")
SEGMENT_SHRINK = ("segment_free", "segment_unmap")

# Block states. Older torch docs spell the pending state ``active_awaiting_free``;
# the loader rewrites it to the current spelling.
ACTIVE_ALLOCATED = "active_allocated"
ACTIVE_PENDING_FREE = "active_pending_free"
INACTIVE = "inactive"
STATE_ALIASES = {"active_awaiting_free": ACTIVE_PENDING_FREE}
# A block freed by the program but still waiting on another stream still counts
# as allocated (torch's allocated_bytes drops only when the free completes).
LIVE_STATES = (ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE)


class FrameDict(TypedDict):
    name: str
    filename: str
    line: int


class TraceEntryDict(TypedDict, total=False):
    action: str
    addr: int  # absent on ``oom``
    device_free: int  # only on ``oom``
    size: int
    stream: int
    time_us: int  # absent in older files
    frames: list[FrameDict]
    user_metadata: str
    compile_context: str


class BlockDict(TypedDict, total=False):
    address: int
    size: int
    requested_size: int
    state: str
    frames: list[FrameDict]


class SegmentDict(TypedDict, total=False):
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str  # "small" | "large"
    segment_pool_id: Any
    is_expandable: bool
    frames: list[FrameDict]
    blocks: list[BlockDict]


class SnapshotDict(TypedDict, total=False):
    segments: list[SegmentDict]
    device_traces: list[list[TraceEntryDict]]
    allocator_settings: dict[str, Any]
    external_annotations: list[Any]
