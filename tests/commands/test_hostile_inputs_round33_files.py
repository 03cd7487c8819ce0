"""Hostile inputs, round 33 (files): files whose file system does not know their size
before they are read (procfs, sysfs, some FUSE mounts say 0 bytes for every file), read
to their end rather than called empty. Each table is a variant of a defect class the pass
found."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

from memprobe.errors import UserError
from memprobe.io import files

MIB = 1 << 20
A = 0x7F00_0000_0000
FRAMES = [{"name": "step", "filename": "train.py", "line": 7}]


def _snapshot() -> bytes:
    block = {"address": A, "size": 20 * MIB, "requested_size": 20 * MIB,
             "state": "active_allocated", "frames": FRAMES}  # fmt: skip
    segment = {"device": 0, "address": A, "total_size": 20 * MIB, "stream": 0,
               "segment_type": "large", "is_expandable": False, "blocks": [block]}  # fmt: skip
    trace = [{"action": "alloc", "addr": A, "size": 20 * MIB, "stream": 0, "frames": FRAMES}]
    return pickle.dumps({"segments": [segment], "device_traces": [trace]})


def _sized_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """fstat says 0 bytes for every regular file, as procfs does."""
    real = os.fstat

    def fstat(fd: int) -> Any:
        info = real(fd)
        return os.stat_result((*info[:6], 0, *info[7:]))

    monkeypatch.setattr(files.os, "fstat", fstat)


# -- Z1: a file whose file system reports 0 bytes until it is read (/proc/self/cmdline,
# /proc/self/environ, a sysfs file, a FUSE mount that sizes files lazily): read by the size
# fstat gave, `memprobe attribute /proc/self/cmdline` said "snapshot /proc/self/cmdline is
# empty (0 bytes)" of a file that holds bytes, and a real snapshot on such a mount could not
# be read at all. Such a file is read to its end (still bounded by the size limit).
PROC_FILES = ["/proc/self/cmdline", "/proc/self/environ", "/proc/self/status"]


@pytest.mark.parametrize("path", PROC_FILES)
def test_a_proc_file_is_not_said_to_be_empty(run_cli: Any, path: str) -> None:
    if not Path(path).exists():
        pytest.skip("no procfs here")
    line = one_line(*run_cli("attribute", path))
    assert "empty" not in line and "0 bytes" not in line, line


def test_a_snapshot_whose_size_reads_as_zero_is_read_whole(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(_snapshot())
    _sized_zero(monkeypatch)
    code, out, err = run_cli("attribute", str(path))
    assert code == 0, err
    assert "peak allocated: 20.00 MiB" in out


# (what the file holds, the limit read_regular is given, what it answers)
SIZED_ZERO = {
    "a few bytes": (b"abc", 10, b"abc"),
    "exactly the limit": (b"x" * 10, 10, b"x" * 10),
    "a megabyte and more (several reads)": (b"y" * (MIB + 5), 2 * MIB, b"y" * (MIB + 5)),
    "truly empty": (b"", 10, b""),
}


@pytest.mark.parametrize("what", sorted(SIZED_ZERO))
def test_a_file_sized_zero_is_read_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    data, limit, expected = SIZED_ZERO[what]
    path = tmp_path / "f"
    path.write_bytes(data)
    _sized_zero(monkeypatch)
    assert files.read_regular(path, what="file", max_bytes=limit) == expected


@pytest.mark.parametrize("over", [1, 1000])
def test_a_file_sized_zero_past_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: int
) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"z" * (10 + over))
    _sized_zero(monkeypatch)
    with pytest.raises(UserError, match="over the 10 B limit"):
        files.read_regular(path, what="file", max_bytes=10)
