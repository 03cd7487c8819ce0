"""Hostile inputs, round 9 (the confirming pass): each row is a variant of a defect class
the pass found. One line and exit 2, or a sane answer; nothing written is lost."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest


def _empty_results(made_run: Path) -> dict[str, Any]:
    data = json.loads((made_run / "results.json").read_text())
    data["rows"] = []
    return data


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# -- a baseline with no cases compared nothing: "passed: all 0 check(s)", exit 0


RULE = "[[tool.memprobe.gate.rules]]\nkernel = '*'\nmax_peak = '1GiB'\n"


@pytest.mark.parametrize(
    ("shape", "rules"),
    [
        ("file", ""),
        ("file", RULE),
        ("run directory", ""),
        ("config's baseline", ""),
        ("config's baseline", RULE),
    ],
)
def test_a_baseline_with_no_cases_is_refused(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    shape: str, rules: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    if shape == "run directory":
        base = tmp_path / "base"
        shutil.copytree(made_run, base)
        (base / "results.json").write_text(json.dumps(_empty_results(made_run)))
    else:
        base = tmp_path / "b.json"
        base.write_text(json.dumps(_empty_results(made_run)))
    config = rules
    args = ["gate", str(run)]
    if shape == "config's baseline":
        config = f"[tool.memprobe.gate]\nbaseline = '{base}'\n" + rules
    else:
        args += ["--baseline", str(base)]
    if config:
        (tmp_path / "pyproject.toml").write_text(config)
    before = {p: _digest(p) for p in tmp_path.rglob("*") if p.is_file()}
    code, out, err = run_cli(*args)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, (out, err)
    assert "holds no cases: it would compare nothing" in err and "--update-baseline" in err
    assert "Traceback" not in err
    assert {p: _digest(p) for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_empty_baseline_that_is_being_rewritten_is_remade(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "b.json"
    base.write_text(json.dumps(_empty_results(made_run)))
    code, out, err = run_cli(
        "gate", str(made_run), "--baseline", str(base), "--update-baseline", str(base)
    )
    assert code == 0, (out, err)
    assert f"baseline {base} holds no cases; not compared" in out + err
    assert json.loads(base.read_text())["rows"], "the baseline was not remade"
    # And now it compares.
    code, out, err = run_cli("gate", str(made_run), "--baseline", str(base))
    assert code == 0 and "all 0 check" not in out, (out, err)


# -- a negative time or error in results.json was read as measured: the report's table
# showed "-1.0000" seconds; plan --from-run picks its chunk size by these times


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("fwd_time_s", -1.0),
        ("bwd_time_s", -1e-9),
        ("max_abs_err_fwd", -0.5),
        ("max_abs_err_bwd", -3),
    ],
)
@pytest.mark.parametrize("command", ["report", "gate", "plan --from-run"])
def test_a_negative_time_or_error_in_results_is_refused(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    column: str, value: float, command: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    data = json.loads((run / "results.json").read_text())
    data["rows"][0][column] = value
    (run / "results.json").write_text(json.dumps(data))
    args = {
        "report": ["report", str(run), "--out", str(tmp_path / "page.html")],
        "gate": ["gate", str(run), "--baseline", str(made_run / "results.json")],
        "plan --from-run": ["plan", "--vocab", "256", "--budget", "1GiB", "--from-run", str(run)],
    }[command]
    before = {p: _digest(p) for p in tmp_path.rglob("*") if p.is_file()}
    code, out, err = run_cli(*args)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, (out, err)
    assert f"row 0 {column} {value:g} is negative" in err and "Traceback" not in err
    assert {p: _digest(p) for p in tmp_path.rglob("*") if p.is_file()} == before


# An error of exactly 0 everywhere: the numerics plot's log axis drew with a matplotlib
# warning on stderr ("no positive values").
@pytest.mark.filterwarnings("error::UserWarning")
def test_a_zero_time_or_error_is_still_read(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    data = json.loads((run / "results.json").read_text())
    # On cpu: a meta run times nothing, so a meta row with times is refused.
    data["rows"][0].update(device="cpu", case_id=None, snapshot=None)
    data["rows"][0].update(fwd_time_s=0.0, bwd_time_s=-0.0, max_abs_err_fwd=0)
    (run / "results.json").write_text(json.dumps(data))
    meta = json.loads((run / "run.json").read_text())
    meta["cases"][0]["device"] = "cpu"
    (run / "run.json").write_text(json.dumps(meta))
    code, out, err = run_cli("report", str(run), "--out", str(tmp_path / "page.html"))
    assert code == 0 and "Traceback" not in err, err


# -- an MoE config with 0 (or fewer) experts: the "experts per token > experts" check read
# 0 as not given, and the step failed at aten.topk on meta with a hint blaming meta

SMALL = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
}  # fmt: skip
NO_EXPERTS = [
    ("mixtral: 0 experts",
     {"model_type": "mixtral", "num_local_experts": 0, "num_experts_per_tok": 2},
     "num_experts_per_tok is 2 with num_local_experts 0"),
    ("mixtral: -1 experts",
     {"model_type": "mixtral", "num_local_experts": -1, "num_experts_per_tok": 1},
     "num_experts_per_tok is 1 with num_local_experts -1"),
    ("qwen2_moe: 0 experts", {"model_type": "qwen2_moe", "num_experts": 0, "num_experts_per_tok": 4,
                              "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64},
     "num_experts_per_tok is 4 with num_experts 0"),
]  # fmt: skip


@pytest.mark.parametrize("command", ["step", "plan"])
@pytest.mark.parametrize(("what", "fields", "says"), NO_EXPERTS, ids=[n[0] for n in NO_EXPERTS])
def test_an_moe_config_with_no_experts_is_said_so(
    run_cli: Any, tmp_path: Path, command: str, what: str, fields: dict[str, Any], says: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, **fields}))
    size = ["--tokens", "64"] if command == "step" else ["--step", "--budget", "1GiB"]
    code, out, err = run_cli(command, "--config", str(tmp_path), *size)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert says in err and "meta" not in err, err


# A pyproject.toml that is no file was passed over: "no pyproject.toml at or above DIR",
# though one is there.
@pytest.mark.parametrize("kind", ["a FIFO", "a folder"])
def test_a_pyproject_that_is_no_file_is_named_for_what_it_is(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    import os

    odd = tmp_path / "pyproject.toml"
    if kind == "a FIFO":
        os.mkfifo(odd)
    else:
        odd.mkdir()
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("gate", str(made_run))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{odd} is a" in err and "not a regular file" in err and "no pyproject" not in err
