"""The pure search: the largest token count whose peak fits a limit, asked of any peak function.

For one kernel on one parallel layout, the peak of the logprob step (logits,
their gradient and everything the kernel allocates, per rank) is piecewise
linear in the tokens a rank holds: ``peak ≈ slope · tokens + fixed``, where the
slope is what every token costs (logits, gradient, float32 copies, saved
outputs) and the fixed term is what does not grow with the sequence (a chunk's
float32 workspace). Two cheap simulations at a few chunks give slope and fixed;
they predict the answer, and the exact peaks then check it: the answer is ``T``
only when ``T`` tokens fit and ``T + 1`` do not, and where the line is off a
bracketing search (regula falsi, then bisection) finds the true boundary.

A search is a generator that asks for token counts and receives their peaks:
it runs nothing itself, so one driver (:mod:`memprobe.plan.driver`) can run
many searches' simulations in a pool of processes.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

from memprobe.errors import UserError
from memprobe.plan.model import Line, PlanTarget, Search

# Far beyond any GPU (2^40 tokens): a search that gets there has a flat peak.
_MAX_TOKENS = 2**40
# Without a chunk size the seeds are taken at multiples of this many tokens.
_SEED_UNIT = 1024

Peaks = Mapping[int, int]
SearchSteps = Generator[list[int], Peaks, Search]


def seed_tokens(target: PlanTarget) -> tuple[int, int]:
    """Two small counts on the large-sequence piece of the line: whole chunks, several
    of them, so a chunk's workspace is already at full size in both."""
    unit = target.chunk_size or _SEED_UNIT
    return (2 * unit, 4 * unit)


def search_max_tokens(
    limit: int,
    seeds: tuple[int, int],
    *,
    below: int | None = None,
    line: Line | None = None,
    pairs: bool = True,
) -> SearchSteps:
    """Ask for peaks at token counts until ``T`` fits and ``T + 1`` does not; return ``T``.

    ``below`` is a count already known not to fit (the reserved search starts from
    the allocated answer); ``line`` a line known beforehand (then no seeds are asked
    for). Each step asks for a pair ``(g, g + 1)``: when the guess is right, one
    round of two simulations (run side by side in a pool) settles it, and where it is
    not, the pair's local slope makes the next guess. Without ``pairs`` (simulations
    run one after another) a bisecting step asks for ``g`` alone: its ``g + 1`` would
    cost a whole simulation and inform no guess, since bisection makes none.
    """
    peaks: dict[int, int] = {}
    lo, hi = 0, below  # lo fits (zero tokens allocate nothing); hi does not
    if line is None:
        got = yield [t for t in seeds]
        peaks.update(got)
        line = Line.through(*((t, peaks[t]) for t in seeds))
    predicted = line.tokens_within(limit)
    for t, p in peaks.items():
        lo, hi = narrow(lo, hi, t, p, limit)
    guess, down = predicted, 0
    while hi is None or hi - lo > 1:
        bisecting = guess is None or not (lo <= guess and (hi is None or guess < hi))
        if guess is None or bisecting:
            guess = bisect_bracket(lo, hi)
        probes = [t for t in (guess, guess + 1) if t > lo and (hi is None or t < hi)]
        probes = [t for t in probes if t not in peaks] or [bisect_bracket(lo, hi)]
        if bisecting and not pairs:
            probes = probes[:1]
        got = yield probes
        peaks.update(got)
        width = None if hi is None else hi - lo
        for t in probes:
            lo, hi = narrow(lo, hi, t, peaks[t], limit)
        # A guess must at least halve the bracket, or the next step bisects: the
        # search then never takes more rounds than bisection would, give or take one.
        halved = width is None or hi is None or 2 * (hi - lo) <= width
        if lo == 0 and hi is not None and hi in peaks:
            # Nothing fits yet (the reserved search, coming down from the allocated
            # answer): the seed line moved through the lowest count that failed says how
            # far down the limit is, usually within a segment's rounding. Each step
            # down is at least twice the last, so a long stretch just over the limit
            # takes a few counts, not one per token; past half the bracket, bisect.
            shifted = _shifted_guess(hi, peaks[hi], limit, line)
            down = max(hi - shifted, 2 * down) if shifted is not None else hi
            guess = hi - down if 2 * down <= hi else None
        else:
            guess = _model_guess(lo, hi, peaks, limit, line) if halved else None
    if hi not in peaks:  # the bracket came from ``below``: its own peak is still unknown
        got = yield [hi]
        peaks.update(got)
    assert hi is not None
    return Search(
        max_tokens=lo,
        peak_at_max=peaks.get(lo) if lo else None,
        peak_above=peaks[hi],
        line=line,
        predicted=predicted,
        simulations=len(peaks),
        points=tuple(sorted(peaks.items())),
    )


def narrow(lo: int, hi: int | None, tokens: int, peak: int, limit: int) -> tuple[int, int | None]:
    """The bracket ``(lo fits, hi does not)`` once ``tokens`` is known to peak at ``peak``."""
    if peak <= limit:
        return max(lo, tokens), hi
    return lo, tokens if hi is None else min(hi, tokens)


def bisect_bracket(lo: int, hi: int | None) -> int:
    """The middle of the bracket; twice ``lo`` while no count is known not to fit."""
    if hi is None:
        if lo >= _MAX_TOKENS:
            raise UserError(
                f"the peak stops growing with tokens beyond {lo:,}: no largest count exists",
                "this kernel's memory does not depend on the sequence length here",
            )
        return max(1, 2 * lo)
    return (lo + hi) // 2


def _shifted_guess(tokens: int, peak: int, limit: int, seed: Line) -> int | None:
    """The seed line's slope through a count that did not fit: where the limit is, if the
    excess at ``tokens`` shrinks as the seed line says."""
    return Line(seed.slope, peak - seed.slope * tokens).tokens_within(limit)


def _model_guess(
    lo: int, hi: int | None, peaks: Mapping[int, int], limit: int, seed: Line
) -> int | None:
    """Where the boundary should be: the local line through the last fitting pair
    (exact within one piece of the peak), else the line through both sides of the
    bracket (regula falsi), else the seed line."""
    if lo - 1 in peaks and lo > 1:
        local = Line.through((lo - 1, peaks[lo - 1]), (lo, peaks[lo])).tokens_within(limit)
        if local is not None and local >= lo and (hi is None or local < hi):
            return local
    if lo > 0 and hi is not None and hi in peaks:
        return Line.through((lo, peaks[lo]), (hi, peaks[hi])).tokens_within(limit)
    return seed.tokens_within(limit)
