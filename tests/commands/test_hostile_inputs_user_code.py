"""Hostile inputs, round 4: user code that exits or fails at call time, work a command does
before it notices a bad output, budgets of nothing, and asks that would fork or loop
without end. Each row is one line and exit 2 (or, in a sweep, the case's error row).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memprobe.errors import UserError
from memprobe.measure.loops import MAX_SIMULATED_CHUNKS
from memprobe.plan.driver import pool_size
from memprobe.sweep import MAX_CASES, plan_cases

KERNELS = {
    "exits": "import sys\ndef k(logits, targets, *, chunk_size=None):\n    sys.exit(3)\n",
    "raises": "def k(logits, targets, *, chunk_size=None):\n    raise RuntimeError('boom')\n",
}


@pytest.fixture
def user_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(body: str) -> str:
        name = f"hostile_kernel_{abs(hash(body)) % 10**8}"
        (tmp_path / f"{name}.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        return f"{name}:k"

    monkeypatch.chdir(tmp_path)
    return make


@pytest.mark.parametrize("what", sorted(KERNELS))
@pytest.mark.parametrize(
    "command",
    [
        ["plan", "--vocab", "256", "--budget", "1GiB"],
        ["plan", "--vocab", "256", "--budget", "1GiB", "--jobs", "2"],
    ],
)
def test_a_user_kernel_failing_in_a_plan_is_one_line(run_cli, user_kernel, what, command) -> None:
    kernel = user_kernel(KERNELS[what])
    code, out, err = run_cli(*command, "--kernel", f"{kernel},unchunked")
    assert code == 2 and not out, err
    (line,) = err.strip().splitlines()
    assert f"{kernel} failed in the meta simulation at " in line and "Traceback" not in err
    assert ("sys.exit(3)" in line) == (what == "exits")


@pytest.mark.parametrize("what", sorted(KERNELS))
def test_a_user_kernel_failing_in_a_what_if_is_one_line(
    run_cli, user_kernel, what, tmp_path: Path
) -> None:
    from memprobe.measure import measure
    from memprobe.records import Case
    from memprobe.snapshot import synthesize_snapshot, write_snapshot

    case = Case("unchunked", 1, 64, 256, device="meta")
    snapshot = write_snapshot(synthesize_snapshot(measure(case).events, case=case), tmp_path / "s")
    kernel = user_kernel(KERNELS[what])
    code, _, err = run_cli("attribute", str(snapshot), "--what-if", kernel)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{kernel} failed in the meta simulation" in err


def test_a_sweep_records_a_kernels_exit_as_its_error(run_cli, user_kernel, tmp_path) -> None:
    kernel = user_kernel(KERNELS["exits"])
    flags = ["--tokens", "64", "--vocab", "256", "--no-ladder", "-q", "--device", "meta"]
    code, _, err = run_cli(
        "sweep", "--no-report", *flags, "--no-verify", "--kernel", kernel, "--out", "o"
    )
    assert code == 0, err
    (row,) = json.loads((tmp_path / "o" / "results.json").read_text())["rows"]
    assert row["status"] == "error" and "called sys.exit(3) instead of returning" in row["note"]


STEPS = {
    "sys.exit(5)": ("import sys\ndef step(device):\n    sys.exit(5)\n", "called sys.exit(5)"),
    "sys.exit()": ("import sys\ndef step(device):\n    sys.exit()\n", "called sys.exit(None)"),
    "raise SystemExit('x')": ("def step(device):\n    raise SystemExit('x')\n", "sys.exit('x')"),
    "a generator": ("def step(device):\n    yield 1\n", "is a generator or async function"),
    "async": ("async def step(device):\n    pass\n", "is a generator or async function"),
    "an async generator": ("async def step(device):\n    yield 1\n", "generator or async"),
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_step_that_exits_or_never_runs_is_one_line(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    body, expected = STEPS[name]
    module = f"hostile_step_{sorted(STEPS).index(name)}"
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("profile", f"{module}:step", "--out", "p.pickle")
    assert code == 2 and not out, err
    assert len(err.strip().splitlines()) == 1 and expected in err
    assert not (tmp_path / "p.pickle").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "--vocab", "1024", "--budget", "0"],
        ["plan", "--vocab", "1024", "--budget", "0 GiB"],
        ["plan", "--step", "--config", "c.json", "--budget", "0"],
        ["step", "--config", "c.json", "--tokens", "64", "--budget", "0B"],
        ["sweep", "--tokens", "64", "--vocab", "256", "--budget", "0KiB"],
        ["attribute", "s.pickle", "--what-if", "local_chunked", "--budget", "0"],
    ],
)
def test_a_zero_budget_is_refused_alike(run_cli, args: list[str]) -> None:
    code, _, err = run_cli(*args)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "must be more than 0 bytes" in err


@pytest.mark.parametrize(
    ("out", "says"),
    [
        ("f.txt", "--out f.txt is a file, not a folder"),
        ("f.txt/plans", "--out f.txt/plans is under f.txt, a file, not a folder"),
        ("f.txt/a/b", "is under f.txt, a file"),
    ],
)
def test_plan_refuses_its_out_before_any_simulation(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.txt").write_text("mine")
    code, out_text, err = run_cli("plan", "--vocab", "1024", "--budget", "1GiB", "--out", out)
    # Nothing ran: no per-plan progress line precedes the error.
    assert code == 2 and not out_text and err.strip().splitlines() == [err.strip()], err
    assert says in err and (tmp_path / "f.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("jobs", "targets", "cores", "expected"),
    [
        (100_000, 1, 2, 2),  # was a fork of 100,000 processes (a forking pool starts all)
        (100_000, 9, 64, 18),  # never more than the probes in flight (2 per plan)
        (8, 9, 2, 2),  # never more than the cores here
        (1, 9, 64, 1),
        (3, 9, None, 1),  # cores unknown: in order
    ],
)
def test_plan_jobs_fork_no_more_than_can_run(
    monkeypatch: pytest.MonkeyPatch, jobs: int, targets: int, cores: int | None, expected: int
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    assert pool_size(jobs, targets) == expected


@pytest.mark.parametrize(
    "grid",
    [
        {"tokens": list(range(64, 64 * 301, 64)), "vocab": list(range(256, 256 * 301, 256))},
        {"tokens": list(range(1, 2001)), "vocab": [256], "kernel": ["local_chunked"],
         "chunk_size": list(range(1, 11))},
    ],
)  # fmt: skip
def test_a_sweep_past_the_case_cap_is_refused_before_listing(grid: dict[str, Any]) -> None:
    with pytest.raises(UserError, match=f"one run takes at most {MAX_CASES:,}"):
        plan_cases(**grid, device="meta", ladder=False, grid=True)


@pytest.fixture(autouse=True)
def _inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files the budget rows name: a config and a snapshot that exist (the budget is
    refused before either is read), in a folder of this test's own."""
    (tmp_path / "c.json").write_text("{}")
    (tmp_path / "s.pickle").write_bytes(b"")
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(
    ("parameters", "shown"),
    [(69_888, "69,888"), (999_999, "999,999"), (1_000_000, "1.00M"), (124_439_808, "124.44M"),
     (8_030_261_248, "8.03B"), (1_280_000_000_000, "1,280.00B")],
)  # fmt: skip
def test_a_toy_models_parameters_are_not_zero_billion(parameters: int, shown: str) -> None:
    from memprobe.commands.step import _count

    assert _count(parameters) == shown


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\x80\x02Pabc\n.", "it references a persistent object (an id the loader is to resolve)"),
        (b"\x80\x04cos\nsystem\n.", "it references the Python object os.system,"),
        (b"\x80\x04]K\x01a.", "it holds a list of 1 item ("),
    ],
)
def test_refusals_read_as_sentences(tmp_path: Path, data: bytes, says: str) -> None:
    from memprobe.snapshot.load import load_snapshot

    (tmp_path / "x.pickle").write_bytes(data)
    with pytest.raises(UserError) as caught:
        load_snapshot(tmp_path / "x.pickle")
    assert says in caught.value.one_line()


def _threaded_step(threads: int, fail: bool = False) -> Any:
    import threading

    import torch

    def step(device: Any) -> None:
        torch.ones(8, device=device)
        for _ in range(threads):
            worker = threading.Thread(target=lambda: torch.ones(1000, device=device))
            worker.start()
            worker.join()
        if fail:
            raise ValueError("after the threads")

    return step


@pytest.mark.parametrize(("threads", "note"), [(0, None), (1, "started 1 thread(s)"),
                                                (3, "started 3 thread(s)")])  # fmt: skip
def test_a_step_that_starts_threads_says_their_memory_is_missing(threads, note) -> None:
    import threading

    from memprobe.attribute import attribute
    from memprobe.profile import profile_step

    start = threading.Thread.start
    notes = attribute(profile_step(_threaded_step(threads), "meta")).notes
    said = [n for n in notes if "thread(s): memory allocated on them is not in this trace" in n]
    assert [note in n for n in said] == ([True] if note else [])
    assert threading.Thread.start is start  # put back
    with pytest.raises(UserError, match="after the threads"):
        profile_step(_threaded_step(threads, fail=True), "meta")
    assert threading.Thread.start is start


@pytest.mark.parametrize(
    ("kernel", "tokens", "chunk", "device", "skipped"),
    [
        ("naive_chunked", 2**40, 1024, "meta", True),  # 2^30 chunks: a sweep never ended
        ("precast_chunked", MAX_SIMULATED_CHUNKS * 1024 + 1, 1024, "meta", True),
        ("naive_chunked", MAX_SIMULATED_CHUNKS * 1024, 1024, "meta", False),  # at the limit
        ("naive_chunked", 2**40, 1024, "cpu", True),  # cpu simulates on meta first
        ("naive_chunked", 2**40, 1024, "cuda", False),  # runs for real (and OOMs)
        ("local_chunked", 2**40, 1024, "meta", False),  # skips its middle chunks on meta
    ],
)
def test_a_loop_simulated_chunk_by_chunk_is_bounded(kernel, tokens, chunk, device, skipped):
    from memprobe.measure.loops import too_long_to_simulate
    from memprobe.records import Case

    why = too_long_to_simulate(Case(kernel, 1, tokens, 256, chunk_size=chunk, device=device))
    assert (why is not None) == skipped
    assert why is None or f"{-(-tokens // chunk):,} chunks" in why


def test_a_sweep_to_2_to_the_40_tokens_ends(run_cli, tmp_path: Path) -> None:
    code, _, err = run_cli("sweep", "--no-report",
                           "--tokens", str(2**40), "--vocab", "256", "--no-ladder",
                           "--kernel", "naive_chunked,local_chunked", "--device", "meta",
                           "--no-verify", "-q", "--out", "o")  # fmt: skip
    assert code == 0, err
    rows = json.loads((tmp_path / "o" / "results.json").read_text())["rows"]
    assert [(r["kernel"], r["status"]) for r in rows] == [
        ("naive_chunked", "skipped"), ("local_chunked", "ok")]  # fmt: skip
