"""``plan --step`` of a model with a table of positions (GPT-2's ``wpe``): no answer is
longer than the table. Where the whole table fits the budget, that is the answer (no
count above it runs); where it does not, the budget's boundary below it is."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from memprobe.plan import make_budget, whole_step  # noqa: E402
from memprobe.profile.hf import HFStep, config_from_dict  # noqa: E402
from memprobe.profile.step import trace_hf_step  # noqa: E402

POSITIONS = 64
CONFIG = {
    "model_type": "gpt2",
    "n_layer": 1,
    "n_head": 2,
    "n_embd": 32,
    "vocab_size": 512,
    "n_positions": POSITIONS,
}
KERNELS = ["unchunked", "local_chunked"]


def _base() -> HFStep:
    return HFStep(config_from_dict(dict(CONFIG)), tokens=1, chunk_size=16, optimizer="sgd")


@cache
def _peak(kernel: str, tokens: int) -> int:
    tracked, _ = trace_hf_step(replace(_base(), kernel=kernel, tokens=tokens))
    return tracked.peak_bytes


def test_a_budget_past_the_table_answers_the_table() -> None:
    plans = whole_step.plan_step(_base(), KERNELS, make_budget("1GiB"), reserved=True)
    for plan in plans:
        assert plan.at_positions and plan.max_tokens == POSITIONS, plan
        assert plan.allocated.peak_at_max == _peak(plan.target.kernel, POSITIONS)
        assert plan.reserved is not None and plan.reserved.max_tokens == POSITIONS
        assert plan.row()["peak_bytes_above_max"] is None
        # The two seeds and the table's end; nothing searched past it.
        assert plan.allocated.simulations <= 3


def test_a_budget_inside_the_table_answers_its_own_boundary() -> None:
    # Between the two kernels' peaks at the whole table: one fits it, the other does not.
    low, high = sorted(_peak(k, POSITIONS) for k in KERNELS)
    assert low < high
    limit = (low + high) // 2
    plans = {
        p.target.kernel: p
        for p in whole_step.plan_step(_base(), KERNELS, make_budget(limit), reserved=False)
    }
    capped = [k for k, p in plans.items() if p.at_positions]
    assert len(capped) == 1 and plans[capped[0]].max_tokens == POSITIONS
    (other,) = (p for k, p in plans.items() if k not in capped)
    t = other.max_tokens
    assert 0 < t < POSITIONS and other.allocated.peak_above is not None
    assert _peak(other.target.kernel, t) <= limit < _peak(other.target.kernel, t + 1)


def test_the_answer_line_says_the_table_ended_it(run_cli: Any, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    flags = ("plan", "--step", "--config", str(config), "--budget", "1GiB", "--no-reserved")
    flags += ("--kernel", ",".join(KERNELS), "--chunk-size", "16", "--optimizer", "sgd")
    code, out, err = run_cli(*flags)
    assert code == 0, (out, err)
    answer = out.strip().splitlines()[-1]
    assert f"every kernel fits all {POSITIONS} positions the model learned" in answer, answer
    assert "no more positions" in out and "line: the peak is not one line" not in out, out
    code, out, err = run_cli(*flags, "--json")
    assert code == 0, (out, err)
    rows = json.loads(out)
    assert [r["max_tokens"] for r in rows] == [POSITIONS] * 2
    assert all(r["peak_bytes_above_max"] is None for r in rows)
