"""Hostile inputs, round 34 (flags): the numbers each command prints for the flags given,
checked against hand arithmetic. Each table is a variant of a defect class the pass found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# -- A: `memprobe step --optimizer adamw|sgd` simulated the first training step, whose
# optimizer makes its state lazily, in the optimizer step: the forward and backward ran
# without it. Every later step holds it through both, so the README's 8B unchunked step
# "fits" 80 GiB (allocated 75.00 GiB, in the optimizer step) where each later step's
# backward holds 49.80 GiB beside 30.00 GiB of AdamW moments (reserved 87.65 GiB). The state
# is now made before the step, as the first step leaves it.

# --optimizer -> the state's bytes per parameter byte (bf16 parameters).
STATE_PER_PARAMETER = {"adamw": 2, "sgd": 1, "none": 0}


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One simulated step per optimizer (the small config at 64 tokens, in-process)."""
    from small_config import SMALL

    from memprobe.profile.hf import HFStep, config_from_dict
    from memprobe.profile.step import simulate_step

    out = {}
    for name in STATE_PER_PARAMETER:
        step = HFStep(config_from_dict(dict(SMALL)), tokens=64, optimizer=name)
        result = simulate_step(step)
        out[name] = {
            "phases": dict(result.phase_peaks),
            "at_peak": dict(result.bytes_by_category),
            "peak_phase": result.peak_phase,
            "parameters": result.parameters,
        }
    return out


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_step_after_the_first_holds_the_optimizer_state_in_forward_and_backward(
    steps: dict[str, dict[str, Any]], optimizer: str, phase: str
) -> None:
    found, bare = steps[optimizer], steps["none"]
    state = STATE_PER_PARAMETER[optimizer] * found["parameters"] * 2  # bf16
    # The same forward and backward, with the state beside them (to the allocator's 512 B).
    assert found["phases"][phase] - bare["phases"][phase] == pytest.approx(state, abs=512 * 64)
    assert found["phases"][phase] - bare["phases"][phase] >= state


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_the_state_is_its_own_line_at_a_backward_peak(
    steps: dict[str, dict[str, Any]], optimizer: str
) -> None:
    found = steps[optimizer]
    assert found["peak_phase"] == "backward"  # 64 tokens: the activations outgrow the step
    state = STATE_PER_PARAMETER[optimizer] * found["parameters"] * 2
    assert found["at_peak"]["optimizer state"] == pytest.approx(state, abs=512 * 64)
    assert "gradients" not in found["at_peak"] or optimizer == "sgd"


def test_a_step_without_an_optimizer_holds_no_state(steps: dict[str, dict[str, Any]]) -> None:
    assert "optimizer state" not in steps["none"]["at_peak"]


def test_the_budget_verdict_counts_the_state(run_cli: Any, tmp_path: Path) -> None:
    """A budget between the first step's peak and a later step's: it does not fit."""
    from small_config import SMALL

    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    args = ["step", "--config", str(tmp_path), "--tokens", "64", "--json"]
    code, out, err = run_cli(*args, "--optimizer", "none")
    assert code == 0, err
    first_step_like = json.loads(out)["peak_allocated_bytes"]
    code, out, err = run_cli(*args, "--budget", f"{first_step_like + 1024}")
    assert code == 0, err
    row = json.loads(out)
    assert row["peak_allocated_bytes"] > first_step_like + 1024
    assert row["fits_allocated"] is False
