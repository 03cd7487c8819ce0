from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import FP32_FWD_TOL, bwd_tolerance, inputs, reference

from memprobe.kernels import (
    DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE,
    KERNELS,
    LocalChunkedLogprob,
    get_kernel,
    get_spec,
    kernel_names,
    next_token_logprobs,
)

SINGLE_DEVICE = kernel_names(distributed=False)  # logits kernels; the hidden family: tests/kernels
OUT_OF_PLACE = [n for n in SINGLE_DEVICE if not KERNELS[n].consumes_logits]
CHUNKED = ["naive_chunked", "precast_chunked", "local_chunked", "local_chunked_inplace"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
CHUNKS = [1, 2, 3, 5, 7, 8, 64, None]


def run_kernel(name, logits, targets, grad_out, chunk_size=None):
    x = logits.clone().requires_grad_()
    leaf = x
    if get_spec(name).consumes_logits:
        x = x * 1  # a non-leaf, as logits from an lm_head are
    out = get_kernel(name)(x, targets, chunk_size=chunk_size)
    (grad,) = torch.autograd.grad(out, x, grad_out)
    return out, grad, leaf


@pytest.mark.parametrize("name", SINGLE_DEVICE)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_matches_float64_reference(name, dtype, chunk):
    for seed in range(4):
        logits, targets, grad_out = inputs(2, 29, 37, dtype, seed)
        ref_out, ref_grad = reference(logits, targets, grad_out)
        out, grad, _ = run_kernel(name, logits, targets, grad_out, chunk)
        assert out.dtype == torch.float32 and out.shape == (2, 29)
        assert grad.dtype == dtype
        assert (out.double() - ref_out).abs().max().item() <= FP32_FWD_TOL
        assert (grad.double() - ref_grad).abs().max().item() <= bwd_tolerance(dtype, ref_grad)


@pytest.mark.parametrize("name", ["local_chunked", "local_chunked_inplace"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_default_chunk_on_a_sequence_it_does_not_divide(name, dtype):
    seq = DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE + 7
    logits, targets, grad_out = inputs(1, seq, 19, dtype, seed=3)
    ref_out, ref_grad = reference(logits, targets, grad_out)
    out, grad, _ = run_kernel(name, logits, targets, grad_out, None)
    assert (out.double() - ref_out).abs().max().item() <= FP32_FWD_TOL
    assert (grad.double() - ref_grad).abs().max().item() <= bwd_tolerance(dtype, ref_grad)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    seq=st.integers(0, 40),
    vocab=st.integers(1, 50),
    chunk=st.integers(1, 45),
    seed=st.integers(0, 2**16),
)
def test_local_chunked_property(batch, seq, vocab, chunk, seed):
    logits, targets, grad_out = inputs(batch, seq, vocab, torch.float32, seed)
    ref_out, ref_grad = reference(logits, targets, grad_out)
    out, grad, _ = run_kernel("local_chunked", logits, targets, grad_out, chunk)
    assert out.shape == (batch, seq)
    if seq:
        assert (out.double() - ref_out).abs().max().item() <= FP32_FWD_TOL
        assert (grad.double() - ref_grad).abs().max().item() <= bwd_tolerance(
            torch.float32, ref_grad
        )


@pytest.mark.parametrize("name", OUT_OF_PLACE)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inputs_unchanged_after_forward_and_backward(name, dtype):
    logits, targets, grad_out = inputs(2, 11, 13, dtype, seed=1)
    x = logits.clone().requires_grad_()
    t = targets.clone()
    out = get_kernel(name)(x, t, chunk_size=4)
    torch.autograd.grad(out, x, grad_out)
    assert torch.equal(x.detach(), logits)
    assert torch.equal(t, targets)


def test_inplace_variant_writes_gradient_into_the_logits():
    logits, targets, grad_out = inputs(2, 11, 13, torch.bfloat16, seed=2)
    x = logits.clone().requires_grad_()
    h = x * 1
    out = get_kernel("local_chunked_inplace")(h, targets, chunk_size=4)
    (grad,) = torch.autograd.grad(out, h, grad_out)
    assert grad.untyped_storage().data_ptr() == h.untyped_storage().data_ptr()
    _, ref_grad = reference(logits, targets, grad_out)
    assert (h.detach().double() - ref_grad).abs().max().item() <= bwd_tolerance(
        torch.bfloat16, ref_grad
    )
    assert targets.dtype == torch.int64


def _saved(fn):
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_local_chunked_saves_only_its_inputs(dtype):
    logits, targets, _ = inputs(2, 40, 64, dtype, seed=0)
    x = logits.clone().requires_grad_()
    _, saved = _saved(lambda: LocalChunkedLogprob.apply(x, targets, 8, False))
    bsv = x.numel()
    big = [t for t in saved if t.numel() >= bsv]
    assert len(big) == 1 and big[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert big[0].dtype == dtype  # saved in the logits' own dtype, no copy
    # the rest: the targets and the float32 per-token logsumexp, [B, S] each
    assert sorted(tuple(t.shape) for t in saved if t.numel() < bsv) == [(2, 40), (2, 40)]


def test_inference_only_and_no_grad_save_nothing():
    logits, targets, _ = inputs(2, 9, 16, torch.bfloat16, seed=0)
    x = logits.clone().requires_grad_()
    out, saved = _saved(lambda: LocalChunkedLogprob.apply(x, targets, 4, True))
    assert saved == []
    with pytest.raises(RuntimeError, match="saved nothing"):
        out.sum().backward()
    with torch.no_grad():
        out, saved = _saved(lambda: get_kernel("local_chunked")(x, targets))
    assert saved == [] and not out.requires_grad
    ref_out, _ = reference(logits, targets, torch.zeros(2, 9))
    assert (out.double() - ref_out).abs().max().item() <= FP32_FWD_TOL


@pytest.mark.parametrize("name", CHUNKED)
@pytest.mark.parametrize("bad", [0, -1, -1024])
def test_non_positive_chunk_size_is_rejected(name, bad):
    logits, targets, _ = inputs(1, 4, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="chunk_size"):
        get_kernel(name)(logits, targets, chunk_size=bad)


def test_local_chunked_apply_rejects_bad_chunk():
    logits, targets, _ = inputs(1, 4, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="chunk_size"):
        LocalChunkedLogprob.apply(logits, targets, 0, False)


@pytest.mark.parametrize("name", SINGLE_DEVICE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_zero_length_sequence(name, dtype):
    x = torch.randn(3, 0, 11).to(dtype).requires_grad_()
    h = x * 1
    out = get_kernel(name)(h, torch.zeros(3, 0, dtype=torch.long), chunk_size=4)
    assert out.shape == (3, 0) and out.dtype == torch.float32
    (grad,) = torch.autograd.grad(out, h, torch.zeros(3, 0))
    assert grad.shape == (3, 0, 11) and grad.dtype == dtype and not grad.any()


@pytest.mark.parametrize("name", SINGLE_DEVICE)
def test_bad_inputs_raise_value_error(name):
    fn = get_kernel(name)
    logits = torch.randn(2, 5, 7)
    good = torch.randint(0, 7, (2, 5))
    with pytest.raises(ValueError, match=r"\[0, 7\)"):
        fn(logits, torch.full((2, 5), 7))
    with pytest.raises(ValueError, match=r"\[0, 7\)"):
        fn(logits, torch.full((2, 5), -1))
    with pytest.raises(ValueError, match="targets must be"):
        fn(logits, good[:, :4])
    with pytest.raises(ValueError, match="floating point"):
        fn(torch.ones(2, 5, 7, dtype=torch.long), good)
    with pytest.raises(ValueError, match=r"\[B, S, V\]"):
        fn(logits[0], good[0])
    with pytest.raises(ValueError, match="integer"):
        fn(logits, good.float())


def test_unknown_kernel():
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        get_kernel("nope")


def test_filtered_top_k_and_top_p():
    logits = torch.tensor([[[4.0, 3.0, 0.0, -1.0]]])
    top = torch.tensor([[0]])
    kernel = get_kernel("filtered")
    assert kernel(logits, top, top_k=1).item() == 0.0
    assert kernel(logits, torch.tensor([[2]]), top_k=2).item() == float("-inf")
    kept = kernel(logits, torch.tensor([[1]]), top_k=2).item()
    assert kept == pytest.approx(3.0 - torch.logsumexp(torch.tensor([4.0, 3.0]), 0).item())
    # p(4.0) ≈ 0.71 < 0.8, so top_p=0.8 keeps the first two tokens only
    assert kernel(logits, torch.tensor([[1]]), top_p=0.8).item() == pytest.approx(kept)
    assert kernel(logits, torch.tensor([[2]]), top_p=0.8).item() == float("-inf")
    with pytest.raises(ValueError, match="top_p"):
        kernel(logits, top, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        kernel(logits, top, top_k=0)


def test_dispatcher_shifts_by_one_and_matches_the_reference():
    logits, ids, _ = inputs(2, 12, 17, torch.bfloat16, seed=5)
    x = logits.clone().requires_grad_()
    out = next_token_logprobs(x, ids, chunk_size=5)
    assert out.shape == (2, 11)
    ref = get_kernel("unchunked")(logits[:, :-1], ids[:, 1:])
    assert (out - ref).abs().max().item() <= FP32_FWD_TOL
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert grad.dtype == torch.bfloat16 and not grad[:, -1].any()


@pytest.mark.parametrize(
    ("kwargs", "kernel", "expected_dtype"),
    [
        ({}, "local_chunked", torch.bfloat16),
        ({"top_k": 5}, "filtered_chunked", torch.bfloat16),
        ({"top_p": 0.9}, "filtered_chunked", torch.bfloat16),
        ({"top_p": 0.9, "kernel": "filtered"}, "filtered", torch.float32),
        ({"kernel": "precast_chunked"}, "precast_chunked", torch.float32),
        ({"kernel": "local_chunked_inplace"}, "local_chunked_inplace", torch.bfloat16),
    ],
)
def test_dispatcher_pre_casts_only_for_kernels_that_do_not_cast_per_chunk(
    monkeypatch, kwargs, kernel, expected_dtype
):
    from dataclasses import replace

    from memprobe.kernels import registry

    seen = {}
    spec = registry.KERNELS[kernel]

    def spy(logits, targets, **kw):
        seen["dtype"] = logits.dtype
        seen["chunk_size"] = kw.get("chunk_size")
        return spec.fn(logits, targets, **kw)

    monkeypatch.setitem(registry.KERNELS, kernel, replace(spec, fn=spy))
    logits, ids, _ = inputs(1, 6, 9, torch.bfloat16, seed=0)
    next_token_logprobs(logits, ids, chunk_size=3, **kwargs)
    assert seen == {"dtype": expected_dtype, "chunk_size": 3}


def test_dispatcher_rejects_filters_on_a_chunked_kernel():
    logits, ids, _ = inputs(1, 6, 9, torch.float32, seed=0)
    with pytest.raises(ValueError, match="filtered"):
        next_token_logprobs(logits, ids, top_k=3, kernel="local_chunked")


def test_a_misspelt_kernel_name_gets_a_suggestion():
    from memprobe.kernels import get_spec

    with pytest.raises(ValueError, match=r"'local_chunkd' \(did you mean 'local_chunked'\?\);"):
        get_spec("local_chunkd")
