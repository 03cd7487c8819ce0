"""The planner: the largest token count per GPU whose simulated peak fits a budget.

For one kernel on one parallel layout, the peak of the logprob step (logits,
their gradient and everything the kernel allocates, per rank) is piecewise
linear in the tokens a rank holds: ``peak ≈ slope · tokens + fixed``, where the
slope is what every token costs (logits, gradient, float32 copies, saved
outputs) and the fixed term is what does not grow with the sequence (a chunk's
float32 workspace). Two cheap simulations at a few chunks give slope and fixed;
they predict the answer, and the exact meta simulation — the one ``memprobe
sweep`` uses — then checks it: the answer is ``T`` only when ``T`` tokens fit and
``T + 1`` do not, and where the line is off a bracketing search (regula falsi,
then bisection) finds the true boundary. Each plan reports the line it found
and whether the line alone would have been right.

Searches are written as generators that ask for token counts and receive
their peaks, so one driver can run many plans' simulations in a pool of
processes (the large simulations dominate; two cores halve the wall time).
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from typing import Any

from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes, parse_size
from memprobe.kernels.registry import check_inputs_match, get_spec, kernel_names
from memprobe.records import DTYPES, Case, normalize_dtype

# Which peak a search plans on: the tracker's allocated bytes, or the reserved
# bytes of the CUDA caching-allocator model when one is installed.
ALLOCATED = "allocated"
RESERVED = "reserved"

# Far beyond any GPU (2^40 tokens): a search that gets there has a flat peak.
_MAX_TOKENS = 2**40
# Without a chunk size the seeds are taken at multiples of this many tokens.
_SEED_UNIT = 1024


# -- what is planned ---------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """Bytes a GPU has, and bytes the rest of the job (weights, optimizer, activations) holds."""

    budget_bytes: int
    other_bytes: int = 0

    @property
    def limit_bytes(self) -> int:
        """What the logprob step may use: budget − other."""
        return self.budget_bytes - self.other_bytes


def make_budget(budget: str | int, other: str | int = 0) -> Budget:
    """Sizes as users write them (``"80GiB"``, bytes) → a checked :class:`Budget`."""
    budget_bytes = parse_size(budget, what="--budget")
    other_bytes = parse_size(other, what="--other")
    if other_bytes > budget_bytes:
        raise UserError(
            f"--other {format_bytes(other_bytes)} is more than --budget "
            f"{format_bytes(budget_bytes)}",
            "the budget is the GPU's whole memory; --other is the part the rest of the job holds",
        )
    return Budget(budget_bytes, other_bytes)


@dataclass(frozen=True)
class Target:
    """One kernel on one parallel layout at one chunk size: what one plan answers for."""

    kernel: str
    vocab: int
    batch: int = 1
    dtype: str = "bf16"
    chunk_size: int | None = 1024
    tp: int = 1
    cp: int = 1
    hidden: int | None = None  # H for the hidden family

    def case(self, local_tokens: int) -> Case:
        """The simulated case with ``local_tokens`` on each rank (``Case.tokens`` is global)."""
        return Case(
            self.kernel,
            self.batch,
            local_tokens * self.cp,
            self.vocab,
            self.dtype,
            self.chunk_size,
            self.tp,
            self.cp,
            "meta",
            self.hidden,
        )


def make_target(
    kernel: str,
    *,
    vocab: int,
    batch: int = 1,
    dtype: str = "bf16",
    chunk_size: int | None = 1024,
    tp: int = 1,
    cp: int = 1,
    hidden: int | None = None,
) -> Target:
    """A checked :class:`Target`; a kernel that ignores the chunk size gets None."""
    try:
        spec = get_spec(kernel)
    except ValueError as exc:
        raise UserError(str(exc), "see `memprobe kernels`") from None
    for name, value in (("vocab", vocab), ("batch", batch), ("tp", tp), ("cp", cp)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UserError(f"{name} must be a positive integer, got {value!r}", f"e.g. {name}=1")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0
    ):
        raise UserError(f"chunk size must be a positive integer, got {chunk_size!r}", "e.g. 1024")
    key = normalize_dtype(dtype)
    if key is None:
        raise UserError(f"unknown dtype {dtype!r}", f"use one of: {', '.join(DTYPES)}")
    if tp > 1 and not spec.distributed:
        sharded = ", ".join(kernel_names(distributed=True))
        raise UserError(
            f"tp {tp} shards the vocabulary, which {kernel} cannot do", f"use tp with: {sharded}"
        )
    if vocab % tp:
        raise UserError(f"--tp {tp} does not divide the vocabulary {vocab}", "pick a tp that does")
    if hidden is not None and (
        isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0
    ):
        raise UserError(f"hidden must be a positive integer, got {hidden!r}", "e.g. --hidden 4096")
    check_inputs_match([kernel], hidden)
    chunk = chunk_size if spec.uses_chunk_size else None
    return Target(kernel, vocab, batch, key, chunk, tp, cp, hidden)


# -- what a plan says --------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """``peak ≈ slope · tokens + fixed``, fitted through two simulated points."""

    slope: float
    fixed: float

    @classmethod
    def through(cls, a: tuple[int, int], b: tuple[int, int]) -> Line:
        (t1, p1), (t2, p2) = sorted((a, b))
        slope = (p2 - p1) / (t2 - t1)
        return cls(slope, p1 - slope * t1)

    def tokens_within(self, limit: int) -> int | None:
        """The largest token count the line puts at or under ``limit`` (None if flat)."""
        if self.slope <= 0:
            return None
        return max(0, math.floor((limit - self.fixed) / self.slope))


@dataclass(frozen=True)
class Search:
    """Where a search ended: the boundary and the evidence on both sides of it."""

    max_tokens: int
    peak_at_max: int | None  # None when nothing fits (max_tokens 0)
    peak_above: int  # the peak at max_tokens + 1, the first count that does not fit
    line: Line
    predicted: int | None  # what the seed line alone said
    simulations: int
    points: tuple[tuple[int, int], ...] = ()  # every (tokens, peak) simulated, by tokens

    @property
    def line_error_bytes(self) -> float | None:
        """Simulated peak at the answer minus the line's: how far the seed line was off."""
        if self.peak_at_max is None:
            return None
        return self.peak_at_max - (self.line.slope * self.max_tokens + self.line.fixed)


@dataclass(frozen=True)
class TokenPlan:
    """The answer for one target: tokens per GPU, the peak there, the line that predicted it."""

    target: Target
    budget: Budget
    allocated: Search
    reserved: Search | None = None

    @property
    def max_tokens(self) -> int:
        """Tokens per GPU (per sequence, each rank's share of it under context parallelism)."""
        return self.allocated.max_tokens

    @property
    def global_tokens(self) -> int:
        """The sequence length across the context-parallel group."""
        return self.allocated.max_tokens * self.target.cp

    @property
    def fits_at_all(self) -> bool:
        return self.allocated.max_tokens > 0

    def row(self) -> dict[str, Any]:
        """One flat, JSON-ready row (the ``--json`` output)."""
        a = self.allocated
        row: dict[str, Any] = {
            **asdict(self.target),
            "max_tokens": a.max_tokens,
            "global_tokens": self.global_tokens,
            "peak_bytes_at_max": a.peak_at_max,
            "peak_bytes_above_max": a.peak_above,
            "budget_bytes": self.budget.budget_bytes,
            "other_bytes": self.budget.other_bytes,
            "limit_bytes": self.budget.limit_bytes,
            "slope_bytes_per_token": a.line.slope,
            "fixed_bytes": a.line.fixed,
            "predicted_tokens": a.predicted,
            "line_exact": a.predicted == a.max_tokens,
            "line_error_bytes": a.line_error_bytes,
            "simulations": a.simulations,
            "peak_kind": ALLOCATED,
        }
        r = self.reserved
        row["reserved_max_tokens"] = r.max_tokens if r else None
        row["reserved_peak_bytes_at_max"] = r.peak_at_max if r else None
        return row


# -- the search --------------------------------------------------------------------------

Peaks = Mapping[int, int]
SearchSteps = Generator[list[int], Peaks, Search]


def seed_tokens(target: Target) -> tuple[int, int]:
    """Two small counts on the large-sequence piece of the line: whole chunks, several
    of them, so a chunk's workspace is already at full size in both."""
    unit = target.chunk_size or _SEED_UNIT
    return (2 * unit, 4 * unit)


def search_max_tokens(
    limit: int, seeds: tuple[int, int], *, below: int | None = None, line: Line | None = None
) -> SearchSteps:
    """Ask for peaks at token counts until ``T`` fits and ``T + 1`` does not; return ``T``.

    ``below`` is a count already known not to fit (the reserved search starts from
    the allocated answer); ``line`` a line known beforehand (then no seeds are asked
    for). Each step asks for a pair ``(g, g + 1)``: when the guess is right, one
    round of two simulations (run side by side in a pool) settles it.
    """
    peaks: dict[int, int] = {}
    lo, hi = 0, below  # lo fits (zero tokens allocate nothing); hi does not
    if line is None:
        got = yield [t for t in seeds]
        peaks.update(got)
        line = Line.through(*((t, peaks[t]) for t in seeds))
    predicted = line.tokens_within(limit)
    for t, p in peaks.items():
        lo, hi = _narrow(lo, hi, t, p, limit)
    guess = predicted
    while hi is None or hi - lo > 1:
        if guess is None or not (lo <= guess and (hi is None or guess < hi)):
            guess = _bisect(lo, hi)
        probes = [t for t in (guess, guess + 1) if t > lo and (hi is None or t < hi)]
        probes = [t for t in probes if t not in peaks] or [_bisect(lo, hi)]
        got = yield probes
        peaks.update(got)
        width = None if hi is None else hi - lo
        for t in probes:
            lo, hi = _narrow(lo, hi, t, peaks[t], limit)
        # A guess must at least halve the bracket, or the next step bisects: the
        # search then never takes more rounds than bisection would, give or take one.
        halved = width is None or hi is None or 2 * (hi - lo) <= width
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


def _narrow(lo: int, hi: int | None, tokens: int, peak: int, limit: int) -> tuple[int, int | None]:
    if peak <= limit:
        return max(lo, tokens), hi
    return lo, tokens if hi is None else min(hi, tokens)


def _bisect(lo: int, hi: int | None) -> int:
    if hi is None:
        if lo >= _MAX_TOKENS:
            raise UserError(
                f"the peak stops growing with tokens beyond {lo:,}: no largest count exists",
                "this kernel's memory does not depend on the sequence length here",
            )
        return max(1, 2 * lo)
    return (lo + hi) // 2


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
    if lo > 0 and hi in peaks:
        return Line.through((lo, peaks[lo]), (hi, peaks[hi])).tokens_within(limit)
    return seed.tokens_within(limit)


# -- running many searches ---------------------------------------------------------------

Probe = tuple[str, int]  # (peak kind, local tokens)
PlanSteps = Generator[list[Probe], Mapping[Probe, int], TokenPlan]


def _tagged(kind: str, steps: SearchSteps) -> Generator[list[Probe], Mapping[Probe, int], Search]:
    try:
        ask = next(steps)
        while True:
            got = yield [(kind, t) for t in ask]
            ask = steps.send({t: got[(kind, t)] for t in ask})
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def plan_steps(target: Target, budget: Budget, reserved: bool) -> PlanSteps:
    """The allocated search, then (with the allocator model) the reserved one below it."""
    limit = budget.limit_bytes
    allocated = yield from _tagged(ALLOCATED, search_max_tokens(limit, seed_tokens(target)))
    on_reserved: Search | None = None
    if reserved:
        # Reserved is never below allocated: the allocated answer + 1 cannot fit either.
        on_reserved = yield from _tagged(
            RESERVED,
            search_max_tokens(
                limit, seed_tokens(target), below=allocated.max_tokens + 1, line=allocated.line
            ),
        )
    return TokenPlan(target, budget, allocated, on_reserved)


def simulated_peak(case: Case, kind: str = ALLOCATED, alloc_conf: str | None = None) -> int:
    """The peak of one case on the meta simulation the sweep uses (one rank)."""
    from memprobe.measure.meta_backend import simulate

    tracker = simulate(case, capture_frames=False)
    if kind == ALLOCATED:
        return tracker.peak_bytes
    from memprobe.measure.reserved import modelled_reserved_peak

    return modelled_reserved_peak(tracker.events, alloc_conf)


def _cost(case: Case) -> int:
    """Rough simulation cost, to start the longest first: one loop turn per chunk."""
    return case.local_tokens // (case.chunk_size or case.local_tokens or 1)


def run_plans(
    targets: Sequence[Target],
    budget: Budget,
    *,
    jobs: int = 1,
    alloc_conf: str | None = None,
    reserved: bool | None = None,
    on_done: Callable[[TokenPlan], None] | None = None,
) -> list[TokenPlan]:
    """Plan every target. ``jobs`` > 1 runs the simulations in that many forked processes;
    ``reserved`` (default True) also plans on the modelled reserved peak; ``on_done``
    hears of each plan as it finishes (in any order)."""
    if reserved is None:
        reserved = True
    steps = {i: plan_steps(t, budget, reserved) for i, t in enumerate(targets)}
    pool = _pool(jobs, targets)

    def evaluate(i: int, probe: Probe) -> int:
        return simulated_peak(targets[i].case(probe[1]), probe[0], alloc_conf)

    try:
        if pool is None:
            done = _drive_in_order(steps, evaluate, on_done)
        else:
            done = _drive_in_pool(steps, targets, pool, alloc_conf, on_done)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return [done[i] for i in range(len(targets))]


def _pool(jobs: int, targets: Sequence[Target]) -> ProcessPoolExecutor | None:
    # fork keeps the parent's imported, warmed-up torch; elsewhere run in order. Even
    # one plan gains: each step asks for two counts, simulated side by side.
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    # torch's first call of each op is slow (lazy setup): pay it here, once, not per worker.
    for target in dict.fromkeys(replace(t, cp=1) for t in targets):
        simulated_peak(target.case(2 * (target.chunk_size or 1)))
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork"))


def _drive_in_order(
    steps: Mapping[int, PlanSteps],
    evaluate: Callable[[int, Probe], int],
    on_done: Callable[[TokenPlan], None] | None,
) -> dict[int, TokenPlan]:
    done: dict[int, TokenPlan] = {}
    for i, gen in steps.items():
        try:
            ask = next(gen)
            while True:
                ask = gen.send({p: evaluate(i, p) for p in ask})
        except StopIteration as stop:
            done[i] = stop.value
            if on_done is not None:
                on_done(stop.value)
    return done


def _drive_in_pool(
    steps: Mapping[int, PlanSteps],
    targets: Sequence[Target],
    pool: ProcessPoolExecutor,
    alloc_conf: str | None,
    on_done: Callable[[TokenPlan], None] | None,
) -> dict[int, TokenPlan]:
    """Every plan's pending probes in one pool; a plan moves on as soon as its own are back."""
    done: dict[int, TokenPlan] = {}
    waiting: dict[int, dict[Probe, Future[int]]] = {}

    def submit(batch: Iterable[tuple[int, list[Probe]]]) -> None:
        jobs = [(i, p) for i, ask in batch for p in ask]
        for i, p in sorted(jobs, key=lambda j: -_cost(targets[j[0]].case(j[1][1]))):
            case = targets[i].case(p[1])
            waiting.setdefault(i, {})[p] = pool.submit(simulated_peak, case, p[0], alloc_conf)

    submit((i, next(gen)) for i, gen in steps.items())
    while waiting:
        futures = [f for probes in waiting.values() for f in probes.values()]
        wait(futures, return_when=FIRST_COMPLETED)
        ready = [i for i, probes in waiting.items() if all(f.done() for f in probes.values())]
        follow: list[tuple[int, list[Probe]]] = []
        for i in ready:
            got = {p: f.result() for p, f in waiting.pop(i).items()}
            try:
                follow.append((i, steps[i].send(got)))
            except StopIteration as stop:
                done[i] = stop.value
                if on_done is not None:
                    on_done(stop.value)
        submit(follow)
    return done


# -- reserved -----------------------------------------------------------------------------


def reserved_status(alloc_conf: str | None = None) -> str:
    """One line on what the reserved column is planned on."""
    settings = f" with {alloc_conf}" if alloc_conf else " with default settings"
    return (
        "reserved: planned on memprobe's model of the CUDA caching allocator"
        f"{settings} (memory outside PyTorch's allocator, e.g. the CUDA context, not included)"
    )


# -- chunk sizes and time ----------------------------------------------------------------


@dataclass(frozen=True)
class ChunkChoice:
    """For one chunked kernel on one layout: the chunk size that fits the most tokens, and
    the one measured fastest (None without times)."""

    kernel: str
    tp: int
    cp: int
    for_memory: int | None
    for_time: int | None
    why: str
    single: bool = False  # only one chunk size was planned: nothing was compared


def chunk_choices(
    plans: Sequence[TokenPlan], rows: Sequence[Mapping[str, Any]] | None
) -> list[ChunkChoice]:
    """Per chunked kernel × layout: the chunk size with the most tokens (the lowest peak at
    any count), and the fastest one from a run's measured forward + backward times."""
    groups: dict[tuple[str, int, int], list[TokenPlan]] = {}
    for p in plans:
        if p.target.chunk_size is not None:
            key = (p.target.kernel, p.target.tp, p.target.cp)
            groups.setdefault(key, []).append(p)
    choices = []
    for (kernel, tp, cp), group in groups.items():
        best = max(group, key=lambda p: (p.max_tokens, -(p.target.chunk_size or 0)))
        timed = _fastest(group, rows)
        if len(group) == 1 and timed is None:
            why = f"chunk {best.target.chunk_size} was the only size planned"
        elif timed is None:
            why = "on memory alone: " + (
                "no run given (--from-run DIR)" if rows is None else "the run has no times for it"
            )
        else:
            why = timed[1]
        choices.append(
            ChunkChoice(
                kernel,
                tp,
                cp,
                best.target.chunk_size,
                timed[0] if timed else None,
                why=why,
                single=len(group) == 1,
            )
        )
    return choices


def _fastest(
    group: Sequence[TokenPlan], rows: Sequence[Mapping[str, Any]] | None
) -> tuple[int, str] | None:
    """The planned chunk size a run measured fastest, at its largest shape with times for
    two or more of them; None when the run cannot say."""
    if not rows:
        return None
    t = group[0].target
    planned = {p.target.chunk_size for p in group}
    by_shape: dict[tuple[int, int, str], dict[int, float]] = {}
    for r in rows:
        seconds = _step_seconds(r)
        if (
            seconds is None
            or r.get("kernel") != t.kernel
            or (r.get("tp"), r.get("cp"), r.get("dtype"), r.get("batch"))
            != (t.tp, t.cp, t.dtype, t.batch)
            or r.get("chunk_size") not in planned
        ):
            continue
        shape = (int(r["tokens"]), int(r["vocab"]), str(r.get("device")))
        by_shape.setdefault(shape, {})[int(r["chunk_size"])] = seconds
    usable = [(s, times) for s, times in by_shape.items() if len(times) >= 2]
    if not usable:
        return None
    (tokens, vocab, device), times = max(usable, key=lambda st: (st[0][0] * st[0][1], st[0]))
    chunk = min(times, key=lambda c: times[c])
    fit = next(p.max_tokens for p in group if p.target.chunk_size == chunk)
    return chunk, (
        f"{fit:,} tokens; measured fastest of {len(times)} sizes: {times[chunk]:.3g} s forward "
        f"+ backward at {tokens:,} tokens x {vocab:,} vocab on {device}"
    )


def _step_seconds(row: Mapping[str, Any]) -> float | None:
    fwd, bwd = row.get("fwd_time_s"), row.get("bwd_time_s")
    if row.get("status") != "ok" or fwd is None or bwd is None:
        return None
    return float(fwd) + float(bwd)


# -- the library calls -------------------------------------------------------------------


def default_kernels(tp: Iterable[int], hidden: int | None = None) -> list[str]:
    """As the sweep decides: with any tp above 1, the vocabulary-parallel kernels;
    with a hidden size, the hidden family."""
    if hidden is not None:
        return kernel_names(inputs="hidden")
    return kernel_names(distributed=max(tp) > 1)


def plan_targets(
    kernels: Sequence[str] | None,
    *,
    vocab: int,
    batch: int = 1,
    dtype: str = "bf16",
    chunk_sizes: Sequence[int | None] = (1024,),
    tp: Sequence[int] = (1,),
    cp: Sequence[int] = (1,),
    hidden: int | None = None,
) -> tuple[list[Target], list[str]]:
    """Every kernel × tp × cp × chunk size that can run, and a note for each kernel × tp
    left out (a single-device kernel cannot shard the vocabulary)."""
    names = list(kernels) if kernels else default_kernels(tp, hidden)
    if not names:
        raise UserError("no kernels given", "see `memprobe kernels`")
    if not chunk_sizes:
        raise UserError("no chunk sizes given", "e.g. --chunk-size 1024")
    targets: list[Target] = []
    skipped: list[str] = []
    for name in names:
        for t in tp:
            try:
                spec = get_spec(name)
            except ValueError as exc:
                raise UserError(str(exc), "see `memprobe kernels`") from None
            if t > 1 and not spec.distributed:
                skipped.append(f"{name} at tp {t}")
                continue
            for c in cp:
                for chunk in chunk_sizes:
                    targets.append(
                        make_target(
                            name,
                            vocab=vocab,
                            batch=batch,
                            dtype=dtype,
                            chunk_size=chunk,
                            tp=t,
                            cp=c,
                            hidden=hidden,
                        )
                    )
    targets = list(dict.fromkeys(targets))  # kernels that ignore the chunk size: once
    if not targets:
        sharded = ", ".join(kernel_names(distributed=True))
        raise UserError(
            f"none of {', '.join(names)} can shard the vocabulary (--tp)",
            f"use --tp with: {sharded}",
        )
    return targets, skipped


def plan_one(
    kernel: str,
    *,
    vocab: int,
    budget: str | int,
    other: str | int = 0,
    dtype: str = "bf16",
    batch: int = 1,
    chunk_size: int | None = 1024,
    tp: int = 1,
    cp: int = 1,
    hidden: int | None = None,
    alloc_conf: str | None = None,
    reserved: bool = True,
) -> TokenPlan:
    """The whole answer for one kernel and layout (see :class:`TokenPlan`); ``reserved``
    False skips the search on the modelled reserved peak."""
    target = make_target(
        kernel,
        vocab=vocab,
        batch=batch,
        dtype=dtype,
        chunk_size=chunk_size,
        tp=tp,
        cp=cp,
        hidden=hidden,
    )
    budget_ = make_budget(budget, other)
    return run_plans([target], budget_, alloc_conf=alloc_conf, reserved=reserved)[0]


def max_tokens(
    kernel: str,
    *,
    vocab: int,
    budget: str | int,
    other: str | int = 0,
    dtype: str = "bf16",
    batch: int = 1,
    chunk_size: int | None = 1024,
    tp: int = 1,
    cp: int = 1,
    hidden: int | None = None,
) -> int:
    """The largest token count per GPU (each rank's share of the sequence) whose simulated
    allocated peak fits ``budget − other``; 0 when not even one token fits.

    >>> max_tokens("local_chunked", vocab=131072, budget="80GiB", other="54GiB")  # doctest: +SKIP
    """
    plan = plan_one(
        kernel,
        vocab=vocab,
        budget=budget,
        other=other,
        dtype=dtype,
        batch=batch,
        chunk_size=chunk_size,
        tp=tp,
        cp=cp,
        hidden=hidden,
        reserved=False,  # the allocated answer alone: no reserved search to throw away
    )
    return plan.max_tokens


def fits(
    kernel: str,
    *,
    tokens: int,
    vocab: int,
    budget: str | int,
    other: str | int = 0,
    dtype: str = "bf16",
    batch: int = 1,
    chunk_size: int | None = 1024,
    tp: int = 1,
    cp: int = 1,
    hidden: int | None = None,
) -> bool:
    """Whether ``tokens`` per GPU fit ``budget − other`` on the simulated allocated peak:
    one simulation, no search."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise UserError(f"tokens must be a whole number of zero or more, got {tokens!r}", "")
    limit = make_budget(budget, other).limit_bytes
    if tokens == 0:
        return True
    target = make_target(
        kernel,
        vocab=vocab,
        batch=batch,
        dtype=dtype,
        chunk_size=chunk_size,
        tp=tp,
        cp=cp,
        hidden=hidden,
    )
    return simulated_peak(target.case(tokens)) <= limit
