"""Hostile inputs, round 34 (fixes B, C, D of the round's reports): each row is a variant
of a defect class. The classes, in order: both allocator variables set (memprobe read
PYTORCH_ALLOC_CONF first where torch 2.13 reads PYTORCH_CUDA_ALLOC_CONF first, for every
setting, even when it is set to nothing); sweep progress lines that did not name the
layout; a re-rendered report that lost the sweep's --budget/--other."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memprobe.allocator import AllocConf, alloc_conf_from_env, settings_words
from memprobe.allocator.config import ENV_VARS

SMALL = ["--tokens", "64", "--vocab", "128", "--device", "meta", "--no-verify"]

# -- D: torch 2.13 (c10 AcceleratorAllocatorConfig::instance and
# CUDAAllocatorConfig::instance) takes the first of PYTORCH_CUDA_ALLOC_CONF,
# PYTORCH_ALLOC_CONF that is set, even to "", for all its settings; memprobe took
# PYTORCH_ALLOC_CONF first, so it modelled settings the job's allocator never had.
BOTH_SET = {
    "both set: the CUDA name wins": (
        {
            "PYTORCH_ALLOC_CONF": "expandable_segments:True",
            "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
        },
        AllocConf(max_split_size_mb=128),
    ),
    "CUDA name empty: defaults, the other unread": (
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": ""},
        AllocConf(),
    ),
    "new name empty, CUDA name set": (
        {"PYTORCH_ALLOC_CONF": "", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        AllocConf(expandable_segments=True),
    ),
    "new name alone": (
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
        AllocConf(expandable_segments=True),
    ),
    "CUDA-specific setting in the CUDA name": (
        {
            "PYTORCH_ALLOC_CONF": "expandable_segments:True",
            "PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.5",
        },
        AllocConf(per_process_memory_fraction=0.5),
    ),
}


@pytest.mark.parametrize("env, conf", BOTH_SET.values(), ids=BOTH_SET.keys())
def test_env_settings_are_read_as_torch_reads_them(env, conf):
    assert alloc_conf_from_env(env) == conf


def test_the_installed_torch_reads_the_cuda_name_first(monkeypatch):
    """What torch itself read, in a fresh process (it reads once, at startup)."""
    import subprocess
    import sys

    env = {**__import__("os").environ, "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    env["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:64"
    code = "import torch; print(torch._C._accelerator_getAllocatorSettings())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "max_split_size_mb:64" == env[ENV_VARS[0]]


SHADOWED = {
    "different texts: the note names the unread one": (
        {
            "PYTORCH_ALLOC_CONF": "expandable_segments:True",
            "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
        },
        "max_split_size_mb:128, from PYTORCH_CUDA_ALLOC_CONF (torch reads it before "
        "PYTORCH_ALLOC_CONF, also set, and ignores PYTORCH_ALLOC_CONF)",
    ),
    "the same text: no note": (
        {
            "PYTORCH_ALLOC_CONF": "expandable_segments:True",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        },
        "expandable_segments:True, from PYTORCH_CUDA_ALLOC_CONF",
    ),
    "empty CUDA name shadows the other": (
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": ""},
        "default settings, from PYTORCH_CUDA_ALLOC_CONF (torch reads it before "
        "PYTORCH_ALLOC_CONF, also set, and ignores PYTORCH_ALLOC_CONF)",
    ),
}


@pytest.mark.parametrize("env, words", SHADOWED.values(), ids=SHADOWED.keys())
def test_settings_words_say_which_variable_torch_ignores(monkeypatch, env, words):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from memprobe.allocator import alloc_conf_setting

    assert settings_words(alloc_conf_setting(None)) == words


@pytest.mark.parametrize("user_env", [{}, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}])
def test_a_sweeps_alloc_conf_reaches_the_variable_torch_reads(monkeypatch, user_env):
    """sweep --alloc-conf on cuda set PYTORCH_ALLOC_CONF only: a user's
    PYTORCH_CUDA_ALLOC_CONF stayed what the real allocator read."""
    from memprobe.allocator import alloc_conf_to_model, set_process_alloc_conf

    for name in ENV_VARS:  # set first, so that monkeypatch restores what the call sets
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name, value in user_env.items():
        monkeypatch.setenv(name, value)
    set_process_alloc_conf("expandable_segments:True")
    assert alloc_conf_to_model(None) == AllocConf(expandable_segments=True)


# -- C: a sweep's progress lines named kernel, tokens, vocab and dtype only, so the cases
# of --tp 1,2 --cp 1,2 (or --batch, --chunk-size, --hidden lists) read as the same case
# with different peaks. Each names the fields off their defaults.
PROGRESS = {
    "tp and cp": (
        ["--kernel", "distributed", "--tp", "1,2", "--cp", "1,2"],
        [
            "[1/4] distributed tokens=64 vocab=128 bf16: 96.81 KiB",
            "[2/4] distributed tokens=64 vocab=128 bf16 cp=2: 48.41 KiB",
            "[3/4] distributed tokens=64 vocab=128 bf16 tp=2: 48.81 KiB",
            "[4/4] distributed tokens=64 vocab=128 bf16 tp=2 cp=2: 24.41 KiB",
        ],
    ),
    "tp alone": (
        ["--kernel", "distributed", "--tp", "2"],
        ["[1/1] distributed tokens=64 vocab=128 bf16 tp=2: 48.81 KiB"],
    ),
    "batch and chunk size": (
        ["--kernel", "local_chunked", "--batch", "1,2", "--chunk-size", "32,1024"],
        [
            "[1/4] local_chunked tokens=64 vocab=128 bf16 chunk=32: 48.62 KiB",
            "[2/4] local_chunked tokens=64 vocab=128 bf16: 64.75 KiB",
            "[3/4] local_chunked tokens=64 vocab=128 bf16 batch=2 chunk=32: 97.25 KiB",
            "[4/4] local_chunked tokens=64 vocab=128 bf16 batch=2: 129.50 KiB",
        ],
    ),
    "hidden": (
        ["--kernel", "linear_unchunked", "--hidden", "64,128"],
        [
            "[1/2] linear_unchunked tokens=64 vocab=128 bf16 hidden=64: 120.25 KiB",
            "[2/2] linear_unchunked tokens=64 vocab=128 bf16 hidden=128: 144.25 KiB",
        ],
    ),
}


@pytest.mark.parametrize("flags, lines", PROGRESS.values(), ids=PROGRESS.keys())
def test_progress_lines_name_the_layout(run_cli, tmp_path, flags, lines):
    code, _, err = run_cli(
        "sweep", *SMALL, "--no-ladder", "--no-report", "--out", str(tmp_path / "r"), *flags
    )
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("[")] == lines


# -- B: run.json did not keep a sweep's --budget/--other: `memprobe report DIR` (the
# README's --no-report then report) and a resume's page said "No memory budget given",
# and the sweep's own page labelled budget - other "(--budget)".
BUDGETED = ["sweep", *SMALL, "--no-ladder", "--kernel", "unchunked,local_chunked"]
FIT_60 = "Fit the 60.00 KiB budget (budget 100.00 KiB - other 40.00 KiB): none."
BUDGET_FLAGS = ["--budget", "100KiB", "--other", "40KiB"]
PAGES = {
    "budget and other": (["--budget", "100KiB", "--other", "40KiB"], [FIT_60]),
    "budget alone": (["--budget", "100KiB"], ["Fit the 100.00 KiB budget: local_chunked."]),
    "no budget": ([], ["No memory budget given"]),
}


def _page(run: Path) -> str:
    import html
    import re

    return html.unescape(
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", (run / "report.html").read_text()))
    )


_RUNS: dict[str, Path] = {}


def _budgeted_run(run_cli, tmp_path: Path) -> Path:
    """A --no-report run swept with --budget 100KiB --other 40KiB: swept once per worker,
    copied for each test (each edits its copy)."""
    import shutil

    if "base" not in _RUNS or not _RUNS["base"].exists():
        base = tmp_path / "base"
        code, _, err = run_cli(*BUDGETED, *BUDGET_FLAGS, "--no-report", "-q", "--out", str(base))
        assert code == 0, err
        _RUNS["base"] = base
    return Path(shutil.copytree(_RUNS["base"], tmp_path / "r"))


@pytest.mark.parametrize("flags, says", PAGES.values(), ids=PAGES.keys())
def test_a_re_rendered_page_marks_the_sweeps_budget(run_cli, tmp_path, flags, says):
    run = tmp_path / "r"
    code, _, err = run_cli(*BUDGETED, "--no-report", "-q", "--out", str(run), *flags)
    assert code == 0, err
    assert run_cli("report", str(run))[0] == 0
    re_rendered = _page(run)
    assert all(s in re_rendered for s in says)
    if flags == BUDGET_FLAGS:  # the sweep's own page says the same
        code, _, err = run_cli(*BUDGETED, "-q", "--out", str(tmp_path / "own"), *flags)
        assert code == 0, err
        assert all(s in _page(tmp_path / "own") for s in says)


def test_a_resume_keeps_the_recorded_budget(run_cli, tmp_path):
    run = _budgeted_run(run_cli, tmp_path)
    file = run / "results.json"
    data = json.loads(file.read_text())
    data["rows"] = data["rows"][:1]
    file.write_text(json.dumps(data))
    code, out, err = run_cli("sweep", "--resume", str(run), "--no-verify")
    assert code == 0, err
    assert FIT_60 in out and FIT_60 in _page(run)
    assert "memory budget 60.00 KiB (budget 100.00 KiB - other 40.00 KiB)" in _page(run)
    # A different budget on resume is still refused (the run keeps what it started with).
    assert run_cli("sweep", "--resume", str(run), "--budget", "1GiB")[0] == 2


def test_report_takes_other_and_an_older_run_json_has_no_budget(run_cli, tmp_path):
    run = _budgeted_run(run_cli, tmp_path)
    meta = json.loads((run / "run.json").read_text())
    meta["budget_bytes"] = "tampered"  # a budget given again: run.json's is not read
    (run / "run.json").write_text(json.dumps(meta))
    assert run_cli("report", str(run), "--budget", "100KiB", "--other", "40KiB")[0] == 0
    assert FIT_60 in _page(run)
    code, out, err = run_cli("report", str(run), "--other", "40KiB")
    assert (code, out, err.count("\n")) == (2, "", 1) and "--other needs --budget" in err
    meta = json.loads((run / "run.json").read_text())
    for key in ("budget_bytes", "other_bytes"):
        del meta[key]  # an older run.json
    (run / "run.json").write_text(json.dumps(meta))
    assert run_cli("report", str(run))[0] == 0
    assert "No memory budget given" in _page(run)


TAMPERED = {
    "negative": -5,
    "huge": 10**30,
    "a string": "100KiB",
    "NaN": math.nan,
    "infinity": math.inf,
    "a bool": True,
    "other above budget": 1,
}


@pytest.mark.parametrize("value", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_tampered_recorded_budget_is_one_line(run_cli, tmp_path, value):
    run = _budgeted_run(run_cli, tmp_path)
    meta = json.loads((run / "run.json").read_text())
    meta["budget_bytes"] = value
    (run / "run.json").write_text(json.dumps(meta))
    code, out, err = run_cli("report", str(run))
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert "run.json records a budget no sweep writes" in err and "Traceback" not in err
