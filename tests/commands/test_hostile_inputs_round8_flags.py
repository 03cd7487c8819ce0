"""Hostile inputs, round 8 (command lines, configs, user code, environments): each row is
a variant of a defect class the round's pass found. One line and exit 2, or a sane answer;
nothing written is lost."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memprobe.errors import UserError
from memprobe.io.sizes import parse_budget, parse_size

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


# -- a negative zero is zero: "-0" was called negative, where "0" is "must be more than 0"


@pytest.mark.parametrize("text", ["-0", "-0GiB", " -0.0 MiB", "-0_000", "-0,000 B"])
def test_a_negative_zero_is_zero(text: str) -> None:
    assert parse_size(text, what="--other") == 0
    with pytest.raises(UserError) as caught:
        parse_budget(text)
    line = caught.value.one_line()
    assert "must be more than 0 bytes" in line and "it is 0 bytes" in line
    assert "negative" not in line


@pytest.mark.parametrize(
    ("text", "says"),
    [("-1", "is negative"), ("-0.5", "is negative"), ("-x", "is not a size"), ("--5", "not a")],
)
def test_what_is_below_zero_or_no_size_is_still_said_so(text: str, says: str) -> None:
    with pytest.raises(UserError, match=says):
        parse_size(text, what="--other")


@pytest.mark.parametrize("budget", ["-0", "0", "0.4", "-0 GiB"])
def test_report_refuses_a_budget_of_nothing_as_the_others_do(
    run_cli: Any, made_run: Path, budget: str
) -> None:
    # report read its --budget as any size: 0 was taken and drawn, -0 was "negative".
    code, out, err = run_cli("report", str(made_run), "--budget", budget)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"--budget {budget!r} must be more than 0 bytes (it is 0 bytes" in err


# -- a reader that left early: `memprobe kernels | true` exited 1 (click's own handling)


class _LeftReader(io.StringIO):
    """A standard output whose reader has gone: every write and flush is a broken pipe."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def _run_with_left_reader(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    from memprobe import cli

    err = io.StringIO()
    monkeypatch.setattr(sys, "argv", ["memprobe", *args])
    monkeypatch.setattr(sys, "stdout", _LeftReader())
    monkeypatch.setattr(sys, "stderr", err)
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return code, err.getvalue()


GATE_RULES = {
    "passes": ('{ kernel = "unchunked", max_peak = "1TiB" }', 0),
    "fails": ('{ kernel = "unchunked", max_peak = 1 }', 1),
}


@pytest.mark.parametrize(
    "args",
    [
        ["kernels"],
        ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "local_chunked",
         "--no-reserved"],
        ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "unchunked", "--json",
         "--no-reserved"],
    ],
)  # fmt: skip
def test_a_reader_that_left_is_no_error(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    code, err = _run_with_left_reader(monkeypatch, *args)
    assert code == 0 and "Traceback" not in err and "error" not in err, err


@pytest.mark.parametrize("verdict", sorted(GATE_RULES))
def test_a_gates_verdict_stands_when_its_reader_left(
    monkeypatch: pytest.MonkeyPatch, made_run: Path, here: Path, verdict: str
) -> None:
    rule, expected = GATE_RULES[verdict]
    (here / "gate.toml").write_text(f"[tool.memprobe.gate]\nrules = [{rule}]\n")
    code, err = _run_with_left_reader(monkeypatch, "gate", str(made_run), "--config", "gate.toml")
    assert code == expected and "Traceback" not in err, err


def test_kernels_into_a_pipe_whose_reader_left_exits_0(tmp_path: Path) -> None:
    """The real pipe: the writer's own status (PIPESTATUS[0]), not the reader's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = f"{sys.executable} -m memprobe kernels | (sleep 1; true); exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and not done.stderr, done.stderr
