"""Hostile inputs, round 11 (the confirming pass over round 10's guards): variants of its
classes through other fields and paths. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line


def _snapshot(made_run: Path) -> Path:
    return next((made_run / "snapshots").glob("*.pickle"))


# -- a trace action that is not a string but unhashable (a list, a dict): the fast path's
# set lookup raised TypeError, a traceback from attribute, diff and plan --other-from


@pytest.mark.parametrize("action", [["alloc"], {"alloc": 1}, [[]]], ids=["list", "dict", "nested"])
@pytest.mark.parametrize("first", [True, False], ids=["every entry", "one entry"])
@pytest.mark.parametrize("command", ["attribute", "attribute --replay", "diff", "plan"])
def test_an_unhashable_trace_action_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, action: Any, first: bool, command: str
) -> None:
    data = pickle.loads(_snapshot(made_run).read_bytes())
    trace = data["device_traces"][0]
    for entry in trace if first else trace[3:4]:
        entry["action"] = action
    bad = tmp_path / "s.pickle"
    bad.write_bytes(pickle.dumps(data, protocol=4))
    args = {
        "attribute": ["attribute", str(bad)],
        "attribute --replay": ["attribute", str(bad), "--replay"],
        "diff": ["diff", str(_snapshot(made_run)), str(bad)],
        "plan": ["plan", "--vocab", "128", "--budget", "1GiB", "--other-from", str(bad)],
    }[command]
    err = one_line(*run_cli(*args))
    assert f"[{0 if first else 3}] has no 'action'" in err, err


# -- a snapshot whose recorded case is not a string (a number, a list): read as "names no
# case" (torch's own), so the page drew it as the row's case and a failing gate named its
# largest block, where any other recorded case is refused


NOT_STRINGS = [123, 1.5, b"unchunked", ["unchunked"], {"case": "x"}]


def _recorded(made_run: Path, tmp_path: Path, case: Any) -> Path:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    snap = _snapshot(run)
    data = pickle.loads(snap.read_bytes())
    data["memprobe"]["case"] = case
    snap.write_bytes(pickle.dumps(data, protocol=4))
    return run


@pytest.mark.parametrize("case", NOT_STRINGS, ids=lambda c: type(c).__name__)
def test_a_recorded_case_that_is_not_a_string_is_not_drawn(
    run_cli: Any, made_run: Path, tmp_path: Path, case: Any
) -> None:
    run = _recorded(made_run, tmp_path, case)
    page = tmp_path / "page.html"
    code, _, err = run_cli("report", str(run), "--out", str(page))
    assert code == 0, err
    html = page.read_text()
    assert "snapshot not used" in html and f"(a {type(case).__name__}, not a case id)" in html


@pytest.mark.parametrize("case", NOT_STRINGS, ids=lambda c: type(c).__name__)
def test_a_failing_gate_does_not_explain_with_a_case_that_is_not_a_string(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    run = _recorded(made_run, tmp_path, case)
    base = json.loads((run / "results.json").read_text())
    # A baseline of 1 byte throughout (one that agrees with itself: no phase above it).
    base["rows"][0].update(peak_bytes=1, forward_peak_bytes=1, backward_peak_bytes=1)
    base["rows"][0].update(floor_bytes=1)
    (tmp_path / "b.json").write_text(json.dumps(base))
    code, out, err = run_cli("gate", str(run), "--baseline", str(tmp_path / "b.json"))
    assert code == 1, (out, err)
    assert "was recorded for case (a " in out and "largest block" not in out, out


def test_a_recorded_case_of_none_still_names_none(made_run: Path) -> None:
    from memprobe.snapshot.synthesize import recorded_case

    data = pickle.loads(_snapshot(made_run).read_bytes())
    data["memprobe"]["case"] = None
    assert recorded_case(data) is None


# -- a sweep whose run.json cannot be written (a full disk): the empty claim file stayed,
# and the folder was refused by `--out` as not empty and by `--resume` as no run


@pytest.mark.parametrize("made", [True, False], ids=["an empty folder given", "a new folder"])
def test_a_sweep_that_cannot_write_its_run_json_leaves_no_claim(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: bool
) -> None:
    from memprobe import results
    from memprobe.errors import UserError

    def full(path: Any, data: Any, **_: Any) -> Path:
        raise UserError(f"cannot write {path}: No space left on device", "choose another path")

    run = tmp_path / "run"
    if made:
        run.mkdir()
    args = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel",
            "unchunked", "--device", "meta", "--out", str(run), "-q", "--no-verify",
            "--no-report"]  # fmt: skip
    with monkeypatch.context() as patch:
        patch.setattr(results, "write_atomic", full)
        err = one_line(*run_cli(*args))
    assert "No space left on device" in err
    assert not (run / "run.json").exists()
    code, out, err = run_cli(*args)
    assert code == 0 and (run / "run.json").is_file(), err
