"""Hostile inputs, round 24 (the command line and the environment: flag values, output
paths, the variables the gate writes through): each row is a variant of a defect class the
pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
         "--device", "meta", "--no-verify", "--no-report", "-q"]  # fmt: skip


def _snapshot(made_run: Path) -> str:
    return str(next((made_run / "snapshots").glob("*.pickle")))


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
