"""Write a file whole or not at all: a reader never sees half of it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from memprobe.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, what: str = "") -> Path:
    """Write ``data`` to a temporary file beside ``path``, then move it into place.

    An interrupted write leaves the old file (or none) intact. A file system
    error is a :class:`UserError` naming the file.
    """
    target = Path(path)
    label = f"{what} {target}" if what else str(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise UserError(
            f"cannot write {label}: {exc.strerror or exc}", "choose another path"
        ) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        # mkstemp makes the file private (0600); give it the usual permissions.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserError(
                f"cannot write {label}: {exc.strerror or exc}", "choose another path"
            ) from None
        raise
    return target


def check_output(path: str | os.PathLike[str], inputs: Iterable[Path], *, flag: str) -> None:
    """Refuse an output path that is one of the command's inputs, or lies inside an input
    folder: a report must never replace the results (or snapshot) it was made from."""
    target = Path(path).resolve()
    for source in inputs:
        resolved = source.resolve()
        if target == resolved or (source.is_dir() and resolved in target.parents):
            raise UserError(
                f"{flag} {path} would overwrite {source}, an input of this command",
                "choose another path",
            )
