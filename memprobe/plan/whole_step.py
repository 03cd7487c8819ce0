"""``plan --step``: the most tokens per sequence whose whole simulated training step of a
Hugging Face model fits a budget, per kernel, with this package's search.

The step is :class:`memprobe.profile.hf.HFStep`, traced by
:func:`memprobe.profile.step.trace_hf_step`; the search is
:func:`memprobe.plan.search.search_max_tokens`, seeded as described in :func:`plan_step`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from memprobe.allocator import AllocConf
from memprobe.measure.reserved import modelled_reserved_peak
from memprobe.plan.model import (
    ALLOCATED,
    RESERVED,
    Budget,
    Line,
    OnProbe,
    PlanTarget,
    Probe,
    Search,
    TokenPlan,
)
from memprobe.plan.search import SearchSteps, search_max_tokens, seed_tokens
from memprobe.profile import hf
from memprobe.profile.step import trace_hf_step


def step_kernels() -> list[str]:
    """The shipped single-device kernels ``plan --step`` compares by default: every logits
    kernel, then the hidden family (each on the model's final hidden states)."""
    from memprobe.kernels.registry import kernel_names

    return [*kernel_names(distributed=False), *kernel_names(inputs="hidden")]


def plan_step(
    base: hf.HFStep,
    kernels: Sequence[str],
    budget: Budget,
    *,
    reserved: bool = True,
    alloc_conf: AllocConf | None = None,
    on_done: Callable[[TokenPlan], None] | None = None,
    on_probe: OnProbe | None = None,
) -> list[TokenPlan]:
    """The largest tokens per sequence whose whole simulated step fits ``budget`` (a
    :class:`memprobe.plan.Budget`), for ``base`` with each kernel: one
    :class:`memprobe.plan.TokenPlan` per kernel, found by the plan package's search
    (:func:`memprobe.plan.search_max_tokens`: allocated, then reserved below it).

    A whole step's peak is the largest of its phases' peaks, and at small token counts
    that is often the optimizer's, which does not grow with tokens: a line through the
    overall peaks would be flat. So the search is seeded with the line of the phase
    that reaches the limit first (each phase's peak is read from the same two seed
    traces). The reserved search starts from what the allocated one's traces say of
    reserved (each trace has both peaks): below the smallest count known not to fit, on
    the line through the reserved peaks either side of the limit (the allocated line
    shifted by the allocator's overhead only when none fits). Each token count is traced
    once; ``on_probe`` hears of each trace (its allocated peak, and its reserved one with
    ``reserved``) as it is made."""
    plans = []
    for kernel in kernels:
        step = replace(base, kernel=kernel)
        target = PlanTarget(
            kernel,
            vocab=base.vocab,
            batch=base.batch,
            dtype=base.dtype,
            chunk_size=base.chunk_size,
            hidden=base.hidden_size if step.hidden_route else None,
        )
        peaks = _StepPeaks(step, reserved, alloc_conf, _told(on_probe, target, budget))
        seeds = seed_tokens(target)
        line = peaks.limiting_line(seeds, budget.limit_bytes)
        allocated = peaks.search(
            search_max_tokens(budget.limit_bytes, seeds, line=line), reserved=False
        )
        on_reserved = None
        if reserved:
            below, reserved_line = peaks.reserved_start(allocated, line, budget.limit_bytes)
            on_reserved = peaks.search(
                search_max_tokens(budget.limit_bytes, seeds, below=below, line=reserved_line),
                reserved=True,
            )
        plan = TokenPlan(target, budget, peaks.with_seeds(allocated, seeds), on_reserved)
        plans.append(plan)
        if on_done is not None:
            on_done(plan)
    return plans


def _told(
    on_probe: OnProbe | None, target: PlanTarget, budget: Budget
) -> Callable[[int, int, int | None], None]:
    """What a trace at ``tokens`` tells ``on_probe``: its allocated peak, then its reserved."""

    def tell(tokens: int, allocated: int, on_reserved: int | None) -> None:
        if on_probe is None:
            return
        on_probe(Probe(target, ALLOCATED, tokens, allocated, budget.limit_bytes))
        if on_reserved is not None:
            on_probe(Probe(target, RESERVED, tokens, on_reserved, budget.limit_bytes))

    return tell


class _StepPeaks:
    """One kernel's whole-step traces by token count: allocated, reserved, phase peaks."""

    def __init__(
        self,
        step: hf.HFStep,
        reserved: bool,
        conf: AllocConf | None,
        tell: Callable[[int, int, int | None], None] = lambda *_: None,
    ) -> None:
        self.step, self.reserved, self.conf, self.tell = step, reserved, conf, tell
        self.traced: dict[int, tuple[int, int, dict[str, int]]] = {}

    def at(self, tokens: int) -> tuple[int, int, dict[str, int]]:
        if tokens not in self.traced:
            tracked, _ = trace_hf_step(replace(self.step, tokens=tokens))
            on_reserved = modelled_reserved_peak(tracked.events, self.conf) if self.reserved else 0
            self.traced[tokens] = (tracked.peak_bytes, on_reserved, dict(tracked.phase_peaks))
            self.tell(tokens, tracked.peak_bytes, on_reserved if self.reserved else None)
        return self.traced[tokens]

    def limiting_line(self, seeds: tuple[int, int], limit: int) -> Line:
        """The line through the seeds of the phase whose peak reaches ``limit`` first."""
        a, b = (self.at(t) for t in seeds)
        best = Line.through((seeds[0], a[0]), (seeds[1], b[0]))
        best_tokens = best.tokens_within(limit)
        for phase in a[2].keys() & b[2].keys():
            line = Line.through((seeds[0], a[2][phase]), (seeds[1], b[2][phase]))
            tokens = line.tokens_within(limit)
            if tokens is not None and (best_tokens is None or tokens < best_tokens):
                best, best_tokens = line, tokens
        return best

    def reserved_start(self, allocated: Search, line: Line, limit: int) -> tuple[int, Line]:
        """Where the reserved search starts, from the traces the allocated one made (each
        has its reserved peak too): below the smallest count known not to fit, on the line
        through the reserved peaks either side of the limit. Without a fitting one, the
        allocated line shifted by the allocator's overhead at the allocated answer."""
        known = {t: self.peak(t, reserved=True) for t in self.traced}
        over = [t for t, p in known.items() if p > limit and t <= allocated.max_tokens + 1]
        below = min(over, default=allocated.max_tokens + 1)
        fitting = [t for t, p in known.items() if p <= limit and t < below]
        if fitting and below in known:
            lo = max(fitting)
            return below, Line.through((lo, known[lo]), (below, known[below]))
        overhead = self.overhead(allocated.max_tokens)
        return below, Line(line.slope, line.fixed + overhead)

    def overhead(self, tokens: int) -> int:
        """Reserved minus allocated at ``tokens`` (0 when nothing fits)."""
        if tokens <= 0:
            return 0
        allocated, on_reserved, _ = self.at(tokens)
        return on_reserved - allocated

    def peak(self, tokens: int, *, reserved: bool) -> int:
        allocated, on_reserved, _ = self.at(tokens)
        return on_reserved if reserved else allocated

    def search(self, steps: SearchSteps, *, reserved: bool) -> Search:
        try:
            ask = next(steps)
            while True:
                ask = steps.send({t: self.peak(t, reserved=reserved) for t in ask})
        except StopIteration as done:
            return done.value

    def with_seeds(self, search: Search, seeds: tuple[int, int]) -> Search:
        """The search's record, counting the seed traces it was given as a line."""
        points = dict(search.points)
        extra = {t: self.at(t)[0] for t in seeds if t not in points}
        merged = tuple(sorted({**points, **extra}.items()))
        return replace(search, simulations=search.simulations + len(extra), points=merged)
