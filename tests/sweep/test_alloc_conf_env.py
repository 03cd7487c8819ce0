"""``memprobe sweep`` without ``--alloc-conf`` runs under the allocator settings torch
reads from the environment (PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF, as torch 2.13):
on cuda its own allocator has them, so run.json records them and the model applies them
on meta (it recorded the defaults and modelled them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

SWEEP = ("sweep", "--tokens", "2048", "--vocab", "4096", "--no-ladder", "--kernel", "unchunked")
SWEEP += ("-q", "--no-verify", "--no-report")
ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def _swept(run_cli: Any, out: Path, *flags: str) -> tuple[str, int]:
    code, _, err = run_cli(*SWEEP, "--out", str(out), *flags)
    assert code == 0, err
    conf = json.loads((out / "run.json").read_text())["alloc_conf"]
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    return conf, row["reserved_peak_bytes"]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("name", ENV)
@pytest.mark.parametrize("text", ["expandable_segments:True", "max_split_size_mb:20"])
def test_the_environments_settings_are_the_runs(
    run_cli: Any, tmp_path: Path, clean_env: pytest.MonkeyPatch, name: str, text: str
) -> None:
    flagged = _swept(run_cli, tmp_path / "flag", "--alloc-conf", text)
    clean_env.setenv(name, text)
    assert (
        _swept(
            run_cli,
            tmp_path / "env",
        )
        == flagged
    )
    assert flagged[0] == text
    clean_env.delenv(name)
    assert _swept(run_cli, tmp_path / "none")[0] == ""


def test_the_flag_wins_and_the_first_variable_does(
    run_cli: Any, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    clean_env.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:20")
    assert _swept(run_cli, tmp_path / "a")[0] == "max_split_size_mb:20"  # torch 2.13's order
    flagged = _swept(run_cli, tmp_path / "b", "--alloc-conf", "max_split_size_mb:40")
    assert flagged[0] == "max_split_size_mb:40"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nonsense:1", "PYTORCH_ALLOC_CONF in the environment: allocator settings 'nonsense:1'"),
        ("backend:cudaMallocAsync", "unset PYTORCH_ALLOC_CONF, or give --alloc-conf"),
        ("expandable_segments:maybe", "PYTORCH_ALLOC_CONF in the environment"),
    ],
)
def test_settings_the_model_cannot_take_are_one_line(
    run_cli: Any, tmp_path: Path, clean_env: pytest.MonkeyPatch, text: str, says: str
) -> None:
    clean_env.setenv("PYTORCH_ALLOC_CONF", text)
    assert says in one_line(*run_cli(*SWEEP, "--out", str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_a_resumed_run_keeps_its_own_settings(
    run_cli: Any, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    _swept(run_cli, run)
    clean_env.setenv("PYTORCH_ALLOC_CONF", "nonsense:1")  # not read on resume
    code, _, err = run_cli("sweep", "--resume", str(run), "-q", "--no-verify", "--no-report")
    assert code == 0, err
    assert json.loads((run / "run.json").read_text())["alloc_conf"] == ""
