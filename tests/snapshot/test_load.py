"""The safe loader: every variant real snapshot files have, and every kind of bad file."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import pytest
import snapshot_fixtures as fx

from memprobe.allocator.snapshot_format import ACTIONS
from memprobe.errors import UserError
from memprobe.snapshot import load_snapshot, normalize_snapshot, write_snapshot


def _dump(tmp_path: Path, obj: object, name: str = "snap.pickle", protocol: int = 4) -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def _error(path: Path, **kw: object) -> str:
    with pytest.raises(UserError) as info:
        load_snapshot(path, **kw)  # type: ignore[arg-type]
    line = info.value.one_line()
    assert "\n" not in line
    return line


# -- good files ---------------------------------------------------------------


def test_round_trip_keeps_the_real_style_snapshot(tmp_path: Path) -> None:
    raw = fx.real_style_snapshot()
    path = write_snapshot(raw, tmp_path / "real.pickle")
    loaded = load_snapshot(path)
    trace = loaded["device_traces"][0]
    assert [e["action"] for e in trace] == [e["action"] for e in raw["device_traces"][0]]
    assert {e["action"] for e in trace} == set(ACTIONS)  # all nine actions survive
    oom = next(e for e in trace if e["action"] == "oom")
    assert "addr" not in oom and oom["device_free"] == 5 * fx.MiB and oom["size"] == 400 * fx.MiB
    assert loaded["allocator_settings"] == raw["allocator_settings"]
    assert loaded["segments"][0]["blocks"][0]["state"] == "active_pending_free"


def test_written_with_protocol_4(tmp_path: Path) -> None:
    # The viewer at pytorch.org/memory_viz reads protocols 2-4 only.
    path = write_snapshot(fx.unchunked_snapshot(), tmp_path / "sub" / "u.pickle")
    assert path.read_bytes()[:2] == b"\x80\x04"
    assert not [p for p in path.parent.iterdir() if p.name != "u.pickle"]  # no temp left


def test_missing_time_us_and_settings_are_tolerated(tmp_path: Path) -> None:
    raw = fx.without_settings(fx.without_time_us(fx.real_style_snapshot()))
    loaded = load_snapshot(_dump(tmp_path, raw))
    assert loaded["allocator_settings"] == {} and loaded["external_annotations"] == []
    assert all("time_us" not in e for e in loaded["device_traces"][0])  # none invented


def test_awaiting_free_is_read_as_pending_free(tmp_path: Path) -> None:
    loaded = load_snapshot(_dump(tmp_path, fx.awaiting_free_spelling(fx.real_style_snapshot())))
    assert loaded["segments"][0]["blocks"][0]["state"] == "active_pending_free"


def test_python_only_and_windows_frames_load(tmp_path: Path) -> None:
    for variant in (fx.python_only_frames, fx.windows_paths):
        loaded = load_snapshot(_dump(tmp_path, variant(fx.real_style_snapshot())))
        assert len(loaded["device_traces"][0]) == len(fx.real_style_snapshot()["device_traces"][0])


def test_empty_trace_and_ring_buffer_load(tmp_path: Path) -> None:
    assert load_snapshot(_dump(tmp_path, fx.empty_trace_snapshot()))["device_traces"] == [[]]
    trace = load_snapshot(_dump(tmp_path, fx.ring_buffer_snapshot()))["device_traces"][0]
    # The window frees blocks it never saw allocated (made before it started).
    seen = set()
    unseen_frees = 0
    for e in trace:
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif e["action"] == "free_completed":
            unseen_frees += e["addr"] not in seen
            seen.discard(e["addr"])
    assert unseen_frees > 0


def test_legacy_segment_list_gets_addresses_and_requested_sizes() -> None:
    snap = normalize_snapshot(fx.legacy_segment_list())
    blocks = snap["segments"][0]["blocks"]
    assert [b["address"] for b in blocks] == [fx.SEG_A, fx.SEG_A + fx.MiB]
    assert blocks[0]["requested_size"] == 1000 * 1000 and blocks[0]["frames"] == fx.PY_TRAIN
    assert snap["segments"][0]["allocated_size"] == fx.MiB
    assert snap["device_traces"] == []


def test_protocol_2_pickles_load(tmp_path: Path) -> None:
    loaded = load_snapshot(_dump(tmp_path, fx.real_style_snapshot(), protocol=2))
    assert loaded["segments"][0]["segment_pool_id"] == (0, 0)


# -- bad files ----------------------------------------------------------------


def test_refuses_a_global_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(fx.malicious_pickle(f"touch {marker}"))
    line = _error(path)
    assert "refused" in line and "system" in line
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "is empty"),
        (b"\x00\x01garbage", "not a pickle"),
        (b'{"segments": []}', "JSON"),
        (b"<!DOCTYPE html><html>", "HTML"),
        (gzip.compress(b"x", mtime=0), "gzip"),  # mtime=0: the same id in every worker
        (b"PK\x03\x04rest-of-zip", "zip"),
    ],
)
def test_bad_contents_give_one_clear_line(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    assert expected in _error(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert "does not exist" in _error(tmp_path / "nope.pickle")
    assert "is a directory" in _error(tmp_path)


def test_truncated_pickle(tmp_path: Path) -> None:
    data = pickle.dumps(fx.unchunked_snapshot(), protocol=4)
    for cut in (len(data) // 2, len(data) - 1, 3):
        path = tmp_path / f"cut{cut}.pickle"
        path.write_bytes(data[:cut])
        assert "truncated" in _error(path)


def test_corrupt_pickle(tmp_path: Path) -> None:
    data = bytearray(pickle.dumps(fx.unchunked_snapshot(), protocol=4))
    data[2:40] = b"\xff" * 38  # opcodes turned to junk after a valid header
    path = tmp_path / "corrupt.pickle"
    path.write_bytes(bytes(data))
    assert "corrupt" in _error(path)


def test_size_limit(tmp_path: Path) -> None:
    path = _dump(tmp_path, fx.unchunked_snapshot())
    assert "over the" in _error(path, max_bytes=100)
    assert load_snapshot(path, max_bytes=path.stat().st_size)["device_traces"]


@pytest.mark.parametrize(
    "obj",
    [[1, 2, 3], {"a": 1}, "snapshot", 42, None, [], {}],
    ids=["list", "dict", "str", "int", "none", "empty-list", "empty-dict"],
)
def test_pickles_that_are_not_snapshots(tmp_path: Path, obj: object) -> None:
    assert "not a CUDA memory snapshot" in _error(_dump(tmp_path, obj))


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: s.__setitem__("segments", "nope"), "'segments' is a str"),
        (lambda s: s["device_traces"][0].append(7), "is a int, not a dict"),
        (lambda s: s["device_traces"][0].append({"size": 1}), "has no 'action'"),
        (lambda s: s["device_traces"][0][1].pop("addr"), "(alloc) has no valid 'addr'"),
        (lambda s: s["device_traces"][0][1].__setitem__("size", "big"), "no valid 'size'"),
        (lambda s: s["segments"][0]["blocks"][0].pop("state"), "has no 'state'"),
    ],
)
def test_malformed_snapshots_name_the_part(tmp_path: Path, mutate: object, expected: str) -> None:
    raw = fx.real_style_snapshot()
    mutate(raw)  # type: ignore[operator]
    line = _error(_dump(tmp_path, raw))
    assert "not a valid CUDA memory snapshot" in line and expected in line


def test_json_dump_of_a_snapshot_is_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps({"segments": [], "device_traces": []}))
    assert "not a pickle" in _error(path)
