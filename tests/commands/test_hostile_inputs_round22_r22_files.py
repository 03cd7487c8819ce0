"""Hostile inputs, round 22 (r22_files), files a user hands memprobe: JSON that gives one
key twice (a model's config.json, a run's results.json or run.json), and a resumed or
re-rendered run whose page or plots are not memprobe's to replace. Each table is a
variant of a defect class the pass found: one line and exit 2 that names what is wrong,
before any work is done, and nothing of the user's lost."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line
from small_config import SMALL


def _copy(made_run: Path, to: Path) -> Path:
    shutil.copytree(made_run, to)
    return to


def _drop_last_row(run: Path) -> None:
    """One planned case left to run: what a resume writes."""
    payload = json.loads((run / "results.json").read_text())
    payload["rows"] = payload["rows"][:-1]
    (run / "results.json").write_text(json.dumps(payload))


def _twice(text: str, key: str, value: Any) -> str:
    """``text``'s first ``"key": ...`` followed by the same key again with ``value``:
    what an appended line or two merged files make."""
    at = text.index(f'"{key}":')
    return f'{text[:at]}"{key}": {json.dumps(value)}, {text[at:]}'


# -- JSON that gives one key twice: json keeps the last without a word, so a config.json
# with "hidden_size": 64 and then "hidden_size": 4096 built a 141.58M-parameter model (the
# 64 passed over), and a results row's second peak_bytes was read as its peak (caught only
# where another column happened to contradict it).

CONFIG_TWICE = {
    "a size at the top level": ("hidden_size", 4096, None),
    "a count at the top level": ("num_hidden_layers", 1, None),
    "the model type": ("model_type", "mistral", None),
    "a key nested in rope_scaling": ("factor", 8.0, {"rope_type": "linear", "factor": 2.0}),
}


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(CONFIG_TWICE))
def test_a_config_json_giving_a_key_twice_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    key, value, rope = CONFIG_TWICE[what]
    config = {**SMALL, **({"rope_scaling": rope} if rope else {})}
    (tmp_path / "config.json").write_text(_twice(json.dumps(config), key, value))
    args = {
        "step": ["step", "--config", str(tmp_path), "--tokens", "16"],
        "plan --step": ["plan", "--step", "--config", str(tmp_path), "--budget", "1GiB"],
    }[command]
    err = one_line(*run_cli(*args))
    assert f"gives the key '{key}' twice" in err and "config.json" in err, err


def test_a_config_json_with_each_key_once_is_built(run_cli: Any, tmp_path: Path) -> None:
    # The same key in two different objects is no duplicate.
    config = {**SMALL, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "factor": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = run_cli("step", "--config", str(tmp_path), "--tokens", "16")
    assert code == 0 and "llama" in out, err


RUN_TWICE = {
    "results.json: a row's peak": ("results.json", "peak_bytes", 5),
    "results.json: a row's status": ("results.json", "status", "oom"),
    "results.json: its rows": ("results.json", "rows", []),
    "run.json: its device": ("run.json", "device", "cuda"),
    "run.json: its cases": ("run.json", "cases", []),
}


@pytest.mark.parametrize("command", ["report", "gate", "resume"])
@pytest.mark.parametrize("what", sorted(RUN_TWICE))
def test_a_run_file_giving_a_key_twice_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str, command: str
) -> None:
    name, key, value = RUN_TWICE[what]
    # (A resume reads the run's files whether or not a case is left to run.)
    run = _copy(made_run, tmp_path / "run")
    path = run / name
    path.write_text(_twice(path.read_text(), key, value))
    before = path.read_bytes()
    (tmp_path / "g.toml").write_text(
        '[tool.memprobe.gate]\nrules=[{kernel="*", max_peak="1TiB"}]\n'
    )
    args = {
        "report": ["report", str(run)],
        "gate": ["gate", str(run), "--config", str(tmp_path / "g.toml")],
        "resume": ["sweep", "--resume", str(run), "-q", "--no-verify"],
    }[command]
    code, out, err = run_cli(*args)
    if command == "gate" and name == "run.json":
        # gate reads a run's results alone: its run.json is not read.
        assert code == 0, err
        return
    err = one_line(code, out, err)
    assert f"gives the key '{key}' twice" in err and name in err, err
    assert path.read_bytes() == before


def test_a_baseline_giving_a_key_twice_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    base = tmp_path / "base.json"
    base.write_text(_twice((made_run / "results.json").read_text(), "peak_bytes", 1))
    (tmp_path / "g.toml").write_text('[tool.memprobe.gate]\nbaseline = "base.json"\n')
    err = one_line(*run_cli("gate", str(made_run), "--config", str(tmp_path / "g.toml")))
    assert "gives the key 'peak_bytes' twice" in err and "base.json" in err, err
