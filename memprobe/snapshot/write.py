"""Write a snapshot the way torch's viewers read it: pickle protocol 4, atomically."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

from memprobe.errors import UserError

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
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise UserError(f"cannot write snapshot {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(snapshot, fh, protocol=PROTOCOL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserError(f"cannot write snapshot {target}: {exc.strerror or exc}") from None
        raise
    return target
