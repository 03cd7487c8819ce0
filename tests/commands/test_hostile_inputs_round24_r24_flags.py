"""Hostile inputs, round 24 (the command line and the environment: flag values, output
paths, the variables the gate writes through): each row is a variant of a defect class the
pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module

from memprobe.gate import Verdict
from memprobe.io.text import lookalikes_shown
from memprobe.render.markdown import append_step_summary

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
         "--device", "meta", "--no-verify", "--no-report", "-q"]  # fmt: skip


def _snapshot(made_run: Path) -> str:
    return str(next((made_run / "snapshots").glob("*.pickle")))


# -- GITHUB_STEP_SUMMARY naming the file the gate prints into (`/dev/stdout` or
# `/proc/self/fd/1` with the output redirected to a log, as a local try of a CI script may
# set it): the Markdown was appended at the file's end while the gate's lines still waited
# in their buffer, which then wrote over it; no word, exit 0. It is now a warning.

GATE_TOML = '[tool.memprobe.gate]\nrules = [{kernel="*", max_peak="1TiB"}]\n'
STREAMS = {"standard output": 1, "standard error": 2}


@pytest.mark.parametrize("spelled", ["/proc/self/fd/{fd}", "/dev/fd/{fd}", "{file}"])
@pytest.mark.parametrize("stream", list(STREAMS))
def test_a_step_summary_that_is_the_commands_own_output_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: str, spelled: str
) -> None:
    fd = STREAMS[stream]
    log = tmp_path / "log.txt"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", spelled.format(fd=fd, file=log))
    kept = os.dup(fd)
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(target, fd)  # the stream redirected to the log, as `> log.txt` does
    try:
        warning = append_step_summary(Verdict(checks=(), results="run", cases=0))
    finally:
        os.dup2(kept, fd)
        os.close(kept)
        os.close(target)
    assert warning is not None and f"it is this command's {stream}" in warning, warning
    assert log.read_text() == ""


def test_a_step_summary_of_its_own_is_still_appended_beside_a_redirected_output(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "g.toml").write_text(GATE_TOML)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = run_cli("gate", str(made_run), "--config", str(tmp_path / "g.toml"))
    assert code == 0 and "passed" in out and not err, (out, err)
    assert "memprobe gate" in summary.read_text()


# -- a negative memory budget was told "give a size of zero or more", and the zero it then
# gave was refused ("must be more than 0 bytes"): every command that takes a budget.

BUDGETS = {
    "plan": ["plan", "--vocab", "4096", "--kernel", "unchunked", "--no-reserved"],
    "sweep": [*SWEEP, "--out", "{tmp}/run"],
    "report": ["report", "{run}", "--out", "{tmp}/page.html"],
    "attribute --what-if": ["attribute", "{snap}", "--what-if", "local_chunked"],
}


@pytest.mark.parametrize("value", ["-1GiB", "-0.5", "-80 GB", "-1"])
@pytest.mark.parametrize("args", BUDGETS.values(), ids=list(BUDGETS))
def test_a_negative_budget_asks_for_more_than_zero(
    run_cli: Any, made_run: Path, tmp_path: Path, args: list[str], value: str
) -> None:
    given = [a.format(tmp=tmp_path, run=made_run, snap=_snapshot(made_run)) for a in args]
    err = one_line(*run_cli(*given, f"--budget={value}"))
    assert "is negative" in err and "more than 0 bytes" in err and "zero or more" not in err


# ... while a negative --other, which may be zero, still says so.


def test_a_negative_other_still_takes_zero(run_cli: Any) -> None:
    err = one_line(*run_cli(*BUDGETS["plan"], "--budget", "1GiB", "--other=-1GiB"))
    assert "is negative" in err and "zero or more" in err


# -- `sweep --out` a folder that is not empty but holds no run (notes, a snapshots folder,
# /proc/self): the refusal ended "or continue it with --resume DIR", and that resume
# failed in turn ("is not a memprobe run (no readable run.json)"). --resume is offered
# only where there is a run to continue.

NOT_A_RUN = {
    "a folder of notes": lambda d: (d / "notes.txt").write_text("mine\n"),
    "a run's snapshots folder": lambda d: (d / "x.pickle").write_bytes(b"\x80\x04N."),
    "a folder holding an empty folder": lambda d: (d / "sub").mkdir(),
    "a folder holding results alone": lambda d: (d / "results.json").write_text("{}"),
}


@pytest.mark.parametrize("fill", NOT_A_RUN.values(), ids=list(NOT_A_RUN))
def test_a_full_folder_that_is_no_run_is_not_offered_to_resume(
    run_cli: Any, tmp_path: Path, fill: Any
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    fill(folder)
    before = sorted(p.name for p in folder.iterdir())
    err = one_line(*run_cli(*SWEEP, "--out", str(folder)))
    assert "already exists and is not empty" in err and "--resume" not in err, err
    assert sorted(p.name for p in folder.iterdir()) == before


# ... while a run's own folder is still offered to resume, as the resume then works.


def test_a_run_folder_is_still_offered_to_resume(run_cli: Any, made_run: Path) -> None:
    err = one_line(*run_cli(*SWEEP, "--out", str(made_run)))
    assert f"continue it with --resume {made_run}" in err


# -- a Cyrillic or Greek letter inside a Latin word (pasted from a page, or typed on another
# keyboard layout) looks like the letter it stands in for, so the one line contradicted
# itself: "unknown kernel 'unсhunked' (did you mean 'unchunked'?)", "expandable_segments
# takes True or False, not 'Truе'". The letter is now shown as its escape.

LOOKALIKES = {
    "a Cyrillic c in a kernel": (["sweep", "--kernel", "un\u0441hunked", "--device", "meta"],
                                 "'un\\u0441hunked'"),
    "a Greek o in a kernel": (["plan", "--vocab", "4096", "--budget", "1GiB", "--kernel",
                               "l\u03bfcal_chunked"], "'l\\u03bfcal_chunked'"),
    "a Cyrillic i in a unit": (["plan", "--vocab", "4096", "--budget", "1G\u0456B"],
                               "'1G\\u0456B'"),
    "a Cyrillic e in an option": (["sweep", "--tok\u0435ns", "64"], "--tok\\u0435ns"),
    "a Cyrillic e in a setting": (["plan", "--vocab", "4096", "--budget", "1GiB", "--kernel",
                                   "unchunked", "--alloc-conf", "expandable_segments:Tru\u0435"],
                                  "not 'Tru\\u0435'"),
}  # fmt: skip


@pytest.mark.parametrize(("args", "shown"), LOOKALIKES.values(), ids=list(LOOKALIKES))
def test_a_lookalike_letter_is_shown_as_its_escape(
    run_cli: Any, args: list[str], shown: str
) -> None:
    err = one_line(*run_cli(*args))
    assert shown in err, err


# ... while a word all in one script, and Latin letters with accents, are their own.

OWN_WORDS = {
    "a Cyrillic folder": "/tmp/\u0438\u0432\u0430\u043d/s.pickle",
    "accented Latin": "r\u00e9sum\u00e9",
    "a Greek word": "\u03bb\u03cc\u03b3\u03bf\u03c2",
    "a micro sign": "12 \u00b5s",
    "ASCII": "unchunked",
}


@pytest.mark.parametrize("text", OWN_WORDS.values(), ids=list(OWN_WORDS))
def test_a_word_in_one_script_is_shown_as_written(text: str) -> None:
    assert lookalikes_shown(text) == text


def test_a_missing_file_in_a_cyrillic_folder_is_named_as_written(
    run_cli: Any, tmp_path: Path
) -> None:
    missing = tmp_path / "\u0438\u0432\u0430\u043d" / "s.pickle"
    err = one_line(*run_cli("attribute", str(missing)))
    assert str(missing) in err


def test_a_user_step_named_with_a_lookalike_is_shown(run_cli: Any, here: Path) -> None:
    name = user_module(here, "r24_step", "def step(device):\n    pass\n")
    err = one_line(*run_cli("profile", f"{name}:st\u0435p", "--device", "meta"))
    assert "st\\u0435p" in err, err
