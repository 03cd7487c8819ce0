"""Write a snapshot the way torch's viewers read it: pickle protocol 4, atomically."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from memprobe.io.files import write_atomic

# pytorch.org/memory_viz reads protocols 2-4 only; torch's default may be newer.
PROTOCOL = 4


def write_snapshot(snapshot: dict, path: str | os.PathLike[str]) -> Path:
    """Pickle ``snapshot`` to ``path`` (protocol 4) and return the path.

    The bytes go to a temporary file in the same directory first and are moved into
    place with ``os.replace``, so a reader never sees a half-written snapshot and an
    interrupted write leaves the old file intact.
    """
    if not isinstance(snapshot, dict) or not ({"segments", "device_traces"} & set(snapshot)):
        raise TypeError("write_snapshot needs a snapshot dict with 'segments' and 'device_traces'")
    return write_atomic(path, pickle.dumps(snapshot, protocol=PROTOCOL), what="snapshot")
