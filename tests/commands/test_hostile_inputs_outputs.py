"""An output path that names a device, a FIFO or a folder is one line: memprobe never
moves a file onto it (as root, ``--out /dev/full`` had replaced the device node)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from memprobe.errors import UserError
from memprobe.io.files import write_atomic
from memprobe.snapshot.write import write_snapshot

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "pipe")
    return tmp / "pipe"


def _folder(tmp: Path) -> Path:
    (tmp / "folder").mkdir()
    return tmp / "folder"


def _link_to_fifo(tmp: Path) -> Path:
    (tmp / "link").symlink_to(_fifo(tmp))
    return tmp / "link"


SPECIAL = [("a FIFO", _fifo), ("a directory", _folder), ("a link to a FIFO", _link_to_fifo)]


@pytest.mark.parametrize(("what", "make"), SPECIAL, ids=[s[0] for s in SPECIAL])
def test_write_atomic_never_replaces_a_special_file(tmp_path: Path, what: str, make: Any) -> None:
    target = make(tmp_path)
    kind = os.stat(target).st_mode
    with pytest.raises(UserError, match="not a regular file"):
        write_atomic(target, "x")
    assert os.stat(target).st_mode == kind  # still the FIFO / folder it was
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # no temporary file left behind


def test_a_regular_file_and_a_new_path_are_still_written(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("old")
    write_atomic(tmp_path / "old.txt", "new")
    write_atomic(tmp_path / "sub" / "new.txt", "made")
    assert (tmp_path / "old.txt").read_text() == "new"
    assert (tmp_path / "sub" / "new.txt").read_text() == "made"


@pytest.mark.parametrize(
    "args",
    [
        ["attribute", "{snap}", "--html", "{fifo}"],
        ["attribute", "{snap}", "--json", "--html", "{folder}"],
    ],
)
def test_commands_refuse_a_special_output(run_cli: Any, tmp_path: Path, args: list[str]) -> None:
    snap = tmp_path / "s.pickle"
    write_snapshot({"segments": [], "device_traces": [[]]}, snap)
    fifo, folder = _fifo(tmp_path), _folder(tmp_path)
    argv = [a.format(snap=snap, fifo=fifo, folder=folder) for a in args]
    code, out, err = run_cli(*argv)
    assert code == 2 and "not a regular file" in err and err.count("\n") == 1, (out, err)
