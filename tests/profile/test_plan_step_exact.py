"""``plan --step``'s faster path (remembered meta ops, the bare allocator replay, the
reserved search started from the allocated one's traces) gives the plain path's answers:
each answer T is checked on plain traces (no memo, reserved peaks from the full allocator
simulation) to fit while T + 1 does not, with the peaks the plan reports. Peaks grow with
tokens here, so that boundary is the one the plain search finds too."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("transformers")

from memprobe.allocator import simulate  # noqa: E402
from memprobe.plan import make_budget  # noqa: E402
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
    """Allocated and reserved peaks the plain way: no memo, the full allocator simulation."""
    tracked, _ = trace_hf_step(replace(step, tokens=tokens), memo=False)
    requests, _ = allocator_requests(tracked.events)
    sim = simulate((e.action, e.storage, e.nbytes) for e in requests)
    return tracked.peak_bytes, sim.reserved_peak_bytes


# One logits kernel and the fused route (each a few dozen whole steps, ~18 s here);
# local_chunked's answers go through the same search as unchunked's.
@pytest.mark.parametrize("kernel", ["unchunked", "fused_linear_chunked"])
def test_plan_step_answers_are_boundaries_of_the_plain_path(kernel: str) -> None:
    base = HFStep(config_from_dict(dict(CONFIG)), tokens=1, chunk_size=32, optimizer="sgd")
    budget = make_budget("2MiB")
    limit = budget.limit_bytes
    (plan,) = plan_step(base, [kernel], budget)
    step = replace(base, kernel=kernel)
    allocated, reserved = plan.allocated, plan.reserved
    assert reserved is not None
    assert 0 < reserved.max_tokens <= allocated.max_tokens
    at_max, above = _plain(step, allocated.max_tokens), _plain(step, allocated.max_tokens + 1)
    assert at_max[0] == allocated.peak_at_max <= limit < above[0] == allocated.peak_above
    at_max, above = _plain(step, reserved.max_tokens), _plain(step, reserved.max_tokens + 1)
    assert at_max[1] == reserved.peak_at_max <= limit < above[1] == reserved.peak_above
