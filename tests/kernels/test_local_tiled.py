"""local_tiled: float64 agreement over tile sizes, and a peak within 2 % of its floor."""

from __future__ import annotations

import pytest
import torch
from reference import FP32_FWD_TOL, bwd_tolerance, inputs, reference

from memprobe.kernels import (
    DEFAULT_TILE_SIZE,
    DEFAULT_TILED_CHUNK_SIZE,
    local_tiled_inplace_logprobs,
    local_tiled_logprobs,
)
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.records import Case

V = 131_072
KERNELS = {"local_tiled": local_tiled_logprobs, "local_tiled_inplace": local_tiled_inplace_logprobs}


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("chunk, tile", [(2, 1), (3, 5), (7, 36), (64, 37), (None, 8), (5, None)])
def test_tiles_that_do_not_divide_the_vocabulary(name, dtype, chunk, tile):
    for seed in range(2):
        logits, targets, grad_out = inputs(2, 29, 37, dtype, seed)
        ref_out, ref_grad = reference(logits, targets, grad_out)
        x = logits.clone().requires_grad_()
        h = x * 1  # a non-leaf, as logits from an lm_head are
        out = KERNELS[name](h, targets, chunk_size=chunk, tile_size=tile)
        (grad,) = torch.autograd.grad(out, h, grad_out)
        assert grad.dtype == dtype and out.dtype == torch.float32
        assert (out.double() - ref_out).abs().max().item() <= FP32_FWD_TOL
        assert (grad.double() - ref_grad).abs().max().item() <= bwd_tolerance(dtype, ref_grad)


def test_a_row_of_minus_infinity_elsewhere_leaves_others_finite():
    logits = torch.randn(1, 4, 10)
    logits[0, 1, :7] = float("-inf")  # whole tiles of -inf before the finite ones
    targets = torch.tensor([[0, 8, 2, 3]])
    out = local_tiled_logprobs(logits, targets, chunk_size=2, tile_size=3)
    ref = torch.log_softmax(logits.double(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(out.double(), ref, atol=1e-6)


def test_bad_tile_size_is_rejected():
    logits, targets, _ = inputs(1, 3, 5, torch.float32, 0)
    for bad in (0, -2, True):
        with pytest.raises(ValueError, match="tile_size"):
            local_tiled_logprobs(logits, targets, tile_size=bad)


def _peak(kernel: str, tokens: int, chunk: int | None = None) -> tuple[int, int]:
    case = Case(kernel, 1, tokens, V, dtype="bf16", chunk_size=chunk, device="meta")
    tracker = simulate_tracker(case, capture_frames=False)
    floor = case.logits_bytes * (1 if kernel.endswith("inplace") else 2)
    return tracker.peak_bytes, floor


@pytest.mark.parametrize("tokens", [1024, 4096])
def test_peak_within_two_percent_of_the_floor(tokens):
    peak, floor = _peak("local_tiled", tokens)
    tile = 4 * DEFAULT_TILED_CHUNK_SIZE * DEFAULT_TILE_SIZE
    assert peak <= 1.02 * floor
    # The floor, one float32 tile, and per-token float32 vectors only.
    assert floor + tile < peak < floor + tile + 64 * tokens
    inplace, inplace_floor = _peak("local_tiled_inplace", tokens)
    assert inplace < inplace_floor + tile + 64 * tokens


def test_local_chunked_is_twice_its_floor_at_1024_tokens_where_tiled_is_not():
    chunked, floor = _peak("local_chunked", 1024, chunk=1024)
    tiled, _ = _peak("local_tiled", 1024, chunk=1024)
    assert chunked > 1.9 * floor and tiled < 1.02 * floor


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("tokens, vocab, chunk", [(3000, 50_000, 1024), (700, 9_000, 128)])
def test_the_shortened_meta_loops_simulate_the_full_step_exactly(
    monkeypatch, name, tokens, vocab, chunk
):
    # On meta each block loop runs its first two blocks and its last (see
    # memprobe.kernels._steps): peaks, what is live at the peak and the
    # allocator model's reserved peak must be those of the full loop.
    import memprobe.kernels.local_tiled as tiled
    from memprobe.measure.reserved import modelled_reserved_peak

    case = Case(name, 1, tokens, vocab, "bf16", chunk, device="meta")

    def summary(tracker):
        live = sorted((e.nbytes, e.dtype, e.op) for e in tracker.live_at_peak())
        reserved = modelled_reserved_peak(tracker.events)
        return tracker.peak_bytes, dict(tracker.phase_peaks), live, reserved

    short = simulate_tracker(case, capture_frames=False)
    monkeypatch.setattr(tiled, "block_starts", lambda stop, step, like: range(0, stop, step))
    full = simulate_tracker(case, capture_frames=False)
    assert len(short.events) < len(full.events)
    assert summary(short) == summary(full)
