"""``plan --step``'s search (memprobe.plan.step_search) finds what plain bisection finds:
on peaks shaped like a whole step's (the largest of a flat and a growing phase, jumps at
chunk boundaries, the allocator's staircase on top), with and without hints and a count
known not to fit; never more than twice bisection's simulations, give or take a few
(bisection is best when the answer lies far below the seeds)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from memprobe.plan.model import Line, Search
from memprobe.plan.step_search import Sample, StepSearch, search_step_tokens

Phases = Callable[[int], dict[str, int]]


def bisection(fits: Callable[[int], bool]) -> tuple[int, int]:
    """Plain bisection: double until a count does not fit, then halve the bracket.
    The answer and the counts it simulated."""
    lo, hi, asked = 0, 1, 0
    while True:
        asked += 1
        if not fits(hi):
            break
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        asked += 1
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, asked


def run(steps: StepSearch, sample: Callable[[int], Sample]) -> Search:
    try:
        t = next(steps)
        while True:
            t = steps.send(sample(t))
    except StopIteration as done:
        return done.value


def step_like(flat: int, slope: int, fixed: int, jump: int, chunk: int) -> Phases:
    """A flat optimizer phase and a backward that grows, with a jump every chunk."""
    return lambda t: {
        "optimizer": flat + t // 64,
        "backward": fixed + slope * t + jump * (t // chunk),
    }


def staircase(peak: int, step: int) -> int:
    return -(-peak // step) * step


@settings(max_examples=100, deadline=None)
@given(
    flat=st.integers(0, 10**9),
    slope=st.integers(1, 10**6),
    fixed=st.integers(0, 10**9),
    jump=st.integers(0, 10**6),
    chunk=st.integers(1, 5000),
    limit=st.integers(10**6, 10**10),
    step=st.sampled_from([1, 512, 2 * 2**20, 20 * 2**20]),
    hint=st.integers(0, 10**5),
    seeds=st.sampled_from([(64, 128), (2048, 4096)]),
)
def test_the_step_search_finds_what_bisection_finds(
    flat: int,
    slope: int,
    fixed: int,
    jump: int,
    chunk: int,
    limit: int,
    step: int,
    hint: int,
    seeds: tuple[int, int],
) -> None:
    phases = step_like(flat, slope, fixed, jump, chunk)

    def allocated(t: int) -> Sample:
        parts = phases(t)
        return max(parts.values()), parts

    def reserved(t: int) -> Sample:
        return staircase(max(phases(t).values()), step), {}

    want, plain = bisection(lambda t: allocated(t)[0] <= limit)
    known = {t: allocated(t) for t in seeds}
    line = Line.through(*((t, s[0]) for t, s in known.items()))
    periods = (chunk, 128)
    found = run(
        search_step_tokens(limit, known, line=line, hints=[hint], periods=periods), allocated
    )
    assert found.max_tokens == want
    assert found.simulations <= 2 * plain + 8
    # The reserved peak never falls below the allocated one: its search starts below
    # the allocated answer, from the samples the allocated search made.
    want_reserved, plain = bisection(lambda t: reserved(t)[0] <= limit)
    known = {t: reserved(t) for t, _ in found.points}
    gap = max(1, step // max(1, slope))
    on_reserved = run(
        search_step_tokens(
            limit, known, line=line, below=want + 1, hints=[hint], min_gap=gap, periods=periods
        ),
        reserved,
    )
    assert on_reserved.max_tokens == want_reserved
    assert on_reserved.simulations <= 2 * plain + 8


def test_a_right_hint_settles_the_search_in_two_steps() -> None:
    phases = step_like(flat=10**9, slope=1000, fixed=5 * 10**8, jump=0, chunk=1024)

    def allocated(t: int) -> Sample:
        parts = phases(t)
        return max(parts.values()), parts

    limit = 2 * 10**9
    want, _ = bisection(lambda t: allocated(t)[0] <= limit)
    known = {t: allocated(t) for t in (2048, 4096)}
    line = Line.through(*((t, s[0]) for t, s in known.items()))
    found = run(search_step_tokens(limit, known, line=line, hints=[want]), allocated)
    assert (found.max_tokens, found.simulations) == (want, 2)
