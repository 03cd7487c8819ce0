"""Hostile inputs, round 35 (files): run directories, snapshots, configs and output paths
given numbers that contradict each other. Each table is a variant of a defect class the
pass found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_STEP, one_line, user_module

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
