"""``memprobe sweep --shard``: the cases shared out across torchrun ranks, one run directory."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from launch import TORCHRUN

from memprobe.errors import UserError
from memprobe.records import Case
from memprobe.results import in_plan_order, plan_positions, read_rows
from memprobe.sharded_sweep import _check_one_rank_each
from memprobe.sweep import plan_cases, run_sweep

# Four small cases: two kernels at two token counts, simulated.
GRID = [
    "--device", "meta", "--kernel", "unchunked,local_chunked", "--tokens", "1024,2048",
    "--vocab", "4096", "--no-ladder", "--no-verify",
]  # fmt: skip
TIMING = ("fwd_time_s", "bwd_time_s")
HERE = Path(__file__).parent


def torchrun(*args: str, cwd: Path, script: str | None = None, fail: str | None = None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if fail is not None:
        env["SHARD_TEST_FAIL"] = fail
    target = [str(HERE / script)] if script else ["-m", "memprobe"]
    return subprocess.run(
        [*TORCHRUN, *target, "sweep", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_rows(run)]


def reference(tmp_path: Path) -> list[dict]:
    """The one-process sweep of GRID."""
    cases = plan_cases(
        kernel=["unchunked", "local_chunked"], tokens=[1024, 2048], vocab=[4096],
        device="meta", ladder=False,
    )  # fmt: skip
    out = tmp_path / "single"
    run_sweep(cases, out, verify=False)
    return rows(out)


@pytest.mark.multiprocess
def test_two_ranks_write_the_one_process_run(tmp_path):
    out = tmp_path / "run"
    done = torchrun(*GRID, "--shard", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("run directory:") == 1  # only rank 0 reports
    assert rows(out) == reference(tmp_path)
    snapshots = sorted(p.name for p in (out / "snapshots").iterdir())
    assert snapshots == sorted(Path(r["snapshot"]).name for r in rows(out))
    assert len(snapshots) == 4


@pytest.mark.multiprocess
def test_a_rank_killed_mid_run_loses_nothing_on_resume(tmp_path, run_cli):
    out = tmp_path / "run"
    done = torchrun(
        *GRID, "--shard", "--out", str(out), cwd=tmp_path, script="shard_rank_fails.py",
        fail="exit",
    )  # fmt: skip
    assert done.returncode != 0
    # Rank 1 took a case and died with it: rank 0 wrote two rows, maybe a third, never that one.
    assert 2 <= len(read_rows(out)) <= 3
    planned = json.loads((out / "run.json").read_text())["cases"]
    assert len(planned) == 4
    code, _, err = run_cli("sweep", "--resume", str(out), "--no-verify", "--quiet")
    assert code == 0, err
    assert rows(out) == reference(tmp_path)


@pytest.mark.multiprocess
def test_two_ranks_resume_a_one_process_run(tmp_path):
    out = tmp_path / "run"
    cases = plan_cases(
        kernel=["unchunked", "local_chunked"], tokens=[1024, 2048], vocab=[4096],
        device="meta", ladder=False,
    )  # fmt: skip

    def stop_after_one(i, n, case, run):
        if i == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(cases, out, verify=False, progress=stop_after_one)
    done = torchrun("--resume", str(out), "--no-verify", "--shard", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert rows(out) == reference(tmp_path)


@pytest.mark.multiprocess
def test_a_case_that_fails_on_one_rank_is_recorded_and_the_others_finish(tmp_path):
    out = tmp_path / "run"
    done = torchrun(
        *GRID, "--shard", "--out", str(out), cwd=tmp_path, script="shard_rank_fails.py",
        fail="oom",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    statuses = [r["status"] for r in read_rows(out)]
    assert sorted(statuses) == ["ok", "ok", "ok", "oom"]
    failed = next(r for r in read_rows(out) if r["status"] == "oom")
    assert "out of memory" in failed["note"]


def test_shard_outside_torchrun_is_one_line(run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    code, _, err = run_cli("sweep", *GRID, "--shard", "--out", str(tmp_path / "run"))
    assert code == 2
    assert err.count("\n") <= 2 and "torchrun" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_real_parallel_case_is_not_a_shards_job():
    case = Case("chunked_distributed", 1, 1024, 4096, "bf16", 1024, tp=2, device="cpu")
    with pytest.raises(UserError, match="needs 2"):
        _check_one_rank_each([case])
    _check_one_rank_each([Case("chunked_distributed", 1, 1024, 4096, "bf16", 1024, tp=2)])


def test_rows_are_kept_in_the_plans_order():
    cases = [Case("unchunked", 1, s, 4096, "bf16") for s in (1, 2, 3)]
    rows = [{"case_id": c.case_id, **c.__dict__} for c in reversed(cases)]
    assert [r["tokens"] for r in in_plan_order(rows, plan_positions(cases))] == [1, 2, 3]
