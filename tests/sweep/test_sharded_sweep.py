"""``memprobe sweep --shard``: the cases shared out across torchrun ranks, one run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch import forked_torchrun

from memprobe.measure import measure
from memprobe.records import Case
from memprobe.results import (
    UNFINISHED,
    in_plan_order,
    plan_positions,
    read_results,
    read_rows,
    write_results,
)
from memprobe.sharded_sweep import shares
from memprobe.sweep import open_run, plan_cases, run_sweep

# Four small cases: two kernels at two token counts, simulated. No report: rank 0 would
# draw one that no test here reads (a second each); test_two_ranks_measure_and_rank_zero_writes
# has rank 0 write its report.
GRID = [
    "--device", "meta", "--kernel", "unchunked,local_chunked", "--tokens", "1024,2048",
    "--vocab", "4096", "--no-ladder", "--no-verify", "--no-report",
]  # fmt: skip
TIMING = ("fwd_time_s", "bwd_time_s")
HERE = Path(__file__).parent


def torchrun(*args: str, cwd: Path, script: str | None = None, fail: str | None = None):
    """``torchrun --nproc-per-node 2 -m memprobe sweep ARGS`` (or the failing-rank SCRIPT), its
    ranks forked from the preloaded server: tests/sweep/test_torchrun.py runs real torchrun."""
    env = {} if fail is None else {"SHARD_TEST_FAIL": fail}
    return forked_torchrun(
        ["sweep", *args], cwd=cwd, script=HERE / script if script else None, env=env
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
    code, _, err = run_cli("sweep", "--resume", str(out), "--no-verify", "--no-report", "--quiet")
    assert code == 0, err
    assert rows(out) == reference(tmp_path)


@pytest.mark.multiprocess
def test_two_ranks_resume_a_one_process_run(tmp_path):
    """Three of four cases left, shared by two ranks: the run is the one-process run's."""
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
    done = torchrun("--resume", str(out), "--no-verify", "--no-report", "--shard", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("run directory:") == 1  # only rank 0 reports
    assert rows(out) == reference(tmp_path)
    snapshots = sorted(p.name for p in (out / "snapshots").iterdir())
    assert snapshots == sorted(Path(r["snapshot"]).name for r in rows(out))
    assert len(snapshots) == 4


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
    # A fresh --shard run: the other three rows are the one-process run's.
    expected = {r["case_id"]: r for r in reference(tmp_path)}
    finished = [r for r in rows(out) if r["status"] == "ok"]
    assert finished == [expected[r["case_id"]] for r in finished]


def test_shard_outside_torchrun_is_one_line(run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    code, _, err = run_cli("sweep", *GRID, "--shard", "--out", str(tmp_path / "run"))
    assert code == 2
    assert err.count("\n") <= 2 and "torchrun" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


# A grid of real cases on CPU mixing one-rank and two-rank layouts (and a four-rank one
# a two-rank job cannot run): tiny, a torch import costs more than the cases.
PARALLEL = [
    "--device", "cpu", "--kernel", "chunked_distributed", "--tokens", "256", "--vocab",
    "2048", "--dtype", "bf16,fp32", "--no-ladder",
]  # fmt: skip


@pytest.fixture(scope="module")
def tp2_alone(tmp_path_factory):
    """PARALLEL's tp 2 cases as a two-rank torchrun job without --shard: the run."""
    tmp = tmp_path_factory.mktemp("alone")
    done = torchrun(*PARALLEL, "--tp", "2", "--out", str(tmp / "run"), cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, tmp / "run"


@pytest.mark.multiprocess
def test_two_ranks_measure_and_rank_zero_writes(tp2_alone):
    done, out = tp2_alone
    assert done.stdout.count("run directory:") == 1  # only rank 0 reports
    assert done.stdout.count("report:") == 1 and (out / "report.html").is_file()
    frame = read_results(out).set_index("dtype")
    assert list(frame["status"]) == ["ok", "ok"] and list(frame["tp"]) == [2, 2]
    simulated = measure(Case("chunked_distributed", 1, 256, 2048, "bf16", 1024, tp=2))
    assert frame.loc["bf16", "peak_bytes"] == simulated.peak_bytes  # per rank, exact
    assert frame.loc["bf16", "fwd_collectives"] == 2
    # The verify step checks one rank's whole-vocabulary result inside the two-rank job.
    # A correct kernel is within rounding of float64 (a one-rank check run over the
    # two-rank group was ln 2 off); a bf16 gradient carries bf16's own rounding.
    assert frame.loc["fp32", "max_abs_err_fwd"] < 1e-4
    assert frame.loc["fp32", "max_abs_err_bwd"] < 1e-4
    assert frame.loc["bf16", "max_abs_err_fwd"] < 1e-4
    assert frame.loc["bf16", "max_abs_err_bwd"] < 1e-2


@pytest.mark.multiprocess
def test_parallel_cases_run_on_teams_of_ranks_as_without_shard(tmp_path, tp2_alone):
    out = tmp_path / "run"
    done = torchrun(
        *PARALLEL, "--tp", "1,2,4", "--no-report", "--shard", "--out", str(out), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sharded = rows(out)
    assert [(r["tp"], r["dtype"]) for r in sharded] == [
        (tp, dtype) for dtype in ("bf16", "fp32") for tp in (1, 2, 4)
    ]
    # tp 4 needs four ranks: a skipped row that says so, as a one-process sweep's.
    too_big = [r for r in sharded if r["tp"] == 4]
    assert [r["status"] for r in too_big] == ["skipped", "skipped"]
    assert all("needs 4 ranks" in r["note"] for r in too_big)
    # The tp 2 cases as a two-rank torchrun job without --shard measures them, the tp 1
    # cases as one process does: same rows, same order, snapshots included.
    _, alone = tp2_alone
    # The tp 1 cases in a fresh process too, as every rank above was: a real run in this
    # (warm) pytest worker once read other bytes in the full suite, never alone.
    one = tmp_path / "one"
    done = forked_torchrun(
        ["sweep", *PARALLEL, "--tp", "1", "--no-report", "--out", str(one)], cwd=tmp_path, nproc=0
    )
    assert done.returncode == 0, done.stderr[-3000:]
    by_tp = {1: rows(one), 2: rows(alone)}
    expected = [by_tp[r["tp"]].pop(0) for r in sharded if r["tp"] != 4]
    got = [r for r in sharded if r["tp"] != 4]
    differ = [
        (i, k, a.get(k), b.get(k))
        for i, (a, b) in enumerate(zip(got, expected, strict=True))
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]
    assert not differ, differ  # (row, field, --shard's, the plain run's)
    assert all(r["status"] == "ok" and r["max_abs_err_fwd"] is not None for r in expected)
    assert len(list((out / "snapshots").iterdir())) == 4


@pytest.mark.multiprocess
def test_a_rank_that_hangs_is_named_and_its_case_runs_again_on_resume(tmp_path, run_cli):
    out = tmp_path / "run"
    done = torchrun(
        *GRID, "--shard", "--case-timeout", "3", "--out", str(out), cwd=tmp_path,
        script="shard_rank_fails.py", fail="hang",
    )  # fmt: skip
    assert done.returncode != 0
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("memprobe: error:")]
    assert (
        len(errors) == 1
        and "rank 1 of this --shard job went silent (--case-timeout 3 s): 1 case(s)" in errors[0]
    )
    assert "--resume" in done.stderr
    # Rank 0 measured its cases and rank 1's first; rank 1's second is recorded, unfinished.
    written = read_rows(out)
    assert sorted(r["status"] for r in written) == ["error", "ok", "ok", "ok"]
    (hung,) = [r for r in written if r["status"] == "error"]
    assert hung["note"].startswith("unfinished: rank 1 sent no result within 3 s")
    code, _, err = run_cli("sweep", "--resume", str(out), "--no-verify", "--no-report", "--quiet")
    assert code == 0, err
    assert rows(out) == reference(tmp_path)


@pytest.mark.multiprocess
def test_a_rank_that_hangs_inside_a_two_rank_case_does_not_hold_rank_0(tmp_path):
    out = tmp_path / "run"
    done = torchrun(
        *PARALLEL, "--tp", "2", "--no-verify", "--no-report", "--shard", "--case-timeout", "2",
        "--out", str(out), cwd=tmp_path, script="shard_rank_fails.py", fail="hang-team",
    )  # fmt: skip
    assert done.returncode != 0
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("memprobe: error:")]
    assert len(errors) == 1 and "rank 1 of this --shard job went silent" in errors[0]
    assert "1 other case(s) were not run" in errors[0]
    (hung,) = read_rows(out)  # the first case, rank 1's part missing; the second not run
    assert hung["status"] == "error" and hung["note"].startswith("unfinished: rank 1 ")


@pytest.mark.multiprocess
def test_a_rank_that_hangs_before_its_team_forms_is_one_line(tmp_path):
    """Rank 0 waits in the team's rendezvous (twice --case-timeout), then says so in one
    line: no traceback, no row for a case nobody started."""
    out = tmp_path / "run"
    done = torchrun(
        *PARALLEL, "--tp", "2", "--no-verify", "--no-report", "--shard", "--case-timeout", "1",
        "--out", str(out), cwd=tmp_path, script="shard_rank_fails.py", fail="hang-join",
    )  # fmt: skip
    assert done.returncode != 0
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("memprobe: error:")]
    assert len(errors) == 1 and "rank 1 of this --shard job went silent" in errors[0]
    assert "2 other case(s) were not run" in errors[0]
    assert "Traceback" not in done.stderr.split("memprobe: error:")[0]
    # No row yet; the run's plan is there for --resume.
    assert (out / "run.json").is_file() and not (out / "results.json").exists()


def test_case_timeout_without_shard_is_one_line(run_cli, tmp_path):
    code, _, err = run_cli("sweep", *GRID, "--case-timeout", "5", "--out", str(tmp_path / "r"))
    assert code == 2
    assert err.count("\n") <= 2 and "--shard" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_cases_are_shared_by_the_ranks_they_need():
    cases = [
        Case("chunked_distributed", 1, 1024, 4096, "bf16", 1024, tp=tp, cp=cp, device=device)
        for tp, cp, device in [
            (2, 1, "cpu"), (1, 1, "cpu"), (4, 1, "meta"), (1, 2, "cpu"), (2, 2, "cpu"),
            (2, 1, "cpu"),
        ]
    ]  # fmt: skip
    layouts, too_big = shares(cases, world_size=2)
    # One-rank cases first (a simulated tp 4 is one process), then each layout by size.
    assert layouts == {"1x1": [1, 2], "1x2": [3], "2x1": [0, 5]}
    assert too_big == [4]
    assert shares(cases, world_size=4)[1] == []


def test_an_unfinished_row_is_run_again_on_resume(tmp_path):
    cases = [Case("unchunked", 1, s, 4096, "bf16") for s in (1024, 2048)]
    out = tmp_path / "run"
    run_sweep(cases, out, verify=False)
    before = read_rows(out)
    stuck = {**before[1], "status": "error", "note": f"{UNFINISHED}rank 1 sent no result"}
    write_results(out, [before[0], stuck])
    _, _, todo = open_run([], out, "", True, None)
    assert todo == [cases[1]]
    run_sweep([], out, verify=False, resume=True)
    assert read_rows(out) == before


def test_rows_are_kept_in_the_plans_order():
    cases = [Case("unchunked", 1, s, 4096, "bf16") for s in (1, 2, 3)]
    rows = [{"case_id": c.case_id, **c.__dict__} for c in reversed(cases)]
    assert [r["tokens"] for r in in_plan_order(rows, plan_positions(cases))] == [1, 2, 3]
