"""filtered_chunked: filtered's kept set, values and gradient, in local_chunked's memory."""

from __future__ import annotations

import math

import pytest
import torch
from reference import FP32_FWD_TOL, bwd_tolerance

from memprobe.kernels import (
    FilteredChunkedLogprob,
    filtered_chunked_logprobs,
    filtered_logprobs,
    next_token_logprobs,
)
from memprobe.kernels.filtered import filtered_out_mask, mass_bits, top_p_masses
from memprobe.measure import step
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.measure.step import make_inputs
from memprobe.measure.traced import traced_step
from memprobe.records import Case

FILTERS = {
    "k": {"top_k": 5},
    "p": {"top_p": 0.9},
    "k+p": {"top_k": 40, "top_p": 0.7},
    "k+p, p cuts last": {"top_k": 4, "top_p": 0.999},
    "none": {},
}
# float32 rounds a log-prob of magnitude m to within m * 2^-24 (see test_large_logits).
FWD_RELATIVE_TOL = 2.0**-21


def _draw(shape, dtype, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(shape, generator=gen) * scale).to(dtype)
    targets = torch.randint(0, shape[2], shape[:2], generator=gen)
    # Half the targets the most likely token (kept), half at random (often dropped).
    targets[:, ::2] = logits.float().argmax(-1)[:, ::2]
    return logits, targets, torch.randn(shape[:2], generator=gen)


def _run(fn, logits, targets, grad_out, **kw):
    x = logits.clone().requires_grad_()
    out = fn(x, targets, **kw)
    (grad,) = torch.autograd.grad(out, x, grad_out)
    return out, grad


def _float64(logits, targets, grad_out, filters):
    drop = filtered_out_mask(logits.float(), top_k=filters.get("top_k"), top_p=filters.get("top_p"))
    x = logits.double().requires_grad_()
    masked = x if drop is None else x.masked_fill(drop, float("-inf"))
    out = torch.log_softmax(masked, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (grad,) = torch.autograd.grad(out, x, grad_out.double())
    return out.detach(), grad, drop


def _check(logits, targets, grad_out, filters, chunk):
    ref_out, ref_grad, drop = _float64(logits, targets, grad_out, filters)
    out, grad = _run(
        filtered_chunked_logprobs, logits, targets, grad_out, chunk_size=chunk, **filters
    )
    base_out, base_grad = _run(filtered_logprobs, logits, targets, grad_out, **filters)
    assert out.dtype == torch.float32 and grad.dtype == logits.dtype
    # The same kept set as filtered: -inf exactly where filtered has it, and no
    # gradient on a dropped logit.
    dropped = torch.isinf(ref_out)
    assert torch.equal(torch.isinf(out), dropped) and torch.equal(torch.isinf(base_out), dropped)
    if drop is not None:
        assert not grad[drop].any()
    kept = ~dropped
    fwd_tol = FP32_FWD_TOL + FWD_RELATIVE_TOL * ref_out[kept].abs().max().item()
    assert (out[kept].double() - ref_out[kept]).abs().max().item() <= fwd_tol
    err = (grad.double() - ref_grad).abs().max().item()
    base_err = (base_grad.double() - ref_grad).abs().max().item()
    assert err <= max(base_err, bwd_tolerance(logits.dtype, ref_grad)), (err, base_err)


@pytest.mark.parametrize("filters", list(FILTERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scale", [3.0, 30.0, 300.0])
def test_matches_filtered_and_float64(filters, dtype, scale):
    for seed, chunk in ((0, 7), (1, None)):
        logits, targets, grad_out = _draw((2, 29, 263), dtype, scale, seed)
        _check(logits, targets, grad_out, FILTERS[filters], chunk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("filters", ["p", "k+p", "k+p, p cuts last"])
def test_ties_at_the_threshold_are_kept_as_filtered_keeps_them(dtype, filters):
    # Integer logits: long runs of equal values, so top-p stops inside one often
    # (and top-k's k-th value has ties that topk leaves out).
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 3, (2, 23, 1201), generator=gen).to(dtype)
    targets = torch.randint(0, 1201, (2, 23), generator=gen)
    _check(logits, targets, torch.randn(2, 23, generator=gen), FILTERS[filters], 5)


def _exact_top_p_drop(logits, top_k, top_p):
    """filtered's top-p rule in Python integers, row by row: the spec, with no
    float sum whose order could differ between machines."""
    x = logits.float().reshape(-1, logits.shape[-1])
    drop = torch.zeros(x.shape, dtype=torch.bool)
    bits = mass_bits(x.shape[-1])
    for r, row in enumerate(x):
        by_k = top_k is not None and top_k < len(row)
        kept = (row >= torch.topk(row, top_k).values[-1]) if by_k else row == row
        q = top_p_masses(row - row.max(), bits).tolist()  # per element: no sum yet
        values = row.tolist()
        order = sorted((i for i in range(len(values)) if kept[i]), key=lambda i: (-values[i], i))
        limit = math.ceil(float(sum(q[i] for i in order)) * top_p)
        before = 0
        for i in order:
            kept[i] = before < limit
            before += q[i]
        drop[r] = ~kept
    return drop.view(logits.shape)


def _rows_near_a_boundary(top_k, top_p, rows=1000, vocab=2000, within=2e-6):
    """Integer-logit rows in which p of the (kept-by-k) mass lies within ``within``
    of the mass before some token: a float32 cumsum of probabilities (error ~1e-6
    here) can put the crossing on either side of that token."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randint(-3, 3, (rows, vocab), generator=gen).float()
    if top_k is not None:
        x_k = x.masked_fill(x < torch.topk(x, top_k).values[:, -1:], float("-inf"))
    else:
        x_k = x
    v = torch.sort(x_k, dim=-1, descending=True, stable=True).values
    cum = top_p_masses(v - v[:, :1], mass_bits(vocab)).cumsum(-1).double()
    gap = (cum - top_p * cum[:, -1:]).abs().min(dim=-1).values / cum[:, -1]
    return x[gap < within]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("filters", [{"top_p": 0.9}, {"top_k": 1500, "top_p": 0.9}])
def test_top_p_keeps_what_exact_integer_sums_keep(dtype, filters):
    # Long runs of tied logits put p's crossing inside a run, and in these rows
    # within a float rounding of a token boundary: float sums of probabilities
    # decided them differently on different cpus (summation order). Both kernels
    # must keep exactly the tokens that exact integer sums keep.
    near = _rows_near_a_boundary(filters.get("top_k"), filters["top_p"])
    assert len(near) >= 10
    logits = near.to(dtype).unsqueeze(0)
    shape = logits.shape[:2]
    gen = torch.Generator().manual_seed(8)
    targets = torch.randint(0, logits.shape[-1], shape, generator=gen)
    targets[:, ::2] = logits.float().argmax(-1)[:, ::2]  # kept
    spec = _exact_top_p_drop(logits, filters.get("top_k"), filters["top_p"])
    mask = filtered_out_mask(logits.float(), top_k=filters.get("top_k"), top_p=filters["top_p"])
    assert torch.equal(mask, spec)
    _check(logits, targets, torch.randn(shape, generator=gen), filters, 3)
    # Every kept logit gets a gradient (its softmax is far from underflow here).
    x = logits.clone().requires_grad_()
    (grad,) = torch.autograd.grad(
        filtered_chunked_logprobs(
            x, targets, top_p=0.9, **{k: v for k, v in filters.items() if k != "top_p"}
        ).sum(),
        x,
    )
    assert torch.equal(grad != 0, ~spec)


@pytest.mark.parametrize("cap", [1024, 3])
def test_rows_the_histogram_cannot_settle_are_sorted(monkeypatch, cap):
    # Two values only: 1,250 logits in a bucket, more than a topk of 1,024 holds
    # (and with a cap of 3 every row of a normal draw falls back too).
    import memprobe.kernels.filtered_select as fc

    monkeypatch.setattr(fc, "BUCKET_CAP", cap)
    gen = torch.Generator().manual_seed(5)
    flat = torch.randint(0, 2, (1, 6, 2500), generator=gen).float()
    _check(
        flat, torch.randint(0, 2500, (1, 6), generator=gen), torch.randn(1, 6), {"top_p": 0.6}, 4
    )
    logits, targets, grad_out = _draw((2, 9, 263), torch.bfloat16, 3.0, 6)
    _check(logits, targets, grad_out, {"top_p": 0.9}, 4)


def test_ties_by_hand():
    # top-k keeps every logit equal to the k-th; top-p stops inside a run of ties
    # and keeps its first in vocabulary order, as filtered's stable sort does.
    x = torch.tensor([[[4.0, 3.0, 3.0, 3.0, 0.0]]])
    for t, kept in enumerate([True, True, True, True, False]):
        value = filtered_chunked_logprobs(x, torch.tensor([[t]]), top_k=2).item()
        assert (value > float("-inf")) == kept
    zeros = torch.zeros(1, 1, 10)
    for t in range(10):
        ours = filtered_chunked_logprobs(zeros, torch.tensor([[t]]), top_p=0.35).item()
        theirs = filtered_logprobs(zeros, torch.tensor([[t]]), top_p=0.35).item()
        assert ours == theirs == (torch.tensor(0.25).log().item() if t < 4 else float("-inf"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_inputs_unchanged_after_forward_and_backward(dtype):
    logits, targets, grad_out = _draw((2, 11, 97), dtype, 3.0, 4)
    x, t = logits.clone().requires_grad_(), targets.clone()
    out = filtered_chunked_logprobs(x, t, chunk_size=4, top_k=10, top_p=0.8)
    torch.autograd.grad(out, x, grad_out)
    assert torch.equal(x.detach(), logits) and torch.equal(t, targets)


def test_saves_only_the_inputs_and_three_numbers_per_token():
    logits, targets, _ = _draw((2, 40, 64), torch.bfloat16, 3.0, 0)
    x = logits.clone().requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        FilteredChunkedLogprob.apply(x, targets, 8, 10, 0.9, False)
    big = [t for t in saved if t.numel() >= x.numel()]
    assert len(big) == 1 and big[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    small = [tuple(t.shape) for t in saved if t.numel() < x.numel()]
    assert small == [(2, 40)] * 4  # targets, tau, cut, logsum


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("filters", [{"top_k": 50, "top_p": 0.9}, {"top_p": 0.9}])
@pytest.mark.parametrize("chunk", [64, 16])
def test_meta_peak_equals_a_real_cpu_run_to_the_byte(monkeypatch, dtype, filters, chunk):
    monkeypatch.setitem(step.SWEEP_FILTERS, "filtered_chunked", filters)
    # Bf16 draws tie often, so the tie fix-ups run on cpu (and are skipped on meta).
    # Chunk 16 makes 10 chunks (the last ragged), of which meta runs only the first
    # two and the last (kernels._steps.block_starts): the same peak.
    shape = (1, 150, 2048)
    meta = simulate_tracker(Case("filtered_chunked", *shape, dtype, chunk, device="meta"))
    case = Case("filtered_chunked", *shape, dtype, chunk, device="cpu")
    cpu = traced_step(case, make_inputs(case, "cpu"), capture_frames=False).tracker
    assert meta.peak_bytes == cpu.peak_bytes
    assert dict(meta.phase_peaks) == dict(cpu.phase_peaks)


def test_headline_peak_within_ten_percent_of_its_floor():
    case = Case("filtered_chunked", 1, 20_000, 131_072, "bf16", 1024, device="meta")
    floor = 2 * case.logits_bytes
    peak = simulate_tracker(case, capture_frames=False).peak_bytes
    filtered = simulate_tracker(
        Case("filtered", 1, 20_000, 131_072, "bf16", None, device="meta"), capture_frames=False
    ).peak_bytes
    # The floor, one float32 chunk (bf16 logits need no bool mask), and [B, S] vectors.
    chunk = 1024 * 131_072
    assert floor + 4 * chunk < peak <= floor + 4 * chunk + 64 * 20_000
    assert peak <= 1.1 * floor < filtered / 7


def test_the_dispatcher_filters_with_the_chunked_kernel_without_a_pre_cast():
    logits, ids, _ = _draw((2, 12, 50), torch.bfloat16, 3.0, 5)
    x = logits.clone().requires_grad_()
    out = next_token_logprobs(x, ids, top_k=8, top_p=0.9, chunk_size=5)
    ref = filtered_logprobs(logits[:, :-1], ids[:, 1:], top_k=8, top_p=0.9)
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    assert (out[~torch.isinf(out)] - ref[~torch.isinf(ref)]).abs().max().item() <= FP32_FWD_TOL
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert grad.dtype == torch.bfloat16 and not grad[:, -1].any()


def test_bad_filters_are_rejected():
    logits, targets, _ = _draw((1, 3, 8), torch.float32, 3.0, 0)
    with pytest.raises(ValueError, match="top_p"):
        filtered_chunked_logprobs(logits, targets, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        filtered_chunked_logprobs(logits, targets, top_k=0)


def _p_keeping(logits, n_kept, top_k=None):
    """A top_p under which filtered's exact integer rule keeps exactly the first
    ``n_kept`` tokens of the row's (kept-by-k) stable descending order."""
    row = logits.float().reshape(-1)
    if top_k is not None:
        row = row.masked_fill(row < torch.topk(row, top_k).values[-1], float("-inf"))
    ordered = torch.sort(row, descending=True, stable=True).values
    q = top_p_masses(ordered - ordered[0], mass_bits(len(row))).tolist()
    before, total = sum(q[: n_kept - 1]), sum(q)
    # A limit in (before, before + q_n] keeps the n-th token (the mass before it is
    # below) and drops the next; the middle of that range survives float64 rounding.
    return (before + q[n_kept - 1] / 2) / total


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("top_k", [None, 700])
@pytest.mark.parametrize("kept_ties", [1, 9, 10])
def test_a_run_of_ties_at_the_end_of_the_vocabulary_cut_by_top_p(dtype, top_k, kept_ties):
    # The last ten vocabulary entries tie; top-p stops on the first, the ninth, or
    # the last of them (index V - 1): the ties after the cut get -inf and no
    # gradient, and the kept ones filtered's gradient.
    vocab, run = 1000, 10
    gen = torch.Generator().manual_seed(11)
    logits = (torch.randn(1, 1, vocab, generator=gen) * 2).to(dtype)
    logits[..., vocab - run :] = 0.75
    above = int((logits.float() > 0.75).sum())
    top_p = _p_keeping(logits, above + kept_ties, top_k)
    filters = {"top_p": top_p} if top_k is None else {"top_k": top_k, "top_p": top_p}
    kept = ~filtered_out_mask(logits.float(), **{"top_k": top_k, "top_p": top_p})
    assert kept[..., vocab - run :].sum() == kept_ties and kept[..., vocab - run].all()
    # Two positions, so the chunk of one runs the row twice; targets on the run.
    logits = logits.expand(1, 3, vocab).contiguous()
    targets = torch.tensor([[vocab - 1, vocab - run + kept_ties - 1, vocab - run]])
    _check(logits, targets, torch.tensor([[0.5, -1.0, 2.0]]), filters, 1)
    x = logits.clone().requires_grad_()
    (grad,) = torch.autograd.grad(filtered_chunked_logprobs(x, targets, **filters).sum(), x)
    assert torch.equal(grad[0, 0] != 0, kept[0, 0])


@pytest.mark.parametrize("room", [0, 1])
def test_rows_whose_top_k_ties_overrun_the_list_are_counted_alone(monkeypatch, room):
    # bf16 draws tie at the k-th value now and then: with no room past k every row
    # is redone alone; with one, 3 of these 26 rows' runs overrun topk's list (redone
    # alone) and the others are settled by it.
    import memprobe.kernels.filtered_select as fc

    monkeypatch.setattr(fc, "TIE_ROOM", room)
    logits, targets, grad_out = _draw((2, 13, 263), torch.bfloat16, 1.0, 9)
    for filters in ({"top_k": 30, "top_p": 0.8}, {"top_k": 30}):
        _check(logits, targets, grad_out, filters, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("filters", ["p", "k+p", "none"])
def test_minus_inf_logits(dtype, filters):
    # A masked vocabulary tail (-inf) is dropped by every filter and gets no
    # gradient; 16-bit backward's x - tau shift must not turn it into nan.
    logits, targets, grad_out = _draw((2, 9, 300), dtype, 3.0, 10)
    logits[..., 250:] = float("-inf")
    targets[:, 1::4] = 280
    _check(logits, targets, grad_out, FILTERS[filters], 4)
