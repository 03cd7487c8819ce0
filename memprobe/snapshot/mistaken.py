"""Names a user hands `memprobe attribute` or `diff` that are no snapshot's path, said
for what they are rather than as a missing file; and the snapshot file's read after."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memprobe.errors import UserError
from memprobe.io.files import read_regular

# A step's import path (``my_step:train_step``), which `memprobe profile` takes.
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def refuse_a_step(p: Path) -> None:
    """``memprobe attribute my_step:train_step`` (the step, where profile takes it) was
    "snapshot my_step:train_step does not exist (check the path)": the user checks a path
    they never meant. A missing file spelled as an import path is said to be one."""
    text = str(p)
    if p.exists() or p.is_symlink() or not _IMPORT_PATH.fullmatch(text):
        return
    raise UserError(
        f"snapshot {text} is not a file here; it reads as a step's import path (module:function)",
        f"profile the step and read its snapshot: memprobe profile {text} --out step.pickle, "
        "then memprobe attribute step.pickle (profile prints the reading itself too)",
    )


def read_snapshot_file(p: Path, **how: Any) -> bytes:
    """:func:`memprobe.io.files.read_regular` of a snapshot, after :func:`refuse_a_step`."""
    refuse_a_step(p)
    return read_regular(p, **how)
