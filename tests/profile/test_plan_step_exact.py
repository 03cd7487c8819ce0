"""``plan --step``'s faster path (remembered meta ops, the bare allocator replay, the
reserved search started from the allocated one's traces) gives the plain path's answers:
each answer T is checked on plain traces (no memo, reserved peaks from the full allocator
simulation) to fit while T + 1 does not, with the peaks the plan reports. Peaks grow with
tokens here, so that boundary is the one the plain search finds too. And for two kernels
the answers equal a plain bisection on the same whole-step peaks, with fewer steps than
bisection from one token (double, then halve) would simulate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cache
from typing import Any

import pytest

pytest.importorskip("transformers")

from memprobe.allocator import simulate  # noqa: E402
from memprobe.measure.reserved import modelled_reserved_peak  # noqa: E402
from memprobe.plan import make_budget, whole_step  # noqa: E402
from memprobe.profile.hf import HFStep, config_from_dict  # noqa: E402
from memprobe.profile.step import trace_hf_step  # noqa: E402
from memprobe.snapshot.synthesize import allocator_requests  # noqa: E402

CONFIG = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 512,
}


BUDGET = "2MiB"


def _base() -> HFStep:
    return HFStep(config_from_dict(dict(CONFIG)), tokens=1, chunk_size=32, optimizer="sgd")


def _plain(step: HFStep, tokens: int) -> tuple[int, int]:
    """Allocated and reserved peaks the plain way: no memo, the full allocator simulation."""
    tracked, _ = trace_hf_step(replace(step, tokens=tokens), memo=False)
    requests, _ = allocator_requests(tracked.events)
    sim = simulate((e.action, e.storage, e.nbytes) for e in requests)
    return tracked.peak_bytes, sim.reserved_peak_bytes


# One logits kernel and the fused route (each a few dozen whole steps, ~18 s here);
# local_chunked's answers go through the same search as unchunked's.
@pytest.mark.parametrize("kernel", ["unchunked", "fused_linear_chunked"])
def test_plan_step_answers_are_boundaries_of_the_plain_path(kernel: str) -> None:
    base, budget = _base(), make_budget(BUDGET)
    limit = budget.limit_bytes
    (plan,) = whole_step.plan_step(base, [kernel], budget)
    step = replace(base, kernel=kernel)
    allocated, reserved = plan.allocated, plan.reserved
    assert reserved is not None
    assert 0 < reserved.max_tokens <= allocated.max_tokens
    at_max, above = _plain(step, allocated.max_tokens), _plain(step, allocated.max_tokens + 1)
    assert at_max[0] == allocated.peak_at_max <= limit < above[0] == allocated.peak_above
    at_max, above = _plain(step, reserved.max_tokens), _plain(step, reserved.max_tokens + 1)
    assert at_max[1] == reserved.peak_at_max <= limit < above[1] == reserved.peak_above


def bisection(fits: Callable[[int], bool], hi: int) -> int:
    """Plain bisection of ``[0, hi]``, ``hi`` known not to fit."""
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def doubling_bisection(answer: int) -> set[int]:
    """The counts plain bisection from one token asks about when ``answer`` is the boundary."""
    asked, lo, hi = {1}, 0, 1
    while hi <= answer:
        lo, hi = hi, 2 * hi
        asked.add(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        asked.add(mid)
        lo, hi = (mid, hi) if mid <= answer else (lo, mid)
    return asked


# A chunk loop (its peak jumps at chunk edges) and a kernel planned after it whose answer
# is near its own (the earlier answer is asked first); unchunked and the fused route are
# checked to be boundaries of the plain path above. Traces are
# shared between the plan and the bisections (~25 whole steps of a one-layer model per
# kernel). The bisections halve [0, 2048]: no kernel fits 2048 tokens in the budget
# (checked), and a peak that grows has one boundary below it.
KERNELS = ("local_chunked", "local_tiled")
TOP = 2048


def test_plan_step_answers_are_plain_bisections(monkeypatch: pytest.MonkeyPatch) -> None:
    base, budget = _base(), make_budget(BUDGET)
    limit = budget.limit_bytes
    searched: dict[str, set[int]] = {k: set() for k in KERNELS}

    @cache
    def traced(kernel: str, tokens: int) -> Any:
        return trace_hf_step(replace(base, kernel=kernel, tokens=tokens))

    def counted(step: HFStep) -> Any:
        searched[step.kernel].add(step.tokens)
        return traced(step.kernel, step.tokens)

    monkeypatch.setattr(whole_step, "trace_hf_step", counted)
    plans = whole_step.plan_step(base, KERNELS, budget)
    for kernel, plan in zip(KERNELS, plans, strict=True):
        assert plan.reserved is not None

        def fits(tokens: int, reserved: bool, kernel: str = kernel) -> bool:
            tracked = traced(kernel, tokens)[0]
            peak = modelled_reserved_peak(tracked.events) if reserved else tracked.peak_bytes
            return bool(peak <= limit)

        assert not fits(TOP, False)  # so not on reserved either (never below allocated)
        assert plan.max_tokens == bisection(lambda t: fits(t, False), TOP) > 0
        assert plan.reserved.max_tokens == bisection(lambda t: fits(t, True), TOP) > 0
        # Plain bisection from one token (double, then halve) would have simulated these:
        # on a growing peak its counts follow from the answers alone.
        plain = doubling_bisection(plan.max_tokens) | doubling_bisection(plan.reserved.max_tokens)
        assert len(searched[kernel]) < len(plain)
