"""Hostile inputs, round 33 (files): files whose file system does not know their size
before they are read (procfs, sysfs, some FUSE mounts say 0 bytes for every file), read
to their end rather than called empty; a meta or cpu run whose case's snapshot is not the
one memprobe synthesized for it (torch's own from another job), not drawn as the case's;
stack frames whose filename or name is no string (a huge int, a deep list); allocator
settings holding an int past 4,300 digits. Each table is a variant of a defect class the
pass found."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
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


# -- M1: a meta (or cpu) run whose case's snapshot is torch's own, from another job (copied
# over the case's file, or the memprobe record taken out): memprobe synthesizes every meta
# and cpu case's snapshot, and holds it to its row's peak; torch's were let through (a cuda
# case's is the whole process). A 931 GiB GPU job's file was drawn as the case's: the
# table said 112.25 KiB and the attribution "unchunked Peak allocated 931.32 GiB", and the
# gate named its largest block as a failure's evidence. Now it is not used, and both say so.


def _foreign(snapshot: bytes) -> dict[str, Any]:
    """``snapshot`` (memprobe's, of the run) as another job's file would be."""
    huge = 10**12
    block = {"address": A, "size": huge, "requested_size": huge, "state": "active_allocated",
             "frames": FRAMES}  # fmt: skip
    segment = {"device": 0, "address": A, "total_size": huge, "stream": 0,
               "segment_type": "large", "is_expandable": False, "blocks": [block]}  # fmt: skip
    trace = [{"action": "alloc", "addr": A, "size": huge, "stream": 0, "frames": FRAMES}]
    return {"segments": [segment], "device_traces": [trace]}


def _own_unmarked(snapshot: bytes) -> dict[str, Any]:
    loaded = pickle.loads(snapshot)
    del loaded["memprobe"]
    return loaded


def _marked(value: Any) -> Any:
    def edit(snapshot: bytes) -> dict[str, Any]:
        loaded = pickle.loads(snapshot)
        loaded["memprobe"]["synthesized"] = value
        return loaded

    return edit


FOREIGN = {
    "another job's torch snapshot": _foreign,
    "the run's own, its record taken out": _own_unmarked,
    "marked synthesized False": _marked(False),
    "marked synthesized 'True' (a string)": _marked("True"),
}


def _with_snapshot(made_run: Path, to: Path, edit: Any) -> Path:
    run = Path(shutil.copytree(made_run, to))
    payload = json.loads((run / "results.json").read_text())
    path = run / payload["rows"][0]["snapshot"]
    path.write_bytes(pickle.dumps(edit(path.read_bytes())))
    return run


@pytest.mark.parametrize("what", sorted(FOREIGN))
def test_a_meta_cases_snapshot_that_memprobe_did_not_write_is_not_drawn(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    run = _with_snapshot(made_run, here / "run", FOREIGN[what])
    page = here / "page.html"
    code, out, err = run_cli("report", str(run), "--out", str(page))
    assert code == 0 and not err, (out, err)
    text = page.read_text()
    assert "is not one memprobe synthesized, and every meta case" in text
    assert "931.32 GiB" not in text


@pytest.mark.parametrize("what", sorted(FOREIGN))
def test_the_gate_does_not_explain_a_failure_by_another_jobs_snapshot(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    run = _with_snapshot(made_run, here / "run", FOREIGN[what])
    (here / "pyproject.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{kernel = "*", max_peak = "1KiB"}]\n'
    )
    code, out, err = run_cli("gate", str(run), "--config", str(here / "pyproject.toml"))
    assert code == 1, (out, err)
    assert "is not one memprobe synthesized" in out and "; not read" in out
    assert "train.py:7" not in out  # the foreign file's largest block


# -- K1: a frame whose filename (or name) is not a string: an int past Python's 4,300
# digits, a list nested deeper than its recursion limit. `attribute --what-if` looked for
# memprobe's own kernel modules in every frame through str(filename) and ended in a
# traceback (ValueError "Exceeds the limit (4300 digits)", RecursionError); the report's
# timeline named a block by str(name) the same way. Only a string names a file or function.
def _deep(levels: int) -> list[Any]:
    nested: list[Any] = []
    for _ in range(levels):
        nested = [nested]
    return nested


NOT_A_NAME = {
    "an int of 5,001 digits": lambda: 10**5000,
    "a list 3,000 levels deep": lambda: _deep(3000),
    "a dict": lambda: {"file": "local_chunked.py"},
    "bytes": lambda: b"memprobe/kernels/local_chunked.py",
}


@pytest.mark.parametrize("what", sorted(NOT_A_NAME))
def test_a_frame_filename_that_is_no_string_is_no_traceback_in_what_if(
    run_cli: Any, tmp_path: Path, what: str
) -> None:
    # No loss step is found in this trace: --what-if looks for memprobe's kernels' frames.
    snapshot = pickle.loads(_snapshot())
    entry = snapshot["device_traces"][0][0]
    entry["frames"] = [{"name": "step", "filename": NOT_A_NAME[what](), "line": 7}]
    path = tmp_path / "s.pickle"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # the pickler itself walks the deep list
    try:
        path.write_bytes(pickle.dumps(snapshot))
    finally:
        sys.setrecursionlimit(limit)
    line = one_line(*run_cli("attribute", str(path), "--what-if", "local_chunked"))
    assert "no loss step can be found" in line, line


@pytest.mark.parametrize("what", sorted(NOT_A_NAME))
def test_a_frame_name_that_is_no_string_is_not_a_blocks_name(what: str) -> None:
    from memprobe.report.trace import _first_frame_name

    frames = [{"name": NOT_A_NAME[what](), "filename": "x.py"}, {"name": "step"}]
    assert _first_frame_name(frames) == "step"


# -- S1: allocator_settings holding an int past Python's 4,300 digits (a value, a key, or
# inside the roundup_power2_divisions table): the settings line took str() of each and
# `attribute` (plain, --json, --html, --replay) ended in a ValueError traceback. Said by
# its size now; the rest of the reading stands.
BIG = 10**5000
SETTINGS = {
    "the settings text": {"PYTORCH_CUDA_ALLOC_CONF": BIG},
    "max_split_size": {"max_split_size": BIG},
    "garbage_collection_threshold": {"garbage_collection_threshold": BIG},
    "a divisions count": {"roundup_power2_divisions": {"1": BIG}},
    "a divisions key": {"roundup_power2_divisions": {BIG: 1}},
    "a key of its own": {BIG: 1},
}


@pytest.mark.parametrize("flags", [[], ["--json"], ["--replay"]], ids=["text", "json", "replay"])
@pytest.mark.parametrize("what", sorted(SETTINGS))
def test_settings_holding_a_huge_integer_are_no_traceback(
    run_cli: Any, tmp_path: Path, what: str, flags: list[str]
) -> None:
    snapshot = pickle.loads(_snapshot())
    snapshot["allocator_settings"] = SETTINGS[what]
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    code, out, err = run_cli("attribute", str(path), *flags)
    assert code == 0 and "Traceback" not in err, err
    if flags == ["--json"]:
        assert "20971520" in json.dumps(json.loads(out))
    else:
        assert "peak allocated: 20.00 MiB" in out
