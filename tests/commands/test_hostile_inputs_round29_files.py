"""Hostile inputs, round 29 (files): results, baselines and gate configs whose numbers
sit exactly on a limit the user wrote as a decimal. Each limit is the decimal as written,
compared in whole bytes: a peak exactly at it passes, one byte over fails. Each table is a
variant of a defect class the pass found."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest


def _peak_set(made_run: Path, to: Path, peak: int) -> Path:
    """A copy of ``made_run`` whose every row peaks at ``peak`` bytes (the figures a peak
    holds left out: a peak of 1,000 B holds no 80 KiB forward peak)."""
    run = Path(shutil.copytree(made_run, to))
    payload = json.loads((run / "results.json").read_text())
    for row in payload["rows"]:
        row["peak_bytes"] = peak
        for part in ("forward_peak_bytes", "backward_peak_bytes", "floor_bytes"):
            row[part] = None
    (run / "results.json").write_text(json.dumps(payload))
    return run


def _config(here: Path, rule: str = "") -> str:
    rules = f'rules = [{{kernel = "*", {rule}}}]' if rule else "rules = []"
    (here / "pyproject.toml").write_text(f"[tool.memprobe.gate]\n{rules}\n")
    return str(here / "pyproject.toml")


# -- R1: a peak exactly the growth --max-regression allows over the baseline. The limit was
# the baseline times 1 + p/100 in floats, just under the exact bytes for 13, 15, 36, 57 ...
# percent: 115 MiB over a baseline of 100 MiB at --max-regression 15 FAILed "(+15.00%,
# allowed +15.00% = 115.00 MiB): over by 0 B", exit 1. The growth is the decimal as typed.

# (percent as typed, baseline peak, the peak exactly that much above it)
ON_THE_LIMIT = {
    "15% of 100 MiB": ("15", 100 * 2**20, 115 * 2**20),
    "13% of 100 MiB": ("13", 100 * 2**20, 118_489_088),
    "36% of 1,000 B": ("36", 1000, 1360),
    "57% of 1 GB": ("57", 10**9, 1_570_000_000),
    "12.5% of 2,000 B": ("12.5", 2000, 2250),
    "0% (the default)": ("0", 4096, 4096),
}


@pytest.mark.parametrize("what", sorted(ON_THE_LIMIT))
def test_a_peak_exactly_at_the_allowed_regression_passes(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    percent, base_peak, peak = ON_THE_LIMIT[what]
    base = _peak_set(made_run, here / "base", base_peak)
    run = _peak_set(made_run, here / "run", peak)
    args = ["gate", str(run), "--baseline", str(base), "--config", _config(here)]
    code, out, err = run_cli(*args, "--max-regression", percent)
    assert code == 0 and "FAIL" not in out and "passed" in out, (out, err)


@pytest.mark.parametrize("what", sorted(ON_THE_LIMIT))
def test_a_peak_a_byte_over_the_allowed_regression_fails(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    percent, base_peak, peak = ON_THE_LIMIT[what]
    base = _peak_set(made_run, here / "base", base_peak)
    run = _peak_set(made_run, here / "run", peak + 1)
    args = ["gate", str(run), "--baseline", str(base), "--config", _config(here)]
    code, out, err = run_cli(*args, "--max-regression", percent)
    assert code == 1 and "over by 1 B" in out, (out, err)


def test_a_config_max_regression_on_the_limit_passes(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    base = _peak_set(made_run, here / "base", 100 * 2**20)
    run = _peak_set(made_run, here / "run", 115 * 2**20)
    (here / "pyproject.toml").write_text(
        f'[tool.memprobe.gate]\nrules = []\nbaseline = "{base / "results.json"}"\n'
        "max_regression = 15\n"
    )
    code, out, err = run_cli("gate", str(run), "--config", str(here / "pyproject.toml"))
    assert code == 0 and "allowed +15.00% = 115.00 MiB" in out, (out, err)
