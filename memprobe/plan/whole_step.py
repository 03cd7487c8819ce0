"""``plan --step``: the most tokens per sequence whose whole simulated training step of a
Hugging Face model fits a budget, per kernel, with this package's search.

The step is :class:`memprobe.profile.hf.HFStep`, traced by
:func:`memprobe.profile.step.trace_hf_step`; the search is
:func:`memprobe.plan.step_search.search_step_tokens`, seeded as described in
:func:`plan_step`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from memprobe.allocator import AllocConf
from memprobe.errors import UserError
from memprobe.io.text import exception_text
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
from memprobe.plan.search import seed_tokens
from memprobe.plan.step_search import Sample, StepSearch, search_step_tokens
from memprobe.profile import hf
from memprobe.profile.step import trace_hf_step


def step_kernels(*, vocab_parallel: bool = False, hidden: bool = True) -> list[str]:
    """The shipped kernels ``plan --step`` compares by default: every single-device logits
    kernel, then the hidden family (each on the model's final hidden states; not with
    ``hidden=False``: under FSDP2, which cannot simulate it); under tensor parallel
    (``vocab_parallel``: the lm_head's logits sharded on the vocabulary), the
    vocabulary-parallel ones."""
    from memprobe.kernels.registry import kernel_names

    if vocab_parallel:
        return kernel_names(distributed=True)
    return [*kernel_names(distributed=False), *(kernel_names(inputs="hidden") if hidden else [])]


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
    :class:`memprobe.plan.TokenPlan` per kernel, found by
    :func:`memprobe.plan.step_search.search_step_tokens` on the allocated peak, then on
    the reserved one below it.

    Each kernel's search starts from two seed steps (whole chunks, as the plan package
    seeds) and guesses from each phase's peak (see the search). The reserved search
    starts from every step the allocated one simulated (each has both peaks). Where an
    earlier kernel's answer lies near what a kernel's first guess says, the search asks
    there first: the model's part of the step is the same for every kernel, and where
    it decides the peak the boundary is the same; the reserved search likewise asks
    first at the reserved answer of the earlier kernel whose allocated answer is within
    2% of this one's. Each token count is simulated once per kernel; where the peak
    grows with tokens, the answers do not depend on the guesses. ``on_probe`` hears of each
    trace (its allocated peak, and its reserved one with ``reserved``) as it is made."""
    plans = []
    answers: dict[int, int] = {}  # earlier kernels' answers: allocated -> reserved
    limit = budget.limit_bytes
    # A model with a table of positions (GPT-2's) runs no longer sequence: where the
    # whole table fits, that is the answer, and the search past it is never made.
    try:
        positions = base.learned_positions()
    except RuntimeError as exc:
        # This build is untracked (before any step): a size torch cannot hold (a weight
        # of hidden_size² elements past int64) fails here as it fails `step`'s traced one.
        # Its hint is not the step's ("cannot run this op"): no op of the step ran yet.
        raise UserError(
            f"the model failed to build on meta ({exception_text(exc)})",
            "check the config's sizes: torch cannot make a model of them "
            "(e.g. a weight of more than 2^63 bytes)",
        ) from None
    for kernel in kernels:
        # The search probes counts on either side of its answer: one past the positions
        # a model learned is a count that does not run, not a plan that cannot be made.
        step = replace(base, kernel=kernel, check_positions=False)
        target = PlanTarget(
            kernel,
            vocab=base.vocab,
            batch=base.batch,
            dtype=base.dtype,
            chunk_size=base.chunk_size,
            tp=base.vocab_shards,
            hidden=base.hidden_size if step.hidden_route else None,
        )
        peaks = _StepPeaks(step, reserved, alloc_conf, _told(on_probe, target, budget))
        seeds = seed_tokens(target)
        line = peaks.limiting_line(seeds, limit)
        known = peaks.samples(reserved=False)
        hints = _near(list(answers), line.tokens_within(limit))
        periods = _jump_periods(step)
        if positions is not None and peaks.at(positions)[0] <= limit:
            allocated = _whole_table(peaks, positions, line, limit, reserved=False)
        else:
            allocated = peaks.search(
                search_step_tokens(limit, known, line=line, hints=hints, periods=periods),
                reserved=False,
            )
            allocated = replace(allocated, simulations=allocated.simulations + len(seeds))
            allocated = _within(allocated, positions, peaks, reserved=False)
        on_reserved = None
        if reserved and positions is not None and peaks.at(positions)[1] <= limit:
            on_reserved = _whole_table(peaks, positions, line, limit, reserved=True)
        elif reserved:
            known = peaks.samples(reserved=True)
            if positions is not None:  # counts past the table are not the answer's evidence
                known = {t: s for t, s in known.items() if t <= positions}
            gap = _staircase_gap(line)
            # Where an earlier kernel's allocated answer was near this one's, the same
            # part of the step decided both, and its reserved answer likely holds too.
            near = _near(list(answers), allocated.max_tokens, _SAME_PART)
            hints = [answers[a] for a in near]
            shifted = Line(line.slope, line.fixed + peaks.overhead(allocated.max_tokens))
            on_reserved = peaks.search(
                search_step_tokens(
                    limit,
                    known,
                    line=shifted,
                    below=allocated.max_tokens + 1,
                    hints=hints,
                    min_gap=gap,
                    periods=periods,
                ),
                reserved=True,
            )
            on_reserved = _within(on_reserved, positions, peaks, reserved=True)
        answers.setdefault(allocated.max_tokens, on_reserved.max_tokens if on_reserved else 0)
        plan = TokenPlan(target, budget, allocated, on_reserved)
        plans.append(plan)
        if on_done is not None:
            on_done(plan)
    return plans


def _whole_table(
    peaks: _StepPeaks, positions: int, line: Line, limit: int, *, reserved: bool
) -> Search:
    """The answer when a sequence of all ``positions`` the model learned fits: that many
    tokens, and no count above (none runs: a real step indexes past the table)."""
    return Search(
        max_tokens=positions,
        peak_at_max=peaks.sample(positions, reserved=reserved)[0],
        peak_above=None,
        line=line,
        predicted=line.tokens_within(limit),
        simulations=len(peaks.traced),
        points=tuple(sorted((t, s[0]) for t, s in peaks.samples(reserved=reserved).items())),
    )


def _within(search: Search, positions: int | None, peaks: _StepPeaks, *, reserved: bool) -> Search:
    """``search``'s answer no longer than the positions the model learned (a search whose
    peaks do not grow with tokens can end past them)."""
    if positions is None or search.max_tokens <= positions:
        return search
    peak = peaks.sample(positions, reserved=reserved)[0]
    return replace(search, max_tokens=positions, peak_at_max=peak, peak_above=None)


# An earlier kernel's answer is asked about first when it lies this close (relative)
# to what a kernel's own first guess says.
_HINT_REACH = 0.1
# Two kernels' allocated answers this close (relative): the same part of the step
# decided both (the seed line's guess is a few percent off; answers are not).
_SAME_PART = 0.02
# The reserved peak's steps: the allocator rounds a large block to 2 MiB and puts
# blocks of 1-10 MiB in 20 MiB segments. Two reserved peaks give a slope only when
# this many bytes' worth of tokens apart (a few steps).
_STAIRCASE_BYTES = 32 * 2**20
# memprobe.profile.flash_workspace: the sequence rounded up to this in the workspace.
_FLASH_ROUNDING = 128


def _near(answers: Sequence[int], guess: int | None, reach: float = _HINT_REACH) -> list[int]:
    """The earlier answer nearest ``guess`` when within ``reach`` (relative) of it."""
    if guess is None or not answers:
        return []
    nearest = min(answers, key=lambda a: abs(a - guess))
    return [nearest] if nearest > 0 and abs(nearest - guess) <= reach * guess else []


def _jump_periods(step: hf.HFStep) -> tuple[int, ...]:
    """Where the step's peak may jump: each whole chunk (a chunked kernel's loop takes
    another turn), and each 128 tokens (flash attention's backward rounds the sequence
    up to 128 in its workspace)."""
    return (*([step.chunk_size] if step.chunk_size else []), _FLASH_ROUNDING)


def _staircase_gap(line: Line) -> int:
    """Tokens between two reserved peaks that give a slope: a few allocator steps."""
    return max(1, math.ceil(_STAIRCASE_BYTES / line.slope)) if line.slope > 0 else 1


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

    def overhead(self, tokens: int) -> int:
        """Reserved minus allocated at ``tokens`` (0 when nothing fits)."""
        if tokens <= 0:
            return 0
        allocated, on_reserved, _ = self.at(tokens)
        return on_reserved - allocated

    def samples(self, *, reserved: bool) -> dict[int, Sample]:
        """Every count traced so far: its allocated peak and phase peaks, or its reserved
        peak (not split by phase: the allocator's reserved bytes only grow)."""
        return {t: self.sample(t, reserved=reserved) for t in self.traced}

    def sample(self, tokens: int, *, reserved: bool) -> Sample:
        allocated, on_reserved, phases = self.at(tokens)
        return (on_reserved, {}) if reserved else (allocated, phases)

    def search(self, steps: StepSearch, *, reserved: bool) -> Search:
        try:
            ask = next(steps)
            while True:
                ask = steps.send(self.sample(ask, reserved=reserved))
        except StopIteration as done:
            return done.value
