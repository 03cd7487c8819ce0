"""Hostile inputs, round 35 (files): run directories, snapshots, configs and output paths
given numbers that contradict each other. Each table is a variant of a defect class the
pass found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_STEP, one_line, user_module

from memprobe.results_errors import contradiction

# -- B: `attribute SNAPSHOT --html PAGE` (and `profile --html`) replaced a file of the
# user's own at PAGE without a word, where `report --out` and `plan --out` leave a file
# memprobe did not write alone. A page memprobe wrote is still replaced; a device
# (/dev/stdout) is no kept file.
MIB = 1 << 20
A = 0x7F00_0000_0000
FRAMES = [{"name": "step", "filename": "train.py", "line": 7}]


def _snapshot(path: Path) -> Path:
    import pickle

    block = {"address": A, "size": 2 * MIB, "requested_size": 2 * MIB,
             "state": "active_allocated", "frames": FRAMES}  # fmt: skip
    segment = {"device": 0, "address": A, "total_size": 2 * MIB, "stream": 0,
               "segment_type": "large", "is_expandable": False, "blocks": [block]}  # fmt: skip
    trace = [{"action": "alloc", "addr": A, "size": 2 * MIB, "stream": 0, "frames": FRAMES}]
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [trace]}))
    return path


FOREIGN_PAGES = {
    "notes": b"<html><title>my notes</title></html>",
    "plain text": b"hi\n",
    "empty": b"",
    "a png of mine": b"\x89PNG\r\n\x1a\n not ours",
}


@pytest.mark.parametrize("content", FOREIGN_PAGES.values(), ids=FOREIGN_PAGES)
@pytest.mark.parametrize("linked", [False, True], ids=["file", "link"])
def test_attribute_html_leaves_a_users_file_alone(
    run_cli: Any, tmp_path: Path, content: bytes, linked: bool
) -> None:
    snap = _snapshot(tmp_path / "s.pickle")
    mine = tmp_path / "mine.html"
    mine.write_bytes(content)
    page = tmp_path / "link.html" if linked else mine
    if linked:
        page.symlink_to(mine)
    err = one_line(*run_cli("attribute", str(snap), "--html", str(page)))
    assert "exists and was not written by memprobe" in err, err
    assert mine.read_bytes() == content


def test_attribute_html_replaces_its_own_page(run_cli: Any, tmp_path: Path) -> None:
    snap, page = _snapshot(tmp_path / "s.pickle"), tmp_path / "p.html"
    for _ in range(2):
        code, _, err = run_cli("attribute", str(snap), "--html", str(page))
        assert code == 0, err
    assert b"memprobe" in page.read_bytes()[:4096]


def test_profile_html_leaves_a_users_file_alone(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the step's module is imported from the working directory
    mine = tmp_path / "mine.html"
    mine.write_bytes(b"keep")
    step = user_module(tmp_path, "r35_html_step", TINY_STEP) + ":step"
    err = one_line(*run_cli("profile", step, "--html", str(mine)))
    assert "exists and was not written by memprobe" in err, err
    assert mine.read_bytes() == b"keep"


# One ok meta row as a sweep writes it (unchunked, 128 tokens x 128 vocab, bf16).
ROW: dict[str, Any] = {
    "case_id": "unchunked-b1-s128-v128-bf16-c1024-tp1-cp1-meta-51b5030b",
    "kernel": "unchunked", "batch": 1, "tokens": 128, "vocab": 128, "dtype": "bf16",
    "chunk_size": 1024, "tp": 1, "cp": 1, "device": "meta", "hidden": None, "status": "ok",
    "peak_bytes": 229888, "forward_peak_bytes": 163840, "backward_peak_bytes": 229888,
    "reserved_peak_bytes": 2097152, "reserved_source": "modelled", "floor_bytes": 65536,
    "fwd_time_s": None, "bwd_time_s": None, "max_abs_err_fwd": None, "max_abs_err_bwd": None,
    "big_fp32_blocks": 3, "fwd_collectives": 0, "bwd_collectives": 0, "note": "",
    "snapshot": None,
}  # fmt: skip


# -- A: a results row whose modelled reserved peak is below its allocated peak. The model
# puts every block it hands out inside a segment, so no sweep writes such a row; an edited
# one was drawn as "reserved peak 1 B" beside a 224.50 KiB peak in the report's table (and
# passed to gate and plan --from-run). It is refused, as a floor above the peak is. A
# measured (cuda) figure is a difference from the reserve before the step and may be lower.
RESERVED_BELOW = {
    "1 byte": (1, "modelled", True),
    "one byte short": (229887, "modelled", True),
    "zero": (0, "modelled", True),
    "equal": (229888, "modelled", False),
    "above": (2097152, "modelled", False),
    "measured below": (0, "measured", False),
    "no figure": (None, None, False),
}


@pytest.mark.parametrize("reserved, source, refused", RESERVED_BELOW.values(), ids=RESERVED_BELOW)
def test_a_modelled_reserved_peak_below_the_peak_is_a_contradiction(
    reserved: int | None, source: str | None, refused: bool
) -> None:
    why = contradiction({**ROW, "reserved_peak_bytes": reserved, "reserved_source": source})
    assert (why is not None) == refused, why
    if refused:
        assert "reserved_peak_bytes" in str(why) and "229,888" in str(why)


def test_gate_refuses_a_results_file_with_reserved_below_peak(run_cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    row = {**ROW, "reserved_peak_bytes": 1}
    path.write_text(json.dumps({"memprobe_version": "0.1.0", "columns": list(row), "rows": [row]}))
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.memprobe.gate]\nrules = [{kernel = "*", max_peak = "1GiB"}]\n')
    line = one_line(*run_cli("gate", str(path), "--config", str(config)))
    assert "reserved_peak_bytes 1 is below its peak_bytes 229,888" in line, line
