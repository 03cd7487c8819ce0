"""TP=2 numerics on two real CPU processes (gloo).

One launch runs every case on both ranks (a launch costs seconds; a case costs
milliseconds); each rank saves what it computed, and the tests below compare
it in this process with a float64 single-device reference.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from launch import forkserver

from memprobe.kernels import (
    chunked_distributed_logprobs,
    distributed_logprobs,
    get_spec,
    next_token_logprobs,
    unchunked_logprobs,
)
from memprobe.measure.parallel import count_collectives, run_ranks

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable"),
]

WORLD = 2
BATCH, SEQ, VOCAB = 2, 13, 24
KERNELS = {"distributed": distributed_logprobs, "chunked_distributed": chunked_distributed_logprobs}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CHUNKS = [None, 1, 4, 13, 100]
# Uneven explicit ranges: rank 0 holds ids [0, 10), rank 1 holds [10, 24).
UNEVEN = [(0, 10), (10, VOCAB)]
DTENSOR_VOCAB = 23  # DTensor's torch.chunk rule: 12 + 11 columns


def make_case(
    seed: int, dtype: torch.dtype, vocab: int = VOCAB
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same full logits, targets and output weights on every rank and here."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(BATCH, SEQ, vocab, generator=gen) * 3).to(dtype)
    targets = torch.randint(0, vocab, (BATCH, SEQ), generator=gen)
    weights = torch.randn(BATCH, SEQ, generator=gen)
    return logits, targets, weights


def minus_inf_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Row (0, 2) is all -inf on rank 0's shard; its target lives on rank 1.
    logits, targets, weights = make_case(7, torch.float32)
    logits[0, 2, : VOCAB // WORLD] = float("-inf")
    targets[0, 2] = VOCAB - 1
    return logits, targets, weights


def _forward_backward(fn: Any, shard: torch.Tensor, targets: torch.Tensor, weights, **kw) -> dict:
    before = shard.clone()
    x = shard.clone().requires_grad_()
    with count_collectives() as fwd:
        out = fn(x, targets, **kw)
    with count_collectives() as bwd:
        (grad,) = torch.autograd.grad(out, x, weights)
    return {
        "out": out.detach(),
        "grad": grad,
        "collectives": (fwd.total, bwd.total),
        "unchanged": torch.equal(x.detach(), before),
    }


def _worker(rank: int, world: int, out_dir: str) -> None:
    """Runs on each rank inside a gloo group (see memprobe.measure.parallel.run_ranks)."""
    width = VOCAB // world
    lo, hi = rank * width, (rank + 1) * width
    results: dict[Any, Any] = {}
    for name, fn in KERNELS.items():
        for dname, dtype in DTYPES.items():
            logits, targets, weights = make_case(0, dtype)
            for chunk in CHUNKS:
                results[name, dname, chunk] = _forward_backward(
                    fn, logits[..., lo:hi], targets, weights, chunk_size=chunk
                )
            # Explicit, uneven vocabulary ranges.
            start, end = UNEVEN[rank]
            results[name, dname, "uneven"] = _forward_backward(
                fn,
                logits[..., start:end],
                targets,
                weights,
                chunk_size=4,
                vocab_start=start,
                vocab_end=end,
            )
        logits, targets, weights = minus_inf_case()
        results[name, "minus_inf"] = _forward_backward(
            fn, logits[..., lo:hi], targets, weights, chunk_size=5
        )
        # An id past the global vocabulary: every rank must raise, none hang.
        bad = targets.clone()
        bad[1, 3] = VOCAB
        try:
            fn(logits[..., lo:hi], bad)
            results[name, "bad_target"] = "no error"
        except ValueError as exc:
            results[name, "bad_target"] = str(exc)

    # DTensor through the dispatcher, on a 2-rank mesh with uneven shards.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    for dname, dtype in DTYPES.items():
        logits, input_ids, weights = make_case(3, dtype, DTENSOR_VOCAB)
        dt = distribute_tensor(logits, mesh, [Shard(2)]).requires_grad_()
        out = next_token_logprobs(dt, input_ids, chunk_size=4)
        out.backward(weights[:, :-1])
        results["dtensor", dname] = {"out": out.detach(), "grad": dt.grad.full_tensor()}

    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("tp2")
    run_ranks(_worker, WORLD, (os.fspath(out_dir),), timeout_s=120, start_method=forkserver())
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def reference(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.double().requires_grad_()
    out = torch.log_softmax(x, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (grad,) = torch.autograd.grad(out, x, weights.double())
    return out.detach(), grad


def check(
    per_rank: list[dict],
    logits: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    bounds: list[tuple[int, int]],
) -> None:
    ref_out, ref_grad = reference(logits, targets, weights)
    grad_tol = 1e-6 if logits.dtype == torch.float32 else 1e-2
    for rank, res in enumerate(per_rank):
        torch.testing.assert_close(res["out"].double(), ref_out, atol=1e-5, rtol=1e-5)
        start, end = bounds[rank]
        assert res["grad"].dtype == logits.dtype
        torch.testing.assert_close(
            res["grad"].double(), ref_grad[..., start:end], atol=grad_tol, rtol=grad_tol
        )
        assert res["unchanged"]
    # Every rank returns the same log-probs.
    assert torch.equal(per_rank[0]["out"], per_rank[1]["out"])


EVEN = [(r * VOCAB // WORLD, (r + 1) * VOCAB // WORLD) for r in range(WORLD)]


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("chunk", CHUNKS)
def test_tp2_matches_single_device(ranks: list[dict], name: str, dname: str, chunk: Any) -> None:
    logits, targets, weights = make_case(0, DTYPES[dname])
    check([r[name, dname, chunk] for r in ranks], logits, targets, weights, EVEN)
    # Also against the package's own single-device reference kernel.
    single = unchunked_logprobs(logits, targets)
    torch.testing.assert_close(ranks[0][name, dname, chunk]["out"], single, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("dname", list(DTYPES))
def test_tp2_uneven_explicit_ranges(ranks: list[dict], name: str, dname: str) -> None:
    logits, targets, weights = make_case(0, DTYPES[dname])
    check([r[name, dname, "uneven"] for r in ranks], logits, targets, weights, UNEVEN)


@pytest.mark.parametrize("name", list(KERNELS))
def test_tp2_shard_all_minus_inf(ranks: list[dict], name: str) -> None:
    logits, targets, weights = minus_inf_case()
    per_rank = [r[name, "minus_inf"] for r in ranks]
    assert all(torch.isfinite(res["out"]).all() for res in per_rank)
    check(per_rank, logits, targets, weights, EVEN)


@pytest.mark.parametrize("name", list(KERNELS))
def test_tp2_counted_collectives_match_the_formula(ranks: list[dict], name: str) -> None:
    spec = get_spec(name)
    for res in ranks:
        for dname in DTYPES:
            for chunk in CHUNKS:
                counted = res[name, dname, chunk]["collectives"]
                assert counted == spec.collectives(BATCH * SEQ, chunk)


@pytest.mark.parametrize("name", list(KERNELS))
def test_tp2_target_past_the_vocabulary_raises_on_every_rank(ranks: list[dict], name: str) -> None:
    for res in ranks:
        assert "owned by no rank" in res[name, "bad_target"]


@pytest.mark.parametrize("dname", list(DTYPES))
def test_tp2_dtensor_through_the_dispatcher(ranks: list[dict], dname: str) -> None:
    logits, input_ids, weights = make_case(3, DTYPES[dname], DTENSOR_VOCAB)
    targets = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)
    ref_out, ref_grad = reference(
        logits, targets, torch.cat([weights[:, :-1], 0 * weights[:, :1]], 1)
    )
    grad_tol = 1e-6 if dname == "float32" else 1e-2
    for res in ranks:
        torch.testing.assert_close(
            res["dtensor", dname]["out"].double(), ref_out[:, :-1], atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(
            res["dtensor", dname]["grad"].double(), ref_grad, atol=grad_tol, rtol=grad_tol
        )
