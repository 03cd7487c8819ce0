"""The search ``plan --step`` runs: the largest token count whose whole simulated training
step fits a limit, asking for one whole step at a time.

:func:`memprobe.plan.search.search_max_tokens` serves the logprob step alone, whose
simulations are cheap and run in pairs in a pool, and whose peak is one line per piece.
A whole step costs a second or more to simulate, one at a time, and its peaks have
other shapes: the allocated peak is the largest of the phases' peaks (a flat optimizer
phase, then a backward that grows with tokens: a kink no line through two points
sees), and the reserved peak is a staircase (the allocator's 2 MiB rounding) on such a
kink. So this search asks for one count at a time, and guesses:

* from each part of the peak separately (the phases' peaks): the step fits while every
  phase fits, so the boundary is the smallest of the phases' own crossings;
* for each part, on the line through its two most local samples: a pair on one side
  of the limit (two neighbouring counts give a piece's slope exactly; the growing side
  of a kink is one line) or the chord across it, whichever reaches least far; after
  guesses in a row on one side of the limit, the chord is bent towards the other end
  (the Illinois rule: a kink's chord otherwise creeps along its flat side);
* first at ``hints`` (other kernels' boundaries: the model's part of the step is the
  same for every kernel and often decides), each as the pair ``h``, ``h + 1``;
* when the model's guess was right, at the count next to it (the answer's neighbour);
* when the model contradicts the bracket (the peak jumps inside it), at the whole
  number of ``periods`` nearest its guess, then the count after (a chunked loop takes
  another turn just after a whole number of chunks);
* by bisection when two guesses in a row have not halved the bracket, and only by
  bisection once that has happened twice.

The guesses only decide which counts are simulated: the search stops when ``T`` fits
and ``T + 1`` does not, both simulated, so for a peak that grows with tokens the answer
is the one plain bisection finds (``tests/plan/test_step_search.py``). (The modelled
reserved peak need not grow everywhere: fragmentation can make it a little lower at a
larger count. Where it falls back under the limit above a boundary, there is more than
one ``T`` that fits with ``T + 1`` not, and two searches may end at different ones.)
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence

from memprobe.plan.model import Line, Search
from memprobe.plan.search import bisect_bracket, narrow

# A simulated count: its peak and the parts the peak is the largest of (phase -> peak;
# empty when the peak is not split).
Sample = tuple[int, Mapping[str, int]]
StepSearch = Generator[int, Sample, Search]
# Counts in a row that may leave the bracket wider than half of what it was (as widths
# after each: the last and the one this many back).
_PATIENCE = 3
# Stalls after which the search only bisects.
_STRIKES = 2
# While nothing is known not to fit, a guess goes at most this many times beyond the
# largest count simulated.
_REACH = 32


def search_step_tokens(
    limit: int,
    known: Mapping[int, Sample],
    *,
    line: Line,
    below: int | None = None,
    hints: Sequence[int] = (),
    min_gap: int = 1,
    periods: Sequence[int] = (),
) -> StepSearch:
    """Ask for samples one count at a time until ``T`` fits ``limit`` and ``T + 1`` does
    not; return the :class:`~memprobe.plan.model.Search` (``simulations``: the counts it
    asked for; ``points``: every sample it used, ``known`` included).

    ``known``: samples already simulated (the seeds; for the reserved search, the
    allocated search's steps). ``line``: the line the plan reports (its ``predicted``).
    ``below``: a count known not to fit. ``min_gap``: how far apart two samples over
    the limit must be to give a slope (1 for an exact piecewise-affine peak; more for a
    staircase, whose neighbouring counts give a slope of 0 or a whole step).
    ``periods``: token counts at whose multiples the peak may jump (a chunk size).
    """
    samples = dict(known)
    lo, hi = 0, below
    for t, (peak, _) in samples.items():
        lo, hi = narrow(lo, hi, t, peak, limit)
    pending = [t for h in hints for t in (h, h + 1)]
    widths: list[int] = []
    strikes = 0  # times the model stalled
    side = 0  # model guesses in a row that fit (+) or did not (-)
    last = ""  # how the last count was chosen: hint, model, step, period or bisect
    asked = 0
    while hi is None or hi - lo > 1:
        guess, how = _next_hint(pending, lo, hi, samples), "hint"
        if guess is None:
            # (A step next to the model's guess finishes that guess: not a stall.)
            stalled = hi is not None and len(widths) >= _PATIENCE and last != "step"
            stalled = stalled and 2 * widths[-1] > widths[-_PATIENCE]
            strikes += 1 if stalled else 0
            # A model that stalled this often does not fit this peak: bisect from here.
            stalled = stalled or strikes >= _STRIKES
            model = None if stalled else crossing(samples, limit, min_gap, side)
            if model is not None and hi is None:
                # Nothing over the limit yet: a nearly flat part's line may say millions
                # of tokens (and a chunked kernel's step grows with them); go at most
                # this far beyond what was simulated.
                model = min(model, _REACH * max(samples, default=1))
            guess, how = _choose(model, lo, hi, last, periods, samples)
        samples[guess] = yield guess
        asked += 1
        last = how
        fits = samples[guess][0] <= limit
        lo, hi = narrow(lo, hi, guess, samples[guess][0], limit)
        # Model guesses landing on one side in a row: the line is bent (a kink).
        sign = 1 if fits else -1
        side = 0 if how != "model" else side + sign if side * sign > 0 else sign
        if hi is not None:
            widths.append(hi - lo)
    if hi not in samples:  # the bracket came from ``below``: its own peak is still unknown
        samples[hi] = yield hi
        asked += 1
    return Search(
        max_tokens=lo,
        peak_at_max=samples[lo][0] if lo else None,
        peak_above=samples[hi][0],
        line=line,
        predicted=line.tokens_within(limit),
        simulations=asked,
        points=tuple(sorted((t, s[0]) for t, s in samples.items())),
    )


def _next_hint(
    pending: list[int], lo: int, hi: int | None, samples: Mapping[int, Sample]
) -> int | None:
    while pending:
        t = pending.pop(0)
        if lo < t and (hi is None or t < hi) and t not in samples:
            return t
    return None


def _choose(
    model: int | None,
    lo: int,
    hi: int | None,
    last: str,
    periods: Sequence[int],
    samples: Mapping[int, Sample],
) -> tuple[int, str]:
    """The count to ask for, strictly inside ``(lo, hi)``, and how it was chosen."""
    if model is not None and lo < model and (hi is None or model < hi):
        return model, "model"
    if model is not None and last == "model":
        # The model's own guess was the answer it gives again (it fits: ask one above)
        # or one too many (it does not: ask one below); once, then other ways.
        step = lo + 1 if model <= lo else hi - 1 if hi is not None else lo + 1
        if lo < step and (hi is None or step < hi):
            return step, "step"
    if lo == 0 and (model is None or model <= 0) and 1 not in samples:
        return 1, "bisect"  # perhaps nothing fits: one count says so
    if last == "period" and any(lo % p == 0 for p in periods) and lo + 1 != hi:
        return lo + 1, "step"  # a whole number of periods fits: the jump may be next
    # The model contradicts the bracket: the peak jumps in it. Jumps come where a loop
    # takes another turn: after a whole number of chunks. Once, at the one nearest
    # what the model says (its line holds up to there), then other ways.
    if hi is not None and model is not None and last != "period":
        for period in periods:
            edge = min(max(round(model / period), lo // period + 1), (hi - 1) // period)
            if lo < edge * period < hi and edge * period not in samples:
                return edge * period, "period"
    return bisect_bracket(lo, hi), "bisect"


def crossing(
    samples: Mapping[int, Sample], limit: int, min_gap: int = 1, side: int = 0
) -> int | None:
    """The largest count the samples put within ``limit``: the smallest of the parts'
    crossings when every sample's peak is the largest of its parts, else the peak's own
    (None when no part grows)."""
    split = bool(samples) and all(
        parts and max(parts.values()) == peak for peak, parts in samples.values()
    )
    keys: list[str | None] = [None]
    if split:
        common = set.intersection(*(set(parts) for _, parts in samples.values()))
        keys = [*sorted(common)]
    found = [
        _series_crossing(
            {t: (s[0] if key is None else s[1][key]) for t, s in samples.items()},
            limit,
            min_gap,
            side,
        )
        for key in keys
    ]
    return min((c for c in found if c is not None), default=None)


def _series_crossing(
    series: Mapping[int, int], limit: int, min_gap: int, side: int = 0
) -> int | None:
    """Where one series crosses ``limit``, on the line through the two samples that
    reach least far to it: the chord across it, or a pair on one side of it (at least
    ``min_gap`` apart; a pair of neighbouring counts has a piece's exact slope, but
    misses the jumps between it and a far crossing, which the chord averages in)."""
    over = sorted(t for t, v in series.items() if v > limit)
    under = sorted(t for t, v in series.items() if v <= limit)
    pairs: list[tuple[int, int]] = []
    if over and under:
        pairs.append((under[-1], over[0]))
    behind = [t for t in under if t <= under[-1] - min_gap] if under else []
    if behind:
        pairs.append((behind[-1], under[-1]))
    beyond = [t for t in over if t >= over[0] + min_gap] if over else []
    if beyond:
        pairs.append((over[0], beyond[0]))
    found: list[tuple[int, int]] = []  # (how far the line reaches, its crossing)
    for a, b in pairs:
        below, above = limit - series[a], series[b] - limit  # below >= 0 on a chord
        if over and under and (a, b) == (under[-1], over[0]) and abs(side) >= 2:
            # Illinois: after guesses in a row on one side, the end kept (k times)
            # counts 1/2^(k-1) as far from the limit, so the next guess reaches it.
            scale = 2 ** (abs(side) - 1)
            below, above = (below * scale, above) if side > 0 else (below, above * scale)
        rise = below + above
        if rise > 0:
            # The largest t with series[a] + rise / (b - a) * (t - a) <= limit, in integers.
            at = max(0, a + below * (b - a) // rise)
            found.append((max(abs(at - a), abs(at - b)), at))
    return min(found)[1] if found else None
