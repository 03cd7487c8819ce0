"""Hostile inputs, round 11 (the confirming pass over round 10's guards): variants of its
classes through other fields and paths. One line and exit 2, or a sane answer."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest


def _snapshot(made_run: Path) -> Path:
    return next((made_run / "snapshots").glob("*.pickle"))


def _one_line(code: int, out: str, err: str) -> str:
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, (code, out, err)
    assert "Traceback" not in err
    return err


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
    err = _one_line(*run_cli(*args))
    assert f"[{0 if first else 3}] has no 'action'" in err, err
