from __future__ import annotations

import json

import pytest

from memprobe.errors import UserError
from memprobe.records import RESULT_COLUMNS
from memprobe.results import read_results
from memprobe.sweep import plan_cases, run_sweep, x2_ladder


def test_ladders_end_at_the_value_given():
    assert x2_ladder(20000, 1024) == [1024, 2048, 4096, 8192, 16384, 20000]
    assert x2_ladder(131072, 16384) == [16384, 32768, 65536, 131072]
    assert x2_ladder(500, 1024) == [500]


def test_default_plan_is_a_cross_with_the_largest_point():
    cases = plan_cases(tokens=[20000], vocab=[131072], kernel=["unchunked"], device="meta")
    shapes = [(c.tokens, c.vocab) for c in cases]
    assert len(shapes) == 6 + 3
    assert (20000, 131072) in shapes and (1024, 131072) in shapes and (20000, 16384) in shapes
    assert (1024, 16384) not in shapes
    grid = plan_cases(
        tokens=[20000], vocab=[131072], kernel=["unchunked"], device="meta", grid=True
    )
    assert len(grid) == 6 * 4


def test_plan_defaults_to_every_single_device_kernel_and_literal_lists():
    cases = plan_cases(tokens=[4096, 20000], vocab=[131072], device="meta", ladder=False)
    assert {c.kernel for c in cases} >= {"unchunked", "local_chunked", "local_chunked_inplace"}
    assert {(c.tokens, c.vocab) for c in cases} == {(4096, 131072), (20000, 131072)}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tokens": [0]}, "tokens must be positive"),
        ({"vocab": [-5]}, "vocab must be positive"),
        ({"chunk_size": [0]}, "chunk size"),
        ({"kernel": ["nope"]}, "unknown kernel"),
        ({"dtype": ["int8"]}, "unknown dtype"),
        ({"device": "tpu"}, "unknown device"),
        ({"cp": [3]}, "does not divide the tokens"),
        ({"tp": [2], "kernel": ["local_chunked"]}, "cannot do"),
    ],
)
def test_plan_rejects_bad_input(kwargs, message):
    base = {"tokens": [4096], "vocab": [32768], "device": "meta"}
    with pytest.raises(UserError, match=message):
        plan_cases(**{**base, **kwargs})


def small_cases():
    return plan_cases(
        tokens=[2048], vocab=[32768], kernel=["unchunked", "local_chunked"], device="meta"
    )


def test_run_writes_rows_and_metadata(tmp_path):
    out = tmp_path / "run"
    frame = run_sweep(small_cases(), out, command="memprobe sweep --test")
    assert list(frame.columns) == list(RESULT_COLUMNS)
    assert len(frame) == 2 * 3 and set(frame["status"]) == {"ok"}
    meta = json.loads((out / "run.json").read_text())
    assert meta["command"] == "memprobe sweep --test" and meta["torch_version"]
    assert len(meta["cases"]) == 6
    assert read_results(out).equals(read_results(out / "results.json"))
    assert (out / "results.csv").read_text().splitlines()[0].startswith("case_id,kernel,")
    assert frame["max_abs_err_fwd"].notna().all()


def test_an_existing_run_is_never_overwritten(tmp_path):
    out = tmp_path / "run"
    run_sweep(small_cases(), out)
    before = (out / "results.json").read_bytes()
    with pytest.raises(UserError, match="already exists"):
        run_sweep(small_cases(), out)
    assert (out / "results.json").read_bytes() == before


def test_interrupt_keeps_finished_rows_and_resume_finishes(tmp_path):
    out = tmp_path / "run"

    def stop_after_two(i, n, case, run):
        if i == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(small_cases(), out, progress=stop_after_two)
    assert len(read_results(out)) == 2
    seen = []
    frame = run_sweep([], out, resume=True, progress=lambda i, n, c, r: seen.append(c.case_id))
    assert len(seen) == 4 and len(frame) == 6
    assert frame["case_id"].is_unique


def test_resume_needs_a_run(tmp_path):
    with pytest.raises(UserError, match="not a memprobe run"):
        run_sweep([], tmp_path, resume=True)
    with pytest.raises(UserError, match="no such directory"):
        run_sweep([], tmp_path / "missing", resume=True)


def test_a_failing_case_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    from memprobe import sweep

    real = sweep.measure

    def flaky(case, *, layout=None):
        if case.kernel == "unchunked" and case.tokens == 1024:
            raise RuntimeError("boom\nsecond line")
        return real(case, layout=layout)

    monkeypatch.setattr(sweep, "measure", flaky)
    frame = run_sweep(small_cases(), tmp_path / "run")
    bad = frame[frame["status"] == "error"]
    assert len(bad) == 1 and bad["note"].iloc[0] == "RuntimeError: boom"
    assert (frame["status"] == "ok").sum() == 5


def test_every_case_writes_a_loadable_snapshot(tmp_path):
    from memprobe.attribute import attribute
    from memprobe.snapshot import load_snapshot

    out = tmp_path / "run"
    frame = run_sweep(small_cases(), out)
    assert frame["snapshot"].notna().all()
    row = frame[(frame["kernel"] == "unchunked") & (frame["tokens"] == 2048)].iloc[0]
    snapshot = load_snapshot(out / row["snapshot"])
    findings = attribute(snapshot)
    fp32 = [f for f in findings.findings if f.live_at_peak and f.size == 2048 * 32768 * 4]
    assert len(fp32) == row["big_fp32_blocks"] == 3
    assert findings.peak_allocated_bytes == row["peak_bytes"]


def test_resumed_rows_keep_whole_numbers_whole(tmp_path):
    out = tmp_path / "run"
    cases = plan_cases(
        tokens=[1024], vocab=[16384], kernel=["local_chunked"], chunk_size=[None, 64], device="meta"
    )

    def stop_after_one(i, n, case, run):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(cases, out, progress=stop_after_one, verify=False)
    run_sweep([], out, resume=True, verify=False)
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["chunk_size"] for r in rows] == [None, 64]
    assert all(type(r["peak_bytes"]) is int and type(r["tokens"]) is int for r in rows)
