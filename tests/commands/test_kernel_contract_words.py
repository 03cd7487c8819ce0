"""A user's kernel whose result breaks the contract (not one floating log-prob per
target, or a result memprobe never saw allocated) is told in memprobe's own sentence: the
exception class memprobe raises it with (``BadResult``) is an internal name and once led
every such case note and plan line ("BadResult: the kernel returned ...")."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hostile import one_line, user_module

# Each kernel body and the words its failure must carry.
BROKEN = {
    "one value, not one per target": (
        "def k(logits, targets, chunk_size=None):\n    return logits.float().sum(-1)[..., :1]\n",
        "the kernel returned a float32 tensor of shape [1, 1]",
    ),
    "not a tensor": (
        "def k(logits, targets, chunk_size=None):\n    return [1.0]\n",
        "the kernel returned list, not a tensor",
    ),
}


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("broken", BROKEN)
def test_a_sweep_rows_note_is_the_sentence_alone(here: Path, run_cli, broken: str) -> None:
    body, words = BROKEN[broken]
    name = user_module(here, "contract", body)
    flags = ["--tokens", "64", "--vocab", "128", "--no-ladder", "--no-report", "-q"]
    code, _, err = run_cli("sweep", "--kernel", f"{name}:k", *flags, "--out", "run")
    assert code == 0, err
    with open(here / "run" / "results.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["status"] == "error"
    assert row["note"].startswith(words), row["note"]
    assert "BadResult" not in row["note"]


@pytest.mark.parametrize("broken", BROKEN)
def test_a_plans_line_is_the_sentence_alone(here: Path, run_cli, broken: str) -> None:
    body, words = BROKEN[broken]
    name = user_module(here, "contract", body)
    line = one_line(*run_cli("plan", "--kernel", f"{name}:k", "--vocab", "128", "--budget", "1GiB"))
    assert f"({words}" in line and "BadResult" not in line, line
