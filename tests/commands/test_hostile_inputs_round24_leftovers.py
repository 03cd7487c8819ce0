"""Hostile inputs, round 24: what round 23 found and left (a value refused in words other
than the ones the user typed). Each row is a variant of the class. One line and exit 2,
or a sane answer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

# -- a --max-regression that is a number but no percentage: past a float (1e400), below
# zero, nan. The gate's own check echoed the float it had become: `--max-regression
# 1e400` was refused as "--max-regression inf", a value the user never typed. It is now
# refused where it is read, in the user's words.

NO_PERCENTAGE = ["1e400", "-1e400", "1e999%", "nan", "-nan", "inf", "-5", "-0.5%", " -1e-3 "]


@pytest.mark.parametrize("given", NO_PERCENTAGE)
def test_a_number_that_is_no_percentage_is_refused_as_typed(run_cli: Any, given: str) -> None:
    err = one_line(*run_cli("gate", "run", f"--max-regression={given}"))
    assert f"--max-regression {given!r} is not a percentage of zero or more" in err, err
    assert "inf" not in err.replace(given, "") and "for 5%" in err


@pytest.mark.parametrize(("given", "read"), [("0", 0.0), ("-0", 0.0), ("1e-400", 0.0), ("7%", 7.0)])
def test_a_percentage_of_zero_or_more_is_still_read(given: str, read: float) -> None:
    from memprobe.commands.gate import _percent

    assert _percent(given) == read


# -- an infinite number in results.json (Infinity, -Infinity, or 1e400, which json reads
# as inf): read as an empty cell, so a gate said "not measured (peak_bytes is empty for
# this case)" of a peak the file gives, and the page drew no bar. Refused as damage, as a
# negative byte count already is; NaN stays the empty cell pandas writes.

INFINITE = {
    "peak_bytes Infinity": ("peak_bytes", "Infinity"),
    "peak_bytes 1e400": ("peak_bytes", "1e400"),
    "floor_bytes -Infinity": ("floor_bytes", "-Infinity"),
    "fwd_time_s 1e999": ("fwd_time_s", "1e999"),
    "max_abs_err_bwd -1e400": ("max_abs_err_bwd", "-1e400"),
}


@pytest.mark.parametrize("command", ["gate", "report"])
@pytest.mark.parametrize(("key", "text"), INFINITE.values(), ids=list(INFINITE))
def test_an_infinite_number_in_results_is_damage(
    run_cli: Any,
    made_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    key: str,
    text: str,
) -> None:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    payload = json.loads((run / "results.json").read_text())
    payload["rows"][0][key] = "@"
    (run / "results.json").write_text(json.dumps(payload).replace('"@"', text))
    argv = ["report", str(run)] if command == "report" else ["gate", str(run), "--config", "g.toml"]
    (tmp_path / "g.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{kernel="*", max_peak="1GiB"}]\n'
    )
    monkeypatch.chdir(tmp_path)
    err = one_line(*run_cli(*argv))
    assert f"row 0 {key} is infinite" in err and "re-run the sweep" in err, err


def test_nan_is_still_an_empty_cell(run_cli: Any, made_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    payload = json.loads((run / "results.json").read_text())
    payload["rows"][0]["fwd_time_s"] = "@"
    (run / "results.json").write_text(json.dumps(payload).replace('"@"', "NaN"))
    assert run_cli("report", str(run), "--out", str(tmp_path / "p.html"))[0] == 0


# -- python -OO (or PYTHONOPTIMIZE=2) drops docstrings, which typer read each command's
# help from: `memprobe --help` listed the nine commands bare and `memprobe plan --help`
# had no description. The help is each command module's HELP constant now.


# Both pages in one process: a second one would import memprobe again for nothing.
SHOW_BOTH = (
    "import sys\n"
    "from memprobe.cli import main\n"
    "for argv in (['--help'], ['plan', '--help']):\n"
    "    sys.argv = ['memprobe', *argv]\n"
    "    try:\n"
    "        main()\n"
    "    except SystemExit:\n"
    "        pass\n"
)


def test_help_keeps_its_descriptions_when_docstrings_are_dropped() -> None:
    from memprobe.commands import plan, step, sweep

    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(__file__).parents[2])}
    shown = subprocess.run(
        [sys.executable, "-OO", "-c", SHOW_BOTH], capture_output=True, text=True, env=env
    )
    assert shown.returncode == 0, shown.stderr
    for module in (plan, step, sweep):
        assert module.HELP.splitlines()[0] in shown.stdout, shown.stdout
    assert "For every kernel x parallel layout" in shown.stdout, shown.stdout


# -- plan --from-run of a cpu or cuda run with no usable time was told "(a --device meta
# run simulates memory only)", of a run that is not on meta. Meta is named only where the
# run holds meta rows.


@pytest.mark.parametrize("device", ["cpu", "cuda", "meta"])
def test_from_run_without_times_names_meta_only_for_a_meta_run(
    run_cli: Any, made_run: Path, tmp_path: Path, device: str
) -> None:
    run = shutil.copytree(made_run, tmp_path / "run")
    payload = json.loads((run / "results.json").read_text())
    for row in payload["rows"]:
        row.update(device=device, fwd_time_s=None, bwd_time_s=None)
    (run / "results.json").write_text(json.dumps(payload))
    args = ["plan", "--from-run", str(run), "--budget", "1MiB", "--vocab", "128"]
    err = one_line(*run_cli(*args, "--kernel", "local_chunked", "--no-reserved"))
    assert "has no measured times" in err and "drop --from-run" in err, err
    assert ("meta" in err) == (device == "meta"), err


# -- plan --step on a config torch cannot build a model of (a weight past int64 bytes)
# said the model "cannot run this op", the step's hint, though no op of the step had run:
# the build before the search failed. Its hint says so.


@pytest.mark.parametrize("hidden", [2**40, 2**33])
def test_a_model_that_cannot_be_built_is_not_said_to_fail_an_op(
    run_cli: Any, tmp_path: Path, hidden: int
) -> None:
    config = {"model_type": "llama", "hidden_size": hidden, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 2**31}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    err = one_line(*run_cli("plan", "--step", "--config", str(tmp_path), "--budget", "1GiB"))
    assert "failed to build" in err and "torch cannot make a model of them" in err, err
    assert "this op" not in err
