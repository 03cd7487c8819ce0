"""The words of the snapshot torch's CUDA caching allocator writes
(``torch.cuda.memory._snapshot()``): trace actions, block states, settings keys.

Defined once, here on the lowest floor, because both sides read them: the snapshot
floor (:mod:`memprobe.snapshot`: loading, block lifetimes) and this package (the model
records what it does in these words; :mod:`memprobe.allocator.snapshot_replay` reads a trace).
"""

from __future__ import annotations

# Trace actions (torch 2.x). ``oom`` has ``device_free`` instead of ``addr``;
# ``snapshot`` marks the moment a snapshot was taken.
ALLOC = "alloc"
FREE_REQUESTED = "free_requested"
FREE_COMPLETED = "free_completed"
SEGMENT_ALLOC = "segment_alloc"
SEGMENT_FREE = "segment_free"
SEGMENT_MAP = "segment_map"
SEGMENT_UNMAP = "segment_unmap"
OOM = "oom"
SNAPSHOT = "snapshot"
ACTIONS: tuple[str, ...] = (
    ALLOC,
    FREE_REQUESTED,
    FREE_COMPLETED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    OOM,
    SNAPSHOT,
)
# The actions whose entry names a block's or a segment's address (and a size).
ADDRESSED_ACTIONS = tuple(a for a in ACTIONS if a not in (OOM, SNAPSHOT))
# The single free action of early history files (torch's viewer still reads it).
FREE = "free"
# A free that took effect (torch's completion, or an early file's free); every free
# action; every action on a block (the requests an allocator serves).
FREED = (FREE_COMPLETED, FREE)
FREES = (FREE_REQUESTED, *FREED)
BLOCK_ACTIONS = (ALLOC, *FREES)
# Reserved memory grows with these and shrinks with their opposites.
SEGMENT_GROW = (SEGMENT_ALLOC, SEGMENT_MAP)
SEGMENT_SHRINK = (SEGMENT_FREE, SEGMENT_UNMAP)

# Block states. Older torch docs spell the pending state ``active_awaiting_free``;
# the loader rewrites it to the current spelling.
ACTIVE_ALLOCATED = "active_allocated"
ACTIVE_PENDING_FREE = "active_pending_free"
INACTIVE = "inactive"
STATE_ALIASES = {"active_awaiting_free": ACTIVE_PENDING_FREE}
# A block freed by the program but still waiting on another stream still counts
# as allocated (torch's allocated_bytes drops only when the free completes).
LIVE_STATES = (ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE)

# ``allocator_settings`` keeps the configuration text under the name of the
# environment variable it came from (newest first), beside the parsed options.
SETTINGS_CONF_KEYS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
