"""The hidden family: float64 agreement for both gradients, and memory on meta."""

from __future__ import annotations

import functools

import pytest
import torch
from reference import FP32_FWD_TOL, bwd_tolerance

from memprobe.kernels import (
    KernelUnavailable,
    fused_linear_chunked_logprobs,
    get_kernel,
    kernel_names,
)
from memprobe.kernels.fused_linear import default_rows
from memprobe.measure.protocol import (
    HiddenShape,
    hidden_float64_reference,
    make_hidden_inputs,
    simulate_hidden,
    traced_hidden_step,
)

HIDDEN = kernel_names(inputs="hidden")
# The logits are a float32 sum of H products here, not given: a few more ulps
# than the logits kernels' forward tolerance.
HIDDEN_FWD_TOL = 2 * FP32_FWD_TOL
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _run(fn, inputs):
    out = fn(inputs.hidden, inputs.weight, inputs.targets)
    grads = torch.autograd.grad(out, (inputs.hidden, inputs.weight), inputs.grad_outputs)
    return out, *grads


def _errors(fn, shape, seed):
    inputs = make_hidden_inputs(shape, "cpu", seed=seed)
    ref = hidden_float64_reference(inputs)
    got = _run(fn, inputs)
    errs = [(g.double() - r).abs().max().item() for g, r in zip(got, ref, strict=True)]
    return errs, ref, got


def test_registry_lists_the_hidden_family():
    assert HIDDEN == [
        "linear_unchunked",
        "linear_local_chunked",
        "torch_linear_ce",
        "torch_linear_ce_accurate",
        "fused_linear_chunked",
    ]
    assert not set(HIDDEN) & set(kernel_names())  # the default list is logits kernels


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chunk, tile", [(3, 29), (7, 13), (16, 64), (None, None), (64, 300)])
def test_fused_matches_float64_to_the_final_rounding(dtype, chunk, tile):
    # V = 301 is prime: no tile divides it; 37 tokens: no chunk divides them.
    shape = HiddenShape(2, 37 // 2 + 1, 48, 301, dtype)
    fn = functools.partial(fused_linear_chunked_logprobs, chunk_size=chunk, tile_size=tile)
    for seed in range(3):
        (e_out, e_h, e_w), ref, got = _errors(fn, shape, seed)
        assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == dtype
        assert e_out <= HIDDEN_FWD_TOL
        assert e_h <= bwd_tolerance(dtype, ref[1])
        assert e_w <= bwd_tolerance(dtype, ref[2])


def test_fused_is_at_least_as_accurate_as_torch_accurate():
    shape = HiddenShape(1, 64, 32, 500, torch.bfloat16)
    ours = torch_errs = None
    for seed in range(2):
        ours, _, _ = _errors(
            functools.partial(fused_linear_chunked_logprobs, chunk_size=32), shape, seed
        )
        torch_errs, _, _ = _errors(get_kernel("torch_linear_ce_accurate"), shape, seed)
        assert all(o <= t * 1.01 + 1e-6 for o, t in zip(ours, torch_errs, strict=True)), (
            ours,
            torch_errs,
        )


def test_fused_temperature():
    shape = HiddenShape(1, 9, 16, 50, torch.float32)
    inputs = make_hidden_inputs(shape, "cpu", seed=4)
    ref = hidden_float64_reference(inputs, temperature=0.7)
    out = fused_linear_chunked_logprobs(
        inputs.hidden, inputs.weight, inputs.targets, chunk_size=4, tile_size=7, temperature=0.7
    )
    grads = torch.autograd.grad(out, (inputs.hidden, inputs.weight), inputs.grad_outputs)
    for got, want in zip((out, *grads), ref, strict=True):
        assert (got.double() - want).abs().max().item() <= 2e-5
    with pytest.raises(ValueError, match="temperature"):
        fused_linear_chunked_logprobs(inputs.hidden, inputs.weight, inputs.targets, temperature=0)


@pytest.mark.parametrize("name", HIDDEN)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_hidden_kernel_runs_and_leaves_its_inputs_alone(name, dtype):
    inputs = make_hidden_inputs(HiddenShape(2, 5, 8, 11, dtype), "cpu", seed=1)
    before = (inputs.hidden.detach().clone(), inputs.weight.detach().clone())
    out, grad_h, grad_w = _run(get_kernel(name), inputs)
    assert out.shape == (2, 5) and out.dtype == torch.float32
    assert grad_h.shape == (2, 5, 8) and grad_w.shape == (11, 8)
    assert torch.equal(inputs.hidden, before[0]) and torch.equal(inputs.weight, before[1])
    ref = hidden_float64_reference(inputs)[0]
    # bf16 logits (unfused, torch) round to 8 bits: loose, but catches a wrong sign or target.
    assert (out.double() - ref).abs().max().item() < 0.1


@pytest.mark.parametrize("name", HIDDEN)
def test_bad_hidden_inputs_raise_value_error(name):
    fn = get_kernel(name)
    hidden, weight = torch.randn(1, 3, 4), torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        fn(hidden, weight, torch.tensor([[0, 1, 5]]))
    with pytest.raises(ValueError, match="hidden size"):
        fn(hidden, torch.randn(5, 3), torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match="dtype"):
        fn(hidden, weight.double(), torch.tensor([[0, 1, 2]]))


def test_the_logits_dispatcher_refuses_a_hidden_kernel():
    from memprobe.kernels import next_token_logprobs

    with pytest.raises(ValueError, match="hidden states"):
        next_token_logprobs(
            torch.randn(1, 3, 5), torch.zeros(1, 3, dtype=torch.long), kernel="fused_linear_chunked"
        )


def test_torch_route_is_unavailable_without_the_api(monkeypatch):
    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy")
    inputs = make_hidden_inputs(HiddenShape(1, 2, 4, 5, torch.float32), "cpu")
    with pytest.raises(KernelUnavailable, match="linear_cross_entropy"):
        _run(get_kernel("torch_linear_ce"), inputs)
    assert issubclass(KernelUnavailable, NotImplementedError)


# -- memory, simulated on meta ------------------------------------------------
SHAPE = HiddenShape(1, 1024, 4096, 16_384)  # small enough to simulate in a second


@pytest.fixture(scope="module")
def fused_trace():
    return traced_hidden_step(fused_linear_chunked_logprobs, make_hidden_inputs(SHAPE, "meta"))


def test_fused_peak_is_the_floor_plus_a_few_tiles(fused_trace):
    rows = default_rows(SHAPE.hidden)
    assert rows == 512
    block = 4 * rows * SHAPE.hidden  # one float32 [512, H] block: 8 MiB
    assert SHAPE.floor_bytes == 2 * (2 * 1024 * 4096 + 2 * 16_384 * 4096)
    workspace = 3 * block + 4 * rows * rows + 64 * SHAPE.tokens
    assert SHAPE.floor_bytes < fused_trace.peak_bytes <= SHAPE.floor_bytes + workspace


def test_fused_never_allocates_logits_or_float32_weight_sized_blocks(fused_trace):
    n, v, h = SHAPE.batch * SHAPE.tokens, SHAPE.vocab, SHAPE.hidden
    allocs = [e for e in fused_trace.events if e.action == "alloc" and not e.op.startswith("input")]
    largest_fp32 = max(e.nbytes for e in allocs if e.dtype == "torch.float32")
    assert largest_fp32 <= 4 * default_rows(h) * h < 4 * min(n, v) * h
    assert not [e.shape for e in allocs if n in e.shape and v in e.shape]


def test_unfused_routes_hold_the_logits():
    bsv = 2 * SHAPE.tokens * SHAPE.vocab
    chunked = simulate_hidden(get_kernel("linear_local_chunked"), SHAPE)
    # Inputs, bf16 logits and their gradient, and local_chunked's float32 chunk
    # (all 1024 tokens: twice the bytes of the bf16 logits).
    assert chunked.peak_bytes > SHAPE.hidden_bytes + SHAPE.weight_bytes + 4 * bsv


@pytest.mark.parametrize("logit_scale", [30.0, 300.0])
def test_fused_gradients_keep_their_precision_at_large_logits(logit_scale):
    # The backward recomputes bf16 logits centered on each row's max: uncentered,
    # logits near 100 would round by 0.25 and the softmax by 20%.
    shape = HiddenShape(1, 64, 32, 500, torch.bfloat16)
    for seed in range(3):
        inputs = make_hidden_inputs(shape, "cpu", seed=seed, logit_scale=logit_scale)
        ref = hidden_float64_reference(inputs)
        got = _run(fused_linear_chunked_logprobs, inputs)
        errs = [(g.double() - r).abs().max().item() for g, r in zip(got, ref, strict=True)]
        # float32 logits of size |x| carry |x| * 2**-24 each: the forward's bound.
        logit_size = (inputs.hidden.double() @ inputs.weight.double().t()).abs().max().item()
        assert errs[0] <= 4 * logit_size * 2**-24
        assert errs[1] <= bwd_tolerance(torch.bfloat16, ref[1])
        assert errs[2] <= bwd_tolerance(torch.bfloat16, ref[2])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_leaves_the_cpu_matmul_precision_as_it_found_it(dtype):
    matmul = torch.backends.mkldnn.matmul
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "ieee"
        inputs = make_hidden_inputs(HiddenShape(1, 8, 16, 40, dtype), "cpu")
        _run(fused_linear_chunked_logprobs, inputs)
        assert matmul.fp32_precision == "ieee"
    finally:
        matmul.fp32_precision = before


@pytest.mark.parametrize("b, s, h, v", [(1, 1, 8, 1), (1, 1, 8, 5), (3, 2, 4, 7), (1, 40, 8, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_edge_shapes(b, s, h, v, dtype):
    # One vocabulary entry (softmax 1, gradient 0), one token, more tokens than vocabulary.
    for seed in range(2):
        (e_out, e_h, e_w), ref, _ = _errors(
            fused_linear_chunked_logprobs, HiddenShape(b, s, h, v, dtype), seed
        )
        assert e_out <= HIDDEN_FWD_TOL
        assert e_h <= bwd_tolerance(dtype, ref[1])
        assert e_w <= bwd_tolerance(dtype, ref[2])


@pytest.mark.parametrize(
    "shape, chunk",
    [
        (HiddenShape(1, 1000, 64, 5000), None),  # no block divides the tokens or vocabulary
        (HiddenShape(2, 300, 32, 2000, torch.float32), 64),
        (HiddenShape(1, 4096, 256, 32768), None),
    ],
)
def test_the_shortened_meta_loops_simulate_the_full_step_exactly(monkeypatch, shape, chunk):
    # On meta each block loop runs its first two blocks and its last: the peaks,
    # what is live at the peak and the allocator model's reserved peak must be
    # those of the full loop.
    import memprobe.kernels.fused_linear as fused
    from memprobe.measure.reserved import modelled_reserved_peak

    def summary(tracker):
        live = sorted((e.nbytes, e.dtype, e.op) for e in tracker.live_at_peak())
        reserved = modelled_reserved_peak(tracker.events)
        return tracker.peak_bytes, dict(tracker.phase_peaks), live, reserved

    def step():
        inputs = make_hidden_inputs(shape, "meta")
        return traced_hidden_step(fused_linear_chunked_logprobs, inputs, chunk_size=chunk)

    short = step()
    monkeypatch.setattr(fused, "block_starts", lambda stop, step, like: range(0, stop, step))
    full = step()
    assert len(short.events) < len(full.events)
    assert summary(short) == summary(full)
