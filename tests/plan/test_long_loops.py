"""The naive chunk loops' allocated peak, extrapolated from two short runs, equals the full
simulation; and a plan of such a loop at chunk 1 finishes, without a reserved answer."""

from __future__ import annotations

import pytest

from memprobe.measure.meta_backend import simulate_tracker
from memprobe.plan import long_loops
from memprobe.plan.driver import simulated_peak
from memprobe.plan.job import PlanRequest, run_plan_job
from memprobe.records import Case


def _full(case: Case) -> int:
    return simulate_tracker(case, capture_frames=False).peak_bytes


# (kernel, batch, vocab, dtype, chunk, last chunk's width, cp): both loops, full and
# ragged last chunks, a chunk of one token, fp32 logits (precast's copy is then free)
# and a context-parallel rank.
CASES = [
    ("naive_chunked", 1, 131072, "bf16", 1024, 1024, 1),
    ("naive_chunked", 2, 151936, "fp16", 1000, 7, 1),
    ("naive_chunked", 1, 50, "fp32", 1, 1, 2),
    ("precast_chunked", 3, 4096, "bf16", 64, 33, 1),
]


@pytest.mark.parametrize(("kernel", "batch", "vocab", "dtype", "chunk", "last", "cp"), CASES)
def test_extrapolated_peak_equals_the_full_simulation(
    monkeypatch: pytest.MonkeyPatch,
    kernel: str,
    batch: int,
    vocab: int,
    dtype: str,
    chunk: int,
    last: int,
    cp: int,
) -> None:
    # Extrapolate from the first count past the base runs, so the short chunk counts
    # below the default cut are checked too.
    monkeypatch.setattr(long_loops, "FULL_CHUNKS", long_loops.BASE_CHUNKS + 1)
    runs: list[int] = []

    def counted(case: Case) -> int:
        runs.append(long_loops.chunk_count(case))
        return _full(case)

    for chunks in (long_loops.BASE_CHUNKS + 2, 17):
        tokens = ((chunks - 1) * chunk + last) * cp
        case = Case(kernel, batch, tokens, vocab, dtype, chunk, cp=cp, device="meta")
        assert long_loops.chunk_count(case) == chunks
        runs.clear()
        assert long_loops.allocated_peak(case, counted) == _full(case)
        # It really extrapolated: only the two base runs were simulated.
        assert runs == [long_loops.BASE_CHUNKS, long_loops.BASE_CHUNKS + 1]


def test_other_kernels_and_short_loops_are_simulated_as_they_are() -> None:
    seen: list[Case] = []
    for case in (
        Case("local_chunked", 1, 10_000, 64, "bf16", 1, device="meta"),
        Case("naive_chunked", 1, 10, 64, "bf16", 1, device="meta"),
        Case("naive_chunked", 1, 10_000, 64, "bf16", None, device="meta"),
    ):
        long_loops.allocated_peak(case, lambda c: seen.append(c) or 0)
    assert len(seen) == 3 and all(c.tokens in (10, 10_000) for c in seen)


def test_a_long_chunk_1_loop_is_planned_in_a_few_runs_and_left_off_reserved() -> None:
    # 40,000 chunks of one token: the full simulation would take minutes.
    case = Case("naive_chunked", 1, 40_000, 64, "bf16", 1, device="meta")
    ninth = Case("naive_chunked", 1, 9, 64, "bf16", 1, device="meta")
    eighth = Case("naive_chunked", 1, 8, 64, "bf16", 1, device="meta")
    assert simulated_peak(case) == _full(eighth) + (40_000 - 8) * (_full(ninth) - _full(eighth))

    out = run_plan_job(
        PlanRequest(
            vocab=64,
            budget="4MiB",
            kernels=("naive_chunked",),
            chunk_sizes=(1, 1024),
            reserved=True,
        )
    )
    by_chunk = {p.target.chunk_size: p for p in out.plans}
    assert by_chunk[1].allocated.max_tokens > long_loops.RESERVED_MAX_CHUNKS
    assert by_chunk[1].reserved is None
    assert by_chunk[1024].reserved is not None  # one chunk: planned as before
    (note,) = [n for n in out.notes if "not planned for" in n]
    assert "naive_chunked (chunk 1)" in note and "chunk 1024" not in note
