"""plan, step, plan --step and profile on meta model the allocator settings torch reads
from the environment when no --alloc-conf is given, as sweep does
(tests/sweep/test_alloc_conf_env.py): they modelled torch's defaults and said "with
default settings" (profile printed expandable_segments=False) under a variable that set
others. The output names the settings and the variable they came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module

ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
TEXT = "expandable_segments:True"
PLAN = ("plan", "--vocab", "32000", "--budget", "256MiB", "--kernel", "local_chunked")
SMALL = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 4096,
}  # fmt: skip
STEP = "import torch\ndef step(device):\n    w = torch.zeros(1024, 1024, device=device)\n"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _plan(run_cli: Any, *flags: str) -> tuple[int, str]:
    code, out, err = run_cli(*PLAN, "--json", *flags)
    assert code == 0, err
    (row,) = json.loads(out)
    code, out, err = run_cli(*PLAN, *flags)
    assert code == 0, err
    status = next(line for line in out.splitlines() if line.startswith("reserved:"))
    return row["reserved_max_tokens"], status


def _step(run_cli: Any, here: Path, *flags: str) -> str:
    (here / "config.json").write_text(json.dumps(SMALL))
    code, out, err = run_cli("step", "--config", str(here), "--tokens", "256", *flags)
    assert code == 0, err
    return next(line for line in out.splitlines() if line.startswith("peak allocated"))


@pytest.mark.parametrize("name", ENV)
def test_plan_models_the_environments_settings(
    run_cli: Any, clean_env: pytest.MonkeyPatch, name: str
) -> None:
    flagged, flag_status = _plan(run_cli, "--alloc-conf", TEXT)
    default, default_status = _plan(run_cli)
    assert "with default settings" in default_status and flagged != default
    clean_env.setenv(name, TEXT)
    from_env, status = _plan(run_cli)
    assert from_env == flagged
    assert f"with {TEXT}, from {name} (" in status, status
    # The flag wins over the environment, as in sweep.
    assert _plan(run_cli, "--alloc-conf", "")[0] == default


@pytest.mark.parametrize("name", ENV)
def test_step_models_the_environments_settings(
    run_cli: Any, tmp_path: Path, clean_env: pytest.MonkeyPatch, name: str
) -> None:
    flagged = _step(run_cli, tmp_path, "--alloc-conf", TEXT)
    assert f"(allocator model with {TEXT})" in flagged
    assert "(allocator model)" in _step(run_cli, tmp_path)
    clean_env.setenv(name, TEXT)
    from_env = _step(run_cli, tmp_path)
    assert from_env == flagged.replace(f"with {TEXT})", f"with {TEXT}, from {name})")


def test_profile_on_meta_models_the_environments_settings(
    run_cli: Any, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.chdir(tmp_path)
    clean_env.syspath_prepend(str(tmp_path))
    name = user_module(tmp_path, "env_step", STEP)
    code, out, err = run_cli("profile", f"{name}:step")
    assert code == 0 and "expandable_segments=False" in out, err
    clean_env.setenv("PYTORCH_ALLOC_CONF", TEXT)
    code, out, err = run_cli("profile", f"{name}:step")
    assert code == 0 and "expandable_segments=True" in out, err


def test_settings_not_modelled_are_read_only_where_reserved_is_planned(
    run_cli: Any, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
    line = one_line(*run_cli(*PLAN))
    assert "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync in the environment" in line
    code, _, err = run_cli(*PLAN, "--no-reserved")
    assert code == 0, err
