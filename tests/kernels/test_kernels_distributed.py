"""Vocabulary-parallel kernels in one process: registry, validation, collective
counts on the fake process group, and 1-rank gloo numerics (TP=1, DTensor)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from memprobe.kernels import (
    KERNELS,
    ChunkedDistributedLogprob,
    DistributedLogprob,
    chunked_distributed_collectives,
    chunked_distributed_logprobs,
    distributed_collectives,
    distributed_logprobs,
    get_spec,
    kernel_names,
    local_chunked_logprobs,
    next_token_logprobs,
    unchunked_logprobs,
)
from memprobe.measure.parallel import count_collectives, fake_process_group

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")

DIST_KERNELS = {
    "distributed": distributed_logprobs,
    "chunked_distributed": chunked_distributed_logprobs,
}


@pytest.fixture
def gloo_world_1(tmp_path: os.PathLike[str]) -> Iterator[None]:
    """A real one-rank gloo default group in this process (file store: no port race)."""
    assert not dist.is_initialized(), "a process group leaked from an earlier test"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _data(
    batch: int, seq: int, vocab: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, seq, vocab, generator=gen) * 3).to(dtype)
    targets = torch.randint(0, vocab, (batch, seq), generator=gen)
    weights = torch.randn(batch, seq, generator=gen)
    return logits, targets, weights


def _reference(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 log-probs and d(sum(w * logprob))/d logits."""
    x = logits.double().detach().requires_grad_()
    out = torch.log_softmax(x, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (grad,) = torch.autograd.grad(out, x, weights.double())
    return out.detach(), grad


def _run(
    fn, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.detach().clone().requires_grad_()
    out = fn(x, targets, **kwargs)
    (grad,) = torch.autograd.grad(out, x, weights)
    return out.detach(), grad


# --------------------------------------------------------------------------
# Registry and formulas
# --------------------------------------------------------------------------


def test_registry_lists_both_distributed_kernels() -> None:
    assert kernel_names(distributed=True) == ["distributed", "chunked_distributed"]
    assert "distributed" not in kernel_names(distributed=False)
    ref, chunked = get_spec("distributed"), get_spec("chunked_distributed")
    assert ref.fn is distributed_logprobs and not ref.casts_per_chunk
    assert chunked.fn is chunked_distributed_logprobs and chunked.casts_per_chunk
    assert ref.collectives is distributed_collectives
    assert chunked.collectives is chunked_distributed_collectives
    for name, spec in KERNELS.items():
        if not spec.distributed:
            assert spec.collectives(20000, 1024) == (0, 0), name


def test_collective_formulas() -> None:
    assert distributed_collectives(20000) == (3, 0)
    assert distributed_collectives(0) == (0, 0)
    # Batched design: independent of the number of chunks.
    for chunk in (None, 1, 7, 1024, 10**6):
        assert chunked_distributed_collectives(20000, chunk) == (2, 0)
    assert chunked_distributed_collectives(0, 16) == (0, 0)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_distributed_collectives(10, 0)


def test_needs_a_process_group() -> None:
    assert not dist.is_initialized()
    logits, targets, _ = _data(1, 3, 4, torch.float32)
    for fn in DIST_KERNELS.values():
        with pytest.raises(ValueError, match="fake_process_group"):
            fn(logits, targets)


# --------------------------------------------------------------------------
# Fake process group, meta tensors: the sweep's simulation path
# --------------------------------------------------------------------------


def test_fake_process_group_context_manager() -> None:
    with fake_process_group(8, rank=3) as group:
        assert dist.get_world_size(group) == 8 and dist.get_rank(group) == 3
        assert dist.get_backend(group) == "fake"
        with pytest.raises(RuntimeError, match="already initialised"):
            with fake_process_group(2):
                pass
    assert not dist.is_initialized()
    with pytest.raises(ValueError):
        with fake_process_group(2, rank=2):
            pass
    # Torn down on error as well.
    with pytest.raises(KeyError):
        with fake_process_group(2):
            raise KeyError("boom")
    assert not dist.is_initialized()


@pytest.mark.parametrize("name", list(DIST_KERNELS))
@pytest.mark.parametrize(("seq", "chunk"), [(0, None), (1, 1), (7, 3), (2500, None), (2500, 7)])
def test_counted_collectives_match_the_formula(name: str, seq: int, chunk: int | None) -> None:
    fn, spec = DIST_KERNELS[name], get_spec(name)
    with fake_process_group(8, rank=5):
        logits = torch.empty(2, seq, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
        targets = torch.empty(2, seq, device="meta", dtype=torch.long)
        with count_collectives() as fwd:
            out = fn(logits, targets, chunk_size=chunk)
        with count_collectives() as bwd:
            (grad,) = torch.autograd.grad(out, logits, torch.ones_like(out))
    assert out.shape == (2, seq) and out.dtype == torch.float32
    assert grad.shape == logits.shape and grad.dtype == torch.bfloat16
    assert (fwd.total, bwd.total) == spec.collectives(2 * seq, chunk)
    assert set(fwd.by_op) <= {"allreduce_"}


def test_rank_derives_its_vocabulary_range_under_the_fake_group() -> None:
    captured: list[tuple[int, int]] = []
    original = ChunkedDistributedLogprob.forward

    def spy(ctx, logits, targets, start, end, *rest):  # type: ignore[no-untyped-def]
        captured.append((start, end))
        return original(ctx, logits, targets, start, end, *rest)

    with fake_process_group(4, rank=2):
        logits = torch.empty(1, 5, 10, device="meta")
        targets = torch.empty(1, 5, device="meta", dtype=torch.long)
        try:
            ChunkedDistributedLogprob.forward = staticmethod(spy)  # type: ignore[method-assign]
            chunked_distributed_logprobs(logits, targets)
            chunked_distributed_logprobs(logits, targets, vocab_start=3)
            chunked_distributed_logprobs(logits, targets, vocab_end=40)
        finally:
            ChunkedDistributedLogprob.forward = original  # type: ignore[method-assign]
    assert captured == [(20, 30), (3, 13), (30, 40)]


# --------------------------------------------------------------------------
# One-rank gloo: real values
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [None, 1, 4, 13, 100])
def test_tp1_chunked_distributed_matches_local_chunked(
    gloo_world_1: None, dtype: torch.dtype, chunk: int | None
) -> None:
    logits, targets, weights = _data(2, 13, 17, dtype, seed=1)
    out, grad = _run(chunked_distributed_logprobs, logits, targets, weights, chunk_size=chunk)
    ref_out, ref_grad = _run(local_chunked_logprobs, logits, targets, weights, chunk_size=chunk)
    assert grad.dtype == dtype
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tp1_distributed_matches_the_reference(gloo_world_1: None, dtype: torch.dtype) -> None:
    logits, targets, weights = _data(2, 9, 11, dtype, seed=2)
    out, grad = _run(distributed_logprobs, logits, targets, weights)
    ref_out, ref_grad = _run(unchunked_logprobs, logits, targets, weights)
    f64_out, f64_grad = _reference(logits, targets, weights)
    assert grad.dtype == dtype
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), f64_out, atol=1e-4, rtol=1e-5)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(grad.double(), f64_grad, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", list(DIST_KERNELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_inputs_unchanged_after_forward_and_backward(
    gloo_world_1: None, name: str, dtype: torch.dtype
) -> None:
    # float32 matters most: ``.float()`` aliases the input there.
    logits, targets, weights = _data(2, 6, 9, dtype, seed=3)
    before_logits, before_targets = logits.clone(), targets.clone()
    x = logits.requires_grad_()
    out = DIST_KERNELS[name](x, targets, chunk_size=4)
    torch.autograd.grad(out, x, weights)
    assert torch.equal(logits.detach(), before_logits)
    assert torch.equal(targets, before_targets)


@pytest.mark.parametrize("name", list(DIST_KERNELS))
def test_non_contiguous_logits(gloo_world_1: None, name: str) -> None:
    logits, targets, weights = _data(3, 5, 7, torch.float32, seed=8)
    strided = logits.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
    assert not strided.is_contiguous()
    out = DIST_KERNELS[name](strided, targets, chunk_size=2)
    (grad,) = torch.autograd.grad(out, strided, weights)
    ref_out, ref_grad = _reference(logits, targets, weights)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(DIST_KERNELS))
def test_zero_length_sequence(gloo_world_1: None, name: str) -> None:
    x = torch.randn(3, 0, 5, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.zeros(3, 0, dtype=torch.long)
    with count_collectives() as counted:
        out = DIST_KERNELS[name](x, targets, chunk_size=2)
    assert out.shape == (3, 0) and out.dtype == torch.float32
    assert counted.total == 0
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert grad.shape == x.shape and grad.dtype == x.dtype and not grad.any()


def test_inference_only_and_no_grad_save_nothing(gloo_world_1: None) -> None:
    logits, targets, _ = _data(1, 5, 6, torch.float32)
    x = logits.requires_grad_()
    out = ChunkedDistributedLogprob.apply(x, targets, 0, 6, 2, dist.group.WORLD, True)
    assert out.grad_fn.saved_tensors == ()
    with pytest.raises(RuntimeError, match="saved nothing"):
        out.sum().backward()
    out = DistributedLogprob.apply(x, targets, 0, 6, dist.group.WORLD, True)
    assert out.grad_fn.saved_tensors == ()
    with pytest.raises(RuntimeError, match="saved nothing"):
        out.sum().backward()
    with torch.no_grad():
        for fn in DIST_KERNELS.values():
            assert fn(x, targets).grad_fn is None
    # With grad: the chunked kernel saves the logits themselves (no copy),
    # the targets and a float32 [B, S] logsumexp.
    out = chunked_distributed_logprobs(x, targets)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 3
    assert saved[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert saved[2].shape == (1, 5) and saved[2].dtype == torch.float32


def test_distributed_survives_retain_graph(gloo_world_1: None) -> None:
    logits, targets, weights = _data(1, 4, 5, torch.float32)
    x = logits.requires_grad_()
    out = distributed_logprobs(x, targets)
    (first,) = torch.autograd.grad(out, x, weights, retain_graph=True)
    (second,) = torch.autograd.grad(out, x, weights)
    assert torch.equal(first, second)


@pytest.mark.parametrize("name", list(DIST_KERNELS))
def test_rows_with_minus_inf(gloo_world_1: None, name: str) -> None:
    logits, targets, weights = _data(1, 4, 8, torch.float32, seed=4)
    logits[0, 1, :6] = float("-inf")
    targets[0, 1] = 7
    out, grad = _run(DIST_KERNELS[name], logits, targets, weights, chunk_size=3)
    ref_out, ref_grad = _reference(logits, targets, weights)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(DIST_KERNELS))
def test_bad_input(gloo_world_1: None, name: str) -> None:
    fn = DIST_KERNELS[name]
    logits, targets, _ = _data(1, 4, 6, torch.float32)
    with pytest.raises(ValueError, match="chunk_size"):
        fn(logits, targets, chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        fn(logits, targets, chunk_size=-3)
    with pytest.raises(ValueError, match="vocabulary range"):
        fn(logits, targets, vocab_start=0, vocab_end=5)
    with pytest.raises(ValueError, match=r"\[B, S, V_local\]"):
        fn(logits[0], targets[0])
    with pytest.raises(ValueError, match="integer"):
        fn(logits, targets.float())
    with pytest.raises(ValueError, match="to match logits"):
        fn(logits, targets[:, :2])
    with pytest.raises(ValueError, match="non-negative"):
        fn(logits, targets - 10)
    # Past the global vocabulary: no rank owns the id (seen after the reduce).
    with pytest.raises(ValueError, match="owned by no rank"):
        fn(logits, targets.masked_fill(targets == targets[0, 0], 6))


# --------------------------------------------------------------------------
# DTensor through the dispatcher (1-rank gloo mesh)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", [None, "distributed", "chunked_distributed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtensor_vocab_sharded_logits(
    gloo_world_1: None, kernel: str | None, dtype: torch.dtype
) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    logits, input_ids, _ = _data(2, 7, 10, dtype, seed=5)
    weights = torch.randn(2, 6, generator=torch.Generator().manual_seed(6))
    dt = distribute_tensor(logits.clone(), mesh, [Shard(2)]).requires_grad_()
    out = next_token_logprobs(dt, input_ids, chunk_size=3, kernel=kernel)
    assert type(out) is torch.Tensor and out.shape == (2, 6) and out.dtype == torch.float32
    out.backward(weights)
    assert isinstance(dt.grad, DTensor) and tuple(dt.grad.placements) == (Shard(2),)

    plain = logits.clone().requires_grad_()
    ref = next_token_logprobs(plain, input_ids, kernel="local_chunked", chunk_size=3)
    ref.backward(weights)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dt.grad.full_tensor(), plain.grad, atol=1e-5, rtol=1e-5)


def test_dtensor_forwards_chunk_size_and_rejects_bad_layouts(gloo_world_1: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    logits, input_ids, _ = _data(1, 5, 6, torch.float32)
    sharded = distribute_tensor(logits, mesh, [Shard(2)])
    # chunk_size reaches the kernel: its validation fires.
    with pytest.raises(ValueError, match="chunk_size"):
        next_token_logprobs(sharded, input_ids, chunk_size=0)
    with pytest.raises(ValueError, match="distributed kernel"):
        next_token_logprobs(sharded, input_ids, kernel="local_chunked")
    with pytest.raises(ValueError, match="Shard\\(2\\)"):
        next_token_logprobs(distribute_tensor(logits, mesh, [Replicate()]), input_ids)
    with pytest.raises(ValueError, match="Shard\\(2\\)"):
        next_token_logprobs(distribute_tensor(logits, mesh, [Shard(1)]), input_ids)
    # Replicated DTensor ids are accepted.
    ids = distribute_tensor(input_ids, mesh, [Replicate()])
    out = next_token_logprobs(sharded, ids)
    assert out.shape == (1, 4)
