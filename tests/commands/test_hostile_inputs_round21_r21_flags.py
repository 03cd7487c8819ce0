"""Hostile inputs, round 21 (the command line: flags, their syntaxes and combinations, the
environment that shapes the output): each row is a variant of a defect class the pass
found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_STEP, one_line, user_module
from small_config import SMALL

SWEEP = ["sweep", "--vocab", "128", "--no-ladder", "--device", "meta", "--no-verify",
         "--no-report", "--json", "--kernel", "unchunked"]  # fmt: skip
PLAN = ["plan", "--vocab", "4096", "--budget", "1GiB", "--kernel", "unchunked", "--no-reserved"]


def _snapshot(made_run: Path) -> str:
    return str(next((made_run / "snapshots").glob("*.pickle")))


# -- a COLUMNS wider than any screen: rich pads every line of the help to the width, so
# COLUMNS=100000 printed 3.5 MB of spaces, and 20 digits ended the help (`memprobe`
# alone, `plan --help`) in rich's OverflowError traceback, exit 1.

WIDE = {
    "one past the widest": "1001",
    "a hundred thousand": "100000",
    "twenty digits": "9" * 20,
    "thirty digits": "1" + "0" * 30,
    "five thousand digits": "9" * 5000,
}


@pytest.mark.parametrize("columns", WIDE.values(), ids=list(WIDE))
@pytest.mark.parametrize("args", [["sweep", "--help"], ["plan", "--help"], []], ids=str)
def test_a_columns_wider_than_any_screen_is_dropped(
    run_cli: Any, monkeypatch: pytest.MonkeyPatch, columns: str, args: list[str]
) -> None:
    from memprobe.cli import MAX_COLUMNS

    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = run_cli(*args)
    assert code == (0 if args else 2) and not err  # `memprobe` alone: its help, exit 2
    assert "Usage" in out and max(map(len, out.splitlines())) <= MAX_COLUMNS


def test_a_wide_screen_still_gets_its_width(run_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    code, out, _ = run_cli("sweep", "--help")
    assert code == 0 and max(map(len, out.splitlines())) == 300


# -- an option typed with a dash that is not "-" (an en or em dash, a minus sign: what a
# page, a chat or a word processor makes of "--" when a command is copied from it):
# click read it as an argument, and said "unexpected extra argument (g.toml)", took it
# for a path, or "Missing option '--budget'" of a command that looks as if it gave one.

DASHES = {
    "gate, an em dash": (["gate", "\u2014config", "g.toml"], "U+2014 EM DASH", "--config"),
    "attribute, an en dash": (["attribute", "{snap}", "\u2013top", "3"], "U+2013 EN DASH", "--top"),
    "plan, minus signs": (
        ["plan", "--vocab", "128", "\u2212\u2212budget", "1GiB"],
        "U+2212 MINUS SIGN",
        "--budget",
    ),
    "step, an em dash with =": (
        ["step", "--config", "config.json", "\u2014tokens=8"],
        "U+2014 EM DASH",
        "--tokens",
    ),
    "sweep, a dash then a hyphen": (
        ["sweep", "\u2013-no-ladder"],
        "U+2013 EN DASH",
        "--no-ladder",
    ),
    "report, a horizontal bar": (["report", "\u2015out", "x"], "U+2015 HORIZONTAL BAR", "--out"),
}


@pytest.mark.parametrize("what", DASHES)
def test_an_option_typed_with_a_typographic_dash_is_named(
    run_cli: Any, here: Path, made_run: Path, what: str
) -> None:
    args, dash, option = DASHES[what]
    args = [a.replace("{snap}", _snapshot(made_run)) for a in args]
    line = one_line(*run_cli(*args))
    assert f"starts with {dash} where '--' belongs" in line and f"(type {option})" in line


# ... while a value that merely holds such a dash is the command's to judge.
def test_a_value_with_a_typographic_dash_is_the_flags_own(run_cli: Any) -> None:
    line = one_line(*run_cli(*PLAN[:4], "\u22121GiB", *PLAN[5:]))
    assert "'\u22121GiB' is not a size" in line


# -- a path given as '-', many tools' name for standard input or output: memprobe reads
# and writes files by name, so `gate --junit-xml -` wrote a file named '-' in the current
# directory ("wrote -", exit 0), `--config -` read that file (or said there was no such
# file), and `attribute -` read a snapshot named '-' a `profile --out -` had left.

DASH_PATHS = {
    "gate --junit-xml": ["gate", "{run}", "--config", "g.toml", "--junit-xml", "-"],
    "gate --update-baseline": ["gate", "{run}", "--config", "g.toml", "--update-baseline", "-"],
    "gate --config": ["gate", "{run}", "--config", "-"],
    "gate --baseline": ["gate", "{run}", "--config", "g.toml", "--baseline", "-"],
    "gate RESULTS": ["gate", "-", "--config", "g.toml"],
    "report --out": ["report", "{run}", "--out", "-"],
    "report RUN": ["report", "-"],
    "attribute SNAPSHOT": ["attribute", "-"],
    "attribute --html": ["attribute", "{snap}", "--html", "-"],
    "diff B": ["diff", "{snap}", "-"],
    "profile --out": ["profile", "{step}", "--out", "-"],
    "profile --html": ["profile", "{step}", "--html", "-"],
    "step --out": ["step", "--config", "config.json", "--tokens", "8", "--out", "-"],
    "step --config": ["step", "--config", "-", "--tokens", "8"],
    "sweep --out": [*SWEEP, "--tokens", "64", "--out", "-"],
    "sweep --resume": ["sweep", "--resume", "-"],
    "plan --out": [*PLAN, "--out", "-"],
    "plan --from-run": [*PLAN, "--from-run", "-"],
    "plan --other-from, in a list": [*PLAN, "--other-from", "{snap}, -"],
}


@pytest.mark.parametrize("what", DASH_PATHS)
def test_a_dash_for_a_path_is_no_stream(
    run_cli: Any, here: Path, made_run: Path, what: str
) -> None:
    (here / "g.toml").write_text('[tool.memprobe.gate]\nrules = [{kernel="*", max_peak="1TiB"}]\n')
    (here / "config.json").write_text(json.dumps(SMALL))
    values = {"run": str(made_run), "snap": _snapshot(made_run),
              "step": user_module(here, "r21_step", TINY_STEP) + ":step"}  # fmt: skip
    args = [a.format(**values) for a in DASH_PATHS[what]]
    line = one_line(*run_cli(*args))
    assert "'-' is not standard input or output here" in line and "./- for a file" in line
    assert not (here / "-").exists()


def test_a_file_named_dash_is_still_read_as_dot_slash_dash(
    run_cli: Any, here: Path, made_run: Path
) -> None:
    shutil.copy(_snapshot(made_run), here / "-")
    code, out, _ = run_cli("attribute", "./-", "--json")
    assert code == 0 and json.loads(out)


# -- a count written with thousands separators, as memprobe prints counts ("131,072
# tokens/GPU"): in a comma list each group is a value, so `sweep --tokens 1,024` ran the
# two cases 1 and 24 without a word, `plan --batch 1,000` said "0 must be positive", and
# `plan --vocab 131,072` hinted "e.g. --vocab 131". A group that starts with 0 is no value
# anyone lists; a one-value flag's hint is the number the text spells.

GROUPED = {
    "sweep --tokens 1,024": ([*SWEEP, "--tokens", "1,024"], "--tokens 1024"),
    "sweep --vocab 131,072": (["sweep", "--tokens", "64", "--vocab", "131,072"], "--vocab 131072"),
    "sweep --batch 1,000": ([*SWEEP, "--tokens", "64", "--batch", "1,000"], "--batch 1000"),
    "sweep --chunk-size 4,096": ([*SWEEP, "--tokens", "64", "--chunk-size", "4,096"], "4096"),
    "sweep --tokens 1,000,000": ([*SWEEP, "--tokens", "1,000,000"], "--tokens 1000000"),
    "plan --vocab 131,072": (["plan", "--vocab", "131,072", "--budget", "1GiB"], "131072"),
    "plan --batch 1,000": ([*PLAN, "--batch", "1,000"], "--batch 1000"),
    "plan --vocab 151,936 (one value)": (
        ["plan", "--vocab", "151,936", "--budget", "1GiB"],
        "for the number write --vocab 151936",
    ),
    "plan --step --batch 2,048": (
        ["plan", "--step", "--config", "config.json", "--budget", "1GiB", "--batch", "2,048"],
        "--batch 2048",
    ),
}


@pytest.mark.parametrize("what", GROUPED)
def test_a_count_written_with_thousands_separators_is_not_a_list(
    run_cli: Any, here: Path, what: str
) -> None:
    (here / "config.json").write_text(json.dumps(SMALL))
    args, says = GROUPED[what]
    line = one_line(*run_cli(*args))
    assert says in line and "must be positive" not in line and "e.g. --vocab 151" not in line


@pytest.mark.parametrize("tokens", ["64,128", "1,2", "8, 32", "64,128,256"])
def test_a_list_is_still_a_list(run_cli: Any, here: Path, tokens: str) -> None:
    # (here: the run's default folder, reports/, goes under the test's own directory)
    code, out, err = run_cli(*SWEEP, "--tokens", tokens)
    assert code == 0, err
    assert [r["tokens"] for r in json.loads(out)["results"]] == [int(t) for t in tokens.split(",")]


# -- a memory size that is probably not what its writer meant (a bare number is bytes,
# "80GB" is 74.51 GiB): sweep and plan warned, while `step --budget 80`, `attribute
# --what-if K --budget 80GB` and `report --budget 5` took them in silence ("budget 80 B:
# does not fit").

SIZE_WARNINGS = {
    "step, bytes": (["step", "--config", "config.json", "--tokens", "8", "--budget", "80"], "80 B"),
    "step, GB": (["step", "--config", "config.json", "--tokens", "8", "--budget", "80GB"], "GB"),
    "attribute --what-if, GB": (
        ["attribute", "{snap}", "--what-if", "local_chunked", "--budget", "80GB"],
        "74.51 GiB",
    ),
    "attribute --what-if, bytes": (
        ["attribute", "{snap}", "--what-if", "local_chunked", "--budget", "5"],
        "5 B",
    ),
    "report, bytes": (["report", "{run}", "--budget", "5", "--out", "page.html"], "5 B"),
}


@pytest.mark.parametrize("what", SIZE_WARNINGS)
def test_an_implausible_budget_is_warned_of_everywhere(
    run_cli: Any, here: Path, made_run: Path, what: str
) -> None:
    (here / "config.json").write_text(json.dumps(SMALL))
    run = here / "run"
    shutil.copytree(made_run, run)
    args, says = SIZE_WARNINGS[what]
    values = {"run": str(run), "snap": _snapshot(run)}
    code, _, err = run_cli(*[a.format(**values) for a in args])
    assert code == 0
    (warning,) = [line for line in err.splitlines() if line.startswith("memprobe: warning:")]
    assert "--budget" in warning and says in warning


# -- plan --config without --step: a flag the whole step does not take was refused "for
# --config (a whole-step plan)" (drop --vocab), and once dropped, the plan said "--step
# and --config go together". --config alone now asks for --step first.

CONFIG_ALONE = {
    "with --vocab": ["--vocab", "4096"],
    "alone": [],
    "with --hidden": ["--hidden", "64"],
    "with --fsdp": ["--fsdp", "2"],
}


@pytest.mark.parametrize("what", CONFIG_ALONE)
def test_plan_config_without_step_asks_for_step(run_cli: Any, here: Path, what: str) -> None:
    (here / "config.json").write_text(json.dumps(SMALL))
    args = ["plan", "--config", "config.json", "--budget", "1GiB", *CONFIG_ALONE[what]]
    line = one_line(*run_cli(*args))
    assert "which --step asks for (add --step, or drop --config)" in line


# -- an --other over --budget by less than the line's two decimals show: "--other 1.00 GiB
# is more than --budget 1.00 GiB", a line that contradicts itself. Each is then in bytes.

OVER = {
    "by 107 bytes": ("1.0000001GiB", "(1,073,741,931 B)"),
    "by one byte": ("1073741825", "(1,073,741,825 B)"),
    "by a GiB": ("2GiB", None),
}


@pytest.mark.parametrize("what", OVER)
def test_an_other_just_over_the_budget_is_told_apart(run_cli: Any, what: str) -> None:
    other, says = OVER[what]
    line = one_line(*run_cli(*PLAN, "--other", other))
    assert "is more than --budget 1.00 GiB" in line
    if says is None:
        assert " B)" not in line
    else:
        assert says in line and "(1,073,741,824 B)" in line
