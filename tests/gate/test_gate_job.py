"""The gate and plan stages as library calls; the gate sweeps with the sweep job itself."""

from __future__ import annotations

from pathlib import Path

import pytest

import memprobe.sweep
from memprobe.gate import GateRequest, run_gate
from memprobe.plan import PlanRequest, run_plan_job

CONFIG = """
[tool.memprobe.sweep]
tokens = [1024]
vocab = [16384]
kernel = ["local_chunked"]
device = "meta"

[tool.memprobe.gate]
rules = [{ kernel = "local_chunked", max_peak = "1 GiB" }]
"""


def test_the_gate_runs_the_sweep_job_memprobe_sweep_runs(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "pyproject.toml").write_text(CONFIG)
    seen: list[memprobe.sweep.SweepRequest] = []
    job = memprobe.sweep.run_sweep_job

    def spy(request, progress=None):  # type: ignore[no-untyped-def]
        seen.append(request)
        return job(request, progress)

    monkeypatch.setattr(memprobe.sweep, "run_sweep_job", spy)
    finished: list[tuple[int, int]] = []
    outcome = run_gate(
        GateRequest(
            cwd=tmp_path, out=tmp_path / "run", progress=lambda i, n, c, r: finished.append((i, n))
        )
    )
    assert [r.command for r in seen] == ["memprobe gate"]
    assert seen[0].snapshots and seen[0].verify is False
    assert finished == [(1, 1)] and outcome.exit_code == 0
    assert outcome.verdict is not None and outcome.verdict.results == str(tmp_path / "run")
    assert (tmp_path / "run" / "snapshots").is_dir()  # a failing case's is named in the report


def test_the_plan_job_reports_each_plan_as_it_finishes() -> None:
    seen: list[tuple[int, int, str]] = []
    request = PlanRequest(
        vocab=16384, budget="1GiB", kernels=("unchunked", "local_chunked"), reserved=False
    )
    outcome = run_plan_job(request, lambda i, n, p: seen.append((i, n, p.target.kernel)))
    assert [(i, n) for i, n, _ in seen] == [(1, 2), (2, 2)]  # counted as they finish
    assert {p.target.kernel for p in outcome.plans} == {"unchunked", "local_chunked"}
    # unchunked holds 14 bytes per logit: 1 GiB / (14 x 16384) tokens at most.
    unchunked = next(p for p in outcome.plans if p.target.kernel == "unchunked")
    assert 0 < unchunked.max_tokens <= 2**30 // (14 * 16384)


def test_a_bad_budget_fails_before_any_plan() -> None:
    from memprobe.errors import UserError

    with pytest.raises(UserError):
        run_plan_job(PlanRequest(vocab=16384, budget="lots"))
