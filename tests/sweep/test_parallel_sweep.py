"""Per-rank simulated figures for tensor (vocabulary) and context (token) parallelism."""

from __future__ import annotations

import pytest

from memprobe.errors import UserError
from memprobe.measure import measure
from memprobe.records import Case
from memprobe.sweep import plan_cases

GIB = 2**30
S, V = 20_000, 131_072


def per_rank(kernel: str, *, tokens: int = S, tp: int = 1, cp: int = 1):
    return measure(Case(kernel, 1, tokens, V, "bf16", 1024, tp=tp, cp=cp, device="meta"))


def test_chunked_distributed_at_tp8_fits_and_distributed_does_not_reach_it():
    chunked = per_rank("chunked_distributed", tp=8)
    full = per_rank("distributed", tp=8)
    shard = S * (V // 8)
    # logits shard + its bf16 gradient + one float32 chunk + per-token stats
    # (16 bytes per token of float32 [B, S] stats, 13 per token of a chunk)
    assert chunked.peak_bytes == 2 * 2 * shard + 4 * 1024 * (V // 8) + 16 * S + 13 * 1024
    assert chunked.peak_bytes <= 1.35 * GIB < full.peak_bytes
    assert chunked.big_fp32_blocks == 0 and full.big_fp32_blocks == 2
    assert (chunked.fwd_collectives, chunked.bwd_collectives) == (2, 0)
    assert (full.fwd_collectives, full.bwd_collectives) == (3, 0)


def test_tp_halves_the_per_rank_peak():
    one, two = per_rank("chunked_distributed", tp=1), per_rank("chunked_distributed", tp=2)
    assert two.peak_bytes < 0.51 * one.peak_bytes


def test_context_parallel_160k_over_8_ranks_is_the_20k_headline():
    cp8 = per_rank("local_chunked", tokens=160_000, cp=8)
    assert cp8.peak_bytes == per_rank("local_chunked").peak_bytes
    assert cp8.peak_bytes <= 10.30 * GIB


def test_single_device_kernels_communicate_nothing():
    run = per_rank("local_chunked")
    assert (run.fwd_collectives, run.bwd_collectives) == (0, 0)


def test_tp_defaults_to_the_distributed_kernels():
    cases = plan_cases(tokens=[S], vocab=[V], tp=[1, 8], device="meta", ladder=False)
    assert {c.kernel for c in cases} == {"distributed", "chunked_distributed"}
    assert {c.tp for c in cases} == {1, 8}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": [3]}, "does not divide the vocabulary"),
        ({"cp": [3]}, "does not divide the tokens"),
        ({"tp": [2], "kernel": ["local_chunked"]}, "cannot do"),
        ({"tp": [2], "device": "cpu"}, "torchrun"),
    ],
)
def test_bad_parallel_sizes(kwargs, message):
    with pytest.raises(UserError, match=message):
        plan_cases(**{"tokens": [S], "vocab": [V], "device": "meta", "ladder": False, **kwargs})
