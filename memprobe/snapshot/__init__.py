"""torch's CUDA allocator snapshot format: safe load, write (protocol 4), synthesize, replay."""

from memprobe.snapshot.labels import format_label, parse_label
from memprobe.snapshot.load import DEFAULT_MAX_BYTES, load_snapshot, normalize_snapshot
from memprobe.snapshot.replay import Replay, replay
from memprobe.snapshot.synthesize import synthesize_snapshot
from memprobe.snapshot.write import write_snapshot

__all__ = [
    "DEFAULT_MAX_BYTES",
    "Replay",
    "format_label",
    "load_snapshot",
    "normalize_snapshot",
    "parse_label",
    "replay",
    "synthesize_snapshot",
    "write_snapshot",
]
