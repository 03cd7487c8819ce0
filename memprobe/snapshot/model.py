"""The shape of torch's CUDA allocator snapshot, as memprobe reads and writes it.

These are documentation types over the plain dict that ``torch.cuda.memory._snapshot()``
returns (and that :func:`memprobe.snapshot.load_snapshot` hands back normalised):
a snapshot stays a dict so that torch's own tools (``torch.cuda._memory_viz``) and
the pytorch.org/memory_viz page read what memprobe writes without conversion.
The format's words (actions, block states, settings keys) are
:mod:`memprobe.allocator.snapshot_format`'s: the allocator floor reads them too.
"""

from __future__ import annotations

from typing import Any, TypedDict


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
