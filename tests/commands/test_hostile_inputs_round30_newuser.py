"""Hostile inputs, round 30 (a new user): the README read top to bottom and every command
in it run as written, then the planning problems a newcomer brings (tokens on an 80 GiB GPU
at a 131k vocabulary, profiling one's own step, a what-if on it, a gated kernel of one's
own with a baseline, a Hugging Face config's whole step). Each table is a defect class the
pass found where a message did not tell the newcomer what was wrong or what to do, or
where two outputs read the same file differently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

# -- N2: `memprobe step --config meta-llama/Llama-3.2-1B` (a Hub model id, what a
# newcomer types) said "--config meta-llama/Llama-3.2-1B does not exist (check the path)":
# the user checks a path they never meant. memprobe downloads nothing; the line now says
# the text reads as a Hub id and where that model's config.json comes from. A mistyped
# path (its folder exists, or it names a .json) keeps "check the path".

HUB_IDS = {
    "llama": ("step", "meta-llama/Llama-3.2-1B"),
    "qwen, dotted": ("step", "Qwen/Qwen2.5-7B"),
    "plan --step": ("plan", "mistralai/Mistral-7B-v0.1"),
}


@pytest.mark.parametrize("command,model", list(HUB_IDS.values()), ids=list(HUB_IDS))
def test_a_hub_model_id_says_memprobe_downloads_nothing(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, model: str
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--tokens", "64"] if command == "step" else ["--step", "--budget", "1GiB"]
    err = one_line(*run_cli(command, "--config", model, *args))
    assert "Hub model id" in err and "downloads nothing" in err, err
    assert f"https://huggingface.co/{model}/blob/main/config.json" in err, err


MISTYPED_PATHS = {
    "folder exists": lambda here: (here / "tiny").mkdir() or "tiny/nosuch",
    "a json file": lambda here: "models/config.json",
    "one name": lambda here: "nosuchdir",
}


@pytest.mark.parametrize("make", list(MISTYPED_PATHS.values()), ids=list(MISTYPED_PATHS))
def test_a_mistyped_path_still_says_check_the_path(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    err = one_line(*run_cli("step", "--config", make(tmp_path), "--tokens", "64"))
    assert "does not exist" in err and "Hub" not in err, err


def test_a_real_config_under_an_owner_like_folder_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from small_config import SMALL

    from memprobe.profile.hf_config import read_config_json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    (tmp_path / "org" / "model" / "config.json").write_text(json.dumps(SMALL))
    (tmp_path / "org" / "model.json").write_text(json.dumps(SMALL))
    assert read_config_json(Path("org/model/config.json")) == SMALL
    assert read_config_json(Path("org/model.json")) == SMALL
