"""The driver: many plans' searches run on the meta simulation, in order or in a process pool.

Each plan is the allocated search, then (with the allocator model) the reserved
one below it. The driver answers each search's asks with simulated peaks; with
``jobs`` > 1 every plan's pending probes go into one pool of forked processes,
the longest first, and a plan moves on as soon as its own are back (the large
simulations dominate; two cores halve the wall time).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from typing import TYPE_CHECKING

from memprobe.errors import UserError
from memprobe.measure import fresh
from memprobe.measure.traced import keeps_inputs
from memprobe.plan.long_loops import allocated_peak, reserved_plannable
from memprobe.plan.model import (
    ALLOCATED,
    RESERVED,
    Budget,
    OnProbe,
    PlanTarget,
    Probe,
    Search,
    TokenPlan,
)
from memprobe.plan.search import SearchSteps, search_max_tokens, seed_tokens
from memprobe.records import Case

if TYPE_CHECKING:
    from memprobe.measure.traced import StepTrace
    from memprobe.measure.tracker import AllocationTracker

Simulate = Callable[[Case, str, "str | None"], int]
Ask = tuple[str, int]  # (peak kind, local tokens): one count a search asks for
PlanSteps = Generator[list[Ask], Mapping[Ask, int], TokenPlan]


def _tagged(kind: str, steps: SearchSteps) -> Generator[list[Ask], Mapping[Ask, int], Search]:
    try:
        ask = next(steps)
        while True:
            got = yield [(kind, t) for t in ask]
            ask = steps.send({t: got[(kind, t)] for t in ask})
    except StopIteration as done:
        return done.value


def plan_steps(
    target: PlanTarget, budget: Budget, reserved: bool, *, pairs: bool = True
) -> PlanSteps:
    """The allocated search, then (with the allocator model) the reserved one below it.
    ``pairs``: each step asks for two counts (see :func:`search_max_tokens`)."""
    limit = budget.limit_bytes
    allocated = yield from _tagged(
        ALLOCATED, search_max_tokens(limit, seed_tokens(target), pairs=pairs)
    )
    on_reserved: Search | None = None
    # A loop that simulates every chunk is planned on reserved only while it is short
    # (see memprobe.plan.long_loops); the message names the plans left without it.
    if reserved and reserved_plannable(target.case(allocated.max_tokens + 1)):
        # Reserved is never below allocated: the allocated answer + 1 cannot fit either.
        on_reserved = yield from _tagged(
            RESERVED,
            search_max_tokens(
                limit,
                seed_tokens(target),
                below=allocated.max_tokens + 1,
                line=allocated.line,
                pairs=pairs,
            ),
        )
    return TokenPlan(target, budget, allocated, on_reserved)


def simulated_peak(case: Case, kind: str = ALLOCATED, alloc_conf: str | None = None) -> int:
    """The peak of one case on the meta simulation the sweep uses (one rank). A kernel
    that raises there (a user's own) is one line naming it and the tokens, not a
    traceback: a sweep records such a case as an error, a plan has no answer without it."""
    return _one_line(_simulated_peak, case, kind, alloc_conf)


def _one_line(simulate: Simulate, case: Case, kind: str, alloc_conf: str | None) -> int:
    try:
        return simulate(case, kind, alloc_conf)
    except (UserError, fresh.Unclean):
        raise
    except Exception as exc:
        from memprobe.measure.step import kernel_failed

        tokens = f"{case.local_tokens:,} tokens per rank"
        raise kernel_failed(case.kernel, tokens, exc, hidden=case.hidden) from None


def _simulated_peak(case: Case, kind: str, alloc_conf: str | None) -> int:
    if kind == ALLOCATED:
        return allocated_peak(case, lambda c: _steady_peak(c, kind, alloc_conf))
    return _steady_peak(case, kind, alloc_conf)


def _steady_peak(case: Case, kind: str, alloc_conf: str | None) -> int:
    """The peak of ``case`` as a training loop runs it, step after step at one size.

    A kernel that keeps memory between calls (the previous call's logits, a cache of this
    size) holds, at its second call, what its first at this size kept (one keeping its
    logits read as unchunked's 583 tokens in 1 MiB, 146 KiB over at 584). What it kept at
    the other sizes plan tried, a loop at this one never made: once it is seen keeping
    memory, each size runs in a process of its own (:mod:`memprobe.measure.fresh`)."""
    from memprobe.measure.meta_backend import simulate_step

    if fresh.keeps(case.kernel) and fresh.available():
        return fresh.run(_fresh_peak, case, kind, alloc_conf)
    trace = simulate_step(case, capture_frames=False)
    if trace.held and fresh.available():  # this process ran it before, and it kept memory
        fresh.saw_keeping(case.kernel)
        return fresh.run(_fresh_peak, case, kind, alloc_conf)
    return _second_call_peak(case, trace, kind, alloc_conf)


def _second_call_peak(case: Case, trace: StepTrace, kind: str, alloc_conf: str | None) -> int:
    """The peak of a loop's second call where the first (``trace``) kept memory, else its own."""
    from memprobe.measure.meta_backend import simulate_step

    if trace.kept or trace.held or keeps_inputs(case.kernel):
        fresh.saw_keeping(case.kernel)
        trace = simulate_step(case, capture_frames=False)
    return _peak_of(trace.tracker, kind, alloc_conf)


def _fresh_peak(case: Case, kind: str, alloc_conf: str | None) -> int:
    """:func:`_steady_peak` in a fresh process: nothing kept from other sizes."""

    def here(case: Case, kind: str, alloc_conf: str | None) -> int:
        from memprobe.measure.meta_backend import simulate_step

        return _second_call_peak(case, simulate_step(case, capture_frames=False), kind, alloc_conf)

    return _one_line(here, case, kind, alloc_conf)


def _peak_of(tracker: AllocationTracker, kind: str, alloc_conf: str | None) -> int:
    if kind == ALLOCATED:
        return tracker.peak_bytes
    from memprobe.measure.reserved import modelled_reserved_peak

    return modelled_reserved_peak(tracker.events, alloc_conf)


def _cost(case: Case) -> int:
    """Rough simulation cost, to start the longest first: one loop turn per chunk."""
    return case.local_tokens // (case.chunk_size or case.local_tokens or 1)


def run_plans(
    targets: Sequence[PlanTarget],
    budget: Budget,
    *,
    jobs: int = 1,
    alloc_conf: str | None = None,
    reserved: bool | None = None,
    on_done: Callable[[TokenPlan], None] | None = None,
    on_probe: OnProbe | None = None,
) -> list[TokenPlan]:
    """Plan every target. ``jobs`` > 1 runs the simulations in that many forked processes;
    ``reserved`` (default True) also plans on the modelled reserved peak; ``on_done``
    hears of each plan as it finishes (in any order), ``on_probe`` of each count tried."""
    if reserved is None:
        reserved = True
    pool = _pool(jobs, targets)
    # In order, a step's second count is a whole simulation more; in a pool it runs
    # beside the first.
    pairs = pool is not None
    steps = {i: plan_steps(t, budget, reserved, pairs=pairs) for i, t in enumerate(targets)}

    def heard(i: int, ask: Ask, simulated: int) -> int:
        """The peak the limit is compared with; ``on_probe`` hears of it."""
        peak = simulated + budget.other_growth(targets[i], ask[1])
        if on_probe is not None:
            on_probe(Probe(targets[i], ask[0], ask[1], peak, budget.limit_bytes))
        return peak

    def evaluate(i: int, ask: Ask) -> int:
        return heard(i, ask, simulated_peak(targets[i].case(ask[1]), ask[0], alloc_conf))

    try:
        if pool is None:
            done = _drive_in_order(steps, evaluate, on_done)
        else:
            done = _drive_in_pool(steps, targets, pool, alloc_conf, on_done, heard)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return [done[i] for i in range(len(targets))]


def pool_size(jobs: int, targets: int) -> int:
    """The processes worth forking: no more than the cores here, nor than the probes
    ever in flight (each plan asks for two counts at a time). A forking pool starts every
    worker at once, so ``--jobs 100000`` would otherwise fork a hundred thousand copies of
    this process."""
    return max(1, min(jobs, os.cpu_count() or 1, 2 * targets))


def _pool(jobs: int, targets: Sequence[PlanTarget]) -> ProcessPoolExecutor | None:
    # fork keeps the parent's imported, warmed-up torch; elsewhere run in order. Even
    # one plan gains: each step asks for two counts, simulated side by side.
    jobs = pool_size(jobs, len(targets))
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    # torch's first call of each op is slow (lazy setup): pay it here, once, not per worker.
    for target in dict.fromkeys(replace(t, cp=1) for t in targets):
        simulated_peak(target.case(2 * (target.chunk_size or 1)))
    return ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=multiprocessing.get_context("fork"),
        initializer=fresh.in_plan_worker,
    )


def _drive_in_order(
    steps: Mapping[int, PlanSteps],
    evaluate: Callable[[int, Ask], int],
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
    targets: Sequence[PlanTarget],
    pool: ProcessPoolExecutor,
    alloc_conf: str | None,
    on_done: Callable[[TokenPlan], None] | None,
    heard: Callable[[int, Ask, int], int],
) -> dict[int, TokenPlan]:
    """Every plan's pending probes in one pool; a plan moves on as soon as its own are back."""
    done: dict[int, TokenPlan] = {}
    waiting: dict[int, dict[Ask, Future[int]]] = {}

    def submit(batch: Iterable[tuple[int, list[Ask]]]) -> None:
        jobs = [(i, p) for i, ask in batch for p in ask]
        for i, p in sorted(jobs, key=lambda j: -_cost(targets[j[0]].case(j[1][1]))):
            case = targets[i].case(p[1])
            if fresh.keeps(case.kernel):  # each size in a fresh process, started from here
                waiting.setdefault(i, {})[p] = _here(case, p[0], alloc_conf)
            else:
                waiting.setdefault(i, {})[p] = pool.submit(simulated_peak, case, p[0], alloc_conf)

    def result(i: int, ask: Ask, future: Future[int]) -> int:
        try:
            return future.result()
        except fresh.Unclean:  # the worker had run the kernel at another size: afresh
            fresh.saw_keeping(targets[i].kernel)
            return simulated_peak(targets[i].case(ask[1]), ask[0], alloc_conf)

    submit((i, next(gen)) for i, gen in steps.items())
    while waiting:
        futures = [f for probes in waiting.values() for f in probes.values()]
        wait(futures, return_when=FIRST_COMPLETED)
        ready = [i for i, probes in waiting.items() if all(f.done() for f in probes.values())]
        follow: list[tuple[int, list[Ask]]] = []
        for i in ready:
            got = {p: heard(i, p, result(i, p, f)) for p, f in waiting.pop(i).items()}
            try:
                follow.append((i, steps[i].send(got)))
            except StopIteration as stop:
                done[i] = stop.value
                if on_done is not None:
                    on_done(stop.value)
        submit(follow)
    return done


def _here(case: Case, kind: str, alloc_conf: str | None) -> Future[int]:
    """``simulated_peak`` run now, in this process, as a finished future."""
    future: Future[int] = Future()
    try:
        future.set_result(simulated_peak(case, kind, alloc_conf))
    except UserError as exc:
        future.set_exception(exc)
    return future
