"""Hostile inputs, round 30 (the command line and the environment of every command: sizes
with and without units, lists, contradictory flag combinations, `--json` and `--out`, the
allocator, locale, terminal and temporary-directory variables, and closed or full
streams): each row is a variant of a defect class the pass found. One line and exit 2, or
a sane answer whose every number and claim holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from small_config import SMALL

PLAN = ["plan", "--vocab", "1024", "--no-reserved"]


# -- a plan where nothing fits (`plan --vocab 1024 --budget 4KiB --kernel local_chunked`):
# the line fitted at large counts (4.01 KiB per token, fixed 4.00 MiB: the chunk's whole
# float32 workspace) was marked `exact` and --json said "line_exact": true, because it too
# "predicted" no tokens, though one token's whole peak is 8 KiB, 4 MiB off the line; no
# `line:` note said so. Where nothing fits the line is now judged at one token.
NOTHING_FITS = {
    "local_chunked, 4 KiB": (["--kernel", "local_chunked", "--budget", "4KiB"], False),
    "local_chunked chunk 64, 4 KiB": (
        ["--kernel", "local_chunked", "--chunk-size", "64", "--budget", "4KiB"],
        False,
    ),
    "local_tiled, 2 KiB": (["--kernel", "local_tiled", "--budget", "2KiB"], False),
    "unchunked, 4 KiB (a true line)": (["--kernel", "unchunked", "--budget", "4KiB"], True),
    "unchunked fp32, 1 KiB": (
        ["--kernel", "unchunked", "--dtype", "fp32", "--budget", "1KiB"],
        True,
    ),
}


@pytest.mark.parametrize(("args", "exact"), NOTHING_FITS.values(), ids=list(NOTHING_FITS))
def test_where_nothing_fits_the_line_is_judged_at_one_token(
    run_cli: Any, args: list[str], exact: bool
) -> None:
    code, out, _ = run_cli(*PLAN, *args, "--json")
    assert code == 0, out
    (row,) = json.loads(out)
    assert row["max_tokens"] == 0
    one_token = row["peak_bytes_above_max"]
    line_at_one = row["slope_bytes_per_token"] + row["fixed_bytes"]
    # The claim matches the arithmetic: exact only within one token's bytes at one token.
    assert row["line_exact"] is exact
    assert (abs(one_token - line_at_one) < row["slope_bytes_per_token"]) is exact
    assert row["line_error_bytes"] == pytest.approx(one_token - line_at_one)
    code, out, _ = run_cli(*PLAN, *args)
    assert code == 0
    table_row = next(line for line in out.splitlines() if line.startswith(row["kernel"]))
    assert table_row.split()[-1] == ("exact" if exact else "off"), out
    note = [line for line in out.splitlines() if line.startswith("line:")]
    if exact:
        assert not note, out
    else:
        assert len(note) == 1 and "at one token, where nothing fits" in note[0], out


def test_a_line_off_where_nothing_fits_beside_one_that_fits(run_cli: Any) -> None:
    # One plan that fits (its line is off at the answer) and one where nothing fits: the
    # note names both places.
    code, out, _ = run_cli(
        *PLAN, "--kernel", "local_chunked", "--chunk-size", "16,1024", "--budget", "100KiB"
    )
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.startswith("local_chunked")]
    assert {r[3]: r[-1] for r in rows}["1024"] != "exact", out
    assert "line:" in out


# The whole-step plan takes the same rule: at a 1 MiB budget nothing of this sharded step
# fits (one token needs 1.33 MiB) while its line, fitted at 1,024 tokens and up, has a
# fixed part of 2.80 MiB: `exact` was printed.
def test_a_whole_step_plan_where_nothing_fits(run_cli: Any, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL))
    code, out, _ = run_cli(
        "plan", "--step", "--config", str(config), "--budget", "64KiB", "--no-reserved",
        "--kernel", "local_chunked", "--json",
    )  # fmt: skip
    assert code == 0, out
    (row,) = json.loads(out)
    assert row["max_tokens"] == 0
    line_at_one = row["slope_bytes_per_token"] + row["fixed_bytes"]
    off = abs(row["peak_bytes_above_max"] - line_at_one) >= row["slope_bytes_per_token"]
    assert row["line_exact"] is (not off)


# -- a plan where nothing fits at --batch 2 (`plan --vocab 1024 --budget 4KiB --batch 2`):
# the answer said "one token per GPU already needs 28.01 KiB", but the search counts one
# sequence's tokens: 28.01 KiB is the peak of one token in each of two sequences, two per
# GPU (one token per GPU cannot even be asked for at --batch 2). It now says so.
BATCHED = {
    "unchunked batch 2": (["--kernel", "unchunked", "--batch", "2"], 2, 1),
    "unchunked batch 3": (["--kernel", "unchunked", "--batch", "3"], 3, 1),
    "distributed tp 2 cp 2 batch 3": (
        ["--kernel", "distributed", "--tp", "2", "--cp", "2", "--batch", "3"],
        3,
        2,
    ),
    "batch 1": (["--kernel", "unchunked"], 1, 1),
}


@pytest.mark.parametrize(("args", "batch", "tp"), BATCHED.values(), ids=list(BATCHED))
def test_nothing_fits_at_a_batch_counts_one_token_per_sequence(
    run_cli: Any, args: list[str], batch: int, tp: int
) -> None:
    code, out, _ = run_cli(*PLAN, "--budget", "4KiB", "--dtype", "fp32", *args)
    assert code == 0
    answer = out.strip().splitlines()[-1]
    if batch == 1:
        assert answer.startswith("answer: nothing fits: one token per GPU already needs"), out
    else:
        said = f"one token per sequence × {batch} sequences = {batch} per GPU already needs"
        assert said in answer and "one token per GPU" not in answer, out
    # The figure is the peak of one token in each sequence: batch x one token's bytes
    # (fp32 logits, V / tp of them: 16 bytes per logit, 4 per target's log-prob).
    code, out, _ = run_cli(*PLAN, "--budget", "4KiB", "--dtype", "fp32", *args, "--json")
    (row,) = json.loads(out)
    assert row["max_tokens"] == 0 and row["batch"] == batch
    assert row["peak_bytes_above_max"] >= batch * 1024 // tp * 12
