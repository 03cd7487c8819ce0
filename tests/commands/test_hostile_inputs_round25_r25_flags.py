"""Hostile inputs, round 25 (the command line and the environment: flag values at and past
their bounds, every command's refusals of them): each row is a variant of a defect class
the pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

from memprobe.io.text import WORD_LIMIT, long_words_clipped

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
         "--device", "meta", "--no-verify", "--no-report", "-q"]  # fmt: skip
PLAN = ["plan", "--vocab", "128", "--budget", "1MiB", "--kernel", "unchunked", "--no-reserved"]
HUGE = "9" * 5000

# -- a flag's value of kilobytes (a list a script generated, a file pasted with $(...)):
# the refusal echoed it whole, as a file's values were before they were quoted short, so
# the one line was 5 KB (10 KB for --tokens, which names the list and its item). Sizes
# were already cut short; every other value, an extra argument, an unknown option's name
# and a path the file system refused were not. A word past WORD_LIMIT is now shown by
# its two ends and its length.

LONG_VALUES = {
    "a --tokens list": ["sweep", "--tokens", HUGE, "--vocab", "128", "--device", "meta"],
    "a --chunk-size list": [*SWEEP, "--chunk-size", f"64,{HUGE}"],
    "a --kernel name": [*SWEEP[:-8], "--kernel", "x" * 5000, "--device", "meta"],
    "a --dtype": [*SWEEP, "--dtype", "b" * 5000],
    "a --device": [*SWEEP[:-5], "--device", "m" * 5000],
    "plan's --vocab": ["plan", "--vocab", HUGE, "--budget", "1MiB"],
    "--alloc-conf": [*PLAN[:-1], "--alloc-conf", f"max_split_size_mb:{HUGE}"],
    "--other-from with an empty item": [*PLAN, "--other-from", f"{'s' * 5000},"],
    "an unknown option": [*PLAN, f"--no-such-{HUGE}"],
    "an extra argument": ["kernels", HUGE],
    "a path past the file system's limit": [*SWEEP, "--out", f"{'d' * 300}/{'e' * 300}"],
}


@pytest.mark.parametrize("args", LONG_VALUES.values(), ids=list(LONG_VALUES))
def test_a_long_value_is_echoed_by_its_two_ends(run_cli: Any, here: Path, args: list[str]) -> None:
    err = one_line(*run_cli(*args))
    assert len(err) < 4 * WORD_LIMIT and " characters)" in err and "…" in err, err
    assert not list(here.iterdir())


def test_a_long_max_regression_is_echoed_by_its_two_ends(run_cli: Any, made_run: Path) -> None:
    err = one_line(*run_cli("gate", str(made_run), "--max-regression", HUGE))
    assert len(err) < 4 * WORD_LIMIT and "(5,002 characters) is not a percentage" in err, err


def test_a_word_is_clipped_only_past_the_limit() -> None:
    assert long_words_clipped("a b " + "x" * WORD_LIMIT) == "a b " + "x" * WORD_LIMIT
    path = "/runs/" + "d" * WORD_LIMIT + "/results.json"
    clipped = long_words_clipped(f"cannot read {path}: no such file")
    assert clipped.startswith("cannot read /runs/ddd") and clipped.endswith(
        f"/results.json: ({len(path) + 1:,} characters) no such file"
    )


# -- --case-timeout past a float (1e400) or below one (1e-400): typer read it as a float
# first, so the refusal echoed what it became, "--case-timeout inf" or "0.0", not what was
# typed (as --max-regression did before round 24); a word that is no number was typer's
# "is not a valid float". Each is now refused as typed, before --shard is looked at.

TIMEOUTS = ["1e400", "-1e400", "1e-400", "1e999", "0x10", "ten", "", " ", "600s", "1_000_001"]


@pytest.mark.parametrize("shard", [["--shard"], []], ids=["with --shard", "without"])
@pytest.mark.parametrize("value", TIMEOUTS)
def test_a_case_timeout_is_refused_as_typed(
    run_cli: Any, here: Path, value: str, shard: list[str]
) -> None:
    err = one_line(*run_cli(*SWEEP, *shard, "--case-timeout", value, "--out", "o"))
    assert f"--case-timeout {value!r} is not a number of seconds from 0.001" in err, err
    assert not (here / "o").exists()


@pytest.mark.parametrize("value", ["1_0", " 600 ", "6e2", "0.001"])
def test_a_case_timeout_python_reads_reaches_the_shard_check(run_cli: Any, value: str) -> None:
    err = one_line(*run_cli(*SWEEP, "--shard", "--case-timeout", value, "--out", "o"))
    assert "--shard shares the cases out across torchrun ranks" in err
