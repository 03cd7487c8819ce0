"""``plan --step``'s faster path (remembered meta ops, the bare allocator replay, the
reserved search started from the allocated one's traces) gives the answers of the plain
path: the plan search on whole-step traces without a memo, reserved peaks from the full
allocator simulation, the reserved search started below the allocated answer + 1."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("transformers")

from memprobe.allocator import simulate  # noqa: E402
from memprobe.plan import make_budget  # noqa: E402
from memprobe.plan.model import Line  # noqa: E402
from memprobe.plan.search import search_max_tokens  # noqa: E402
from memprobe.plan.whole_step import plan_step  # noqa: E402
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


def _plain(step: HFStep, tokens: int) -> tuple[int, int]:
    tracked, _ = trace_hf_step(replace(step, tokens=tokens), memo=False)
    requests, _ = allocator_requests(tracked.events)
    sim = simulate((e.action, e.storage, e.nbytes) for e in requests)
    return tracked.peak_bytes, sim.reserved_peak_bytes


def _drive(steps: Any, peak: Any) -> Any:
    try:
        ask = next(steps)
        while True:
            ask = steps.send({t: peak(t) for t in ask})
    except StopIteration as done:
        return done.value


@pytest.mark.parametrize("kernel", ["unchunked", "local_chunked"])
def test_plan_step_answers_are_the_plain_paths(kernel: str) -> None:
    base = HFStep(config_from_dict(dict(CONFIG)), tokens=1, chunk_size=32, optimizer="none")
    budget = make_budget("2MiB")
    (plan,) = plan_step(base, [kernel], budget)
    step = replace(base, kernel=kernel)
    cache: dict[int, tuple[int, int]] = {}

    def peaks(tokens: int) -> tuple[int, int]:
        if tokens not in cache:
            cache[tokens] = _plain(step, tokens)
        return cache[tokens]

    limit = budget.limit_bytes
    seeds = (64, 128)
    line = plan.allocated.line  # the seeded phase line (same traces, same line)
    allocated = _drive(search_max_tokens(limit, seeds, line=line), lambda t: peaks(t)[0])
    overhead = peaks(allocated.max_tokens)[1] - peaks(allocated.max_tokens)[0]
    on_reserved = _drive(
        search_max_tokens(
            limit,
            seeds,
            below=allocated.max_tokens + 1,
            line=Line(line.slope, line.fixed + overhead),
        ),
        lambda t: peaks(t)[1],
    )
    assert plan.allocated.max_tokens == allocated.max_tokens > 0
    assert plan.reserved is not None
    assert plan.reserved.max_tokens == on_reserved.max_tokens > 0
    assert plan.reserved.peak_above == on_reserved.peak_above
