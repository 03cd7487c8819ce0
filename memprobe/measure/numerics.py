"""Worst-case deviation of a kernel from a float64 reference, at a small CPU shape."""

from __future__ import annotations

from functools import cache

import torch

from memprobe.measure.parallel import RankLayout
from memprobe.measure.step import SWEEP_FILTERS, kernel_call, process_group_for, torch_dtype
from memprobe.records import Case

# Small enough to run in milliseconds, odd sizes so chunks do not divide S,
# and a chunk of 7 so every chunked kernel really loops.
VERIFY_SHAPE = (2, 67, 263)
VERIFY_CHUNK = 7
# Standard normal draws times this: logits of a typical spread.
VERIFY_SCALE = 3.0


def float64_reference(
    logits: torch.Tensor, targets: torch.Tensor, grad_outputs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and their gradient computed in float64 from the same input values."""
    x = logits.detach().double().requires_grad_()
    out = torch.log_softmax(x, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (grad,) = torch.autograd.grad(out, x, grad_outputs.double())
    return out.detach(), grad


def filtered_reference(
    case: Case, logits: torch.Tensor, targets: torch.Tensor, grad_outputs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The filtered kernel's float64 reference: the same keep-mask, float64 math."""
    from memprobe.kernels.filtered import filtered_out_mask

    drop = filtered_out_mask(logits.float(), **SWEEP_FILTERS[case.kernel])
    x = logits.detach().double().requires_grad_()
    masked = x if drop is None else x.masked_fill(drop, float("-inf"))
    out = torch.log_softmax(masked, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (grad,) = torch.autograd.grad(out, x, grad_outputs.double())
    return out.detach(), grad


# The hidden family's verify shape: [B, S] tokens of the logits shape, a hidden size,
# and the same vocabulary (not a multiple of any tile).
VERIFY_HIDDEN = 48


def _verify_hidden(
    kernel: str, dtype: str, seed: int, chunk_size: int | None, shape: tuple[int, int, int]
) -> tuple[float, float]:
    """(forward error, the worse of the hidden and weight gradients' errors)."""
    from memprobe.kernels import get_spec
    from memprobe.measure.hidden import HiddenShape, verify_hidden

    b, s, v = shape
    hidden_shape = HiddenShape(b, s, VERIFY_HIDDEN, v, torch_dtype(dtype))
    fwd, grad_h, grad_w = verify_hidden(
        get_spec(kernel).fn, hidden_shape, seed=seed, chunk_size=chunk_size
    )
    return fwd, max(grad_h, grad_w)


@cache
def verify(
    kernel: str,
    dtype: str,
    seed: int = 0,
    chunk_size: int | None = VERIFY_CHUNK,
    shape: tuple[int, int, int] = VERIFY_SHAPE,
    *,
    scale: float = VERIFY_SCALE,
    offset: float = 0.0,
    layout: RankLayout | None = None,
) -> tuple[float, float]:
    """(max |forward error|, max |backward error|) against float64, on CPU.

    Logits are ``randn * scale + offset`` (rounded to ``dtype``): a large
    ``offset`` (every logit near 1e4) or ``scale`` (logits x100) checks that a
    kernel keeps the row max and the log-sum apart instead of subtracting two
    large numbers.
    """
    from memprobe.kernels import get_spec

    if get_spec(kernel).inputs == "hidden":
        return _verify_hidden(kernel, dtype, seed, chunk_size, shape)
    case = Case(kernel, *shape, dtype=dtype, chunk_size=chunk_size, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(shape, generator=gen) * scale + offset).to(torch_dtype(dtype))
    targets = torch.randint(0, shape[2], shape[:2], generator=gen)
    if kernel in SWEEP_FILTERS:
        # Targets outside the kept set have log-prob -inf; take kept ones so
        # the comparison measures arithmetic, not the filter.
        targets = logits.float().argmax(-1)
    grad_outputs = torch.randn(shape[:2], generator=gen)
    if kernel in SWEEP_FILTERS:
        ref_out, ref_grad = filtered_reference(case, logits, targets, grad_outputs)
    else:
        ref_out, ref_grad = float64_reference(logits, targets, grad_outputs)
    x = logits.clone().requires_grad_()
    with process_group_for(case):  # one rank: the whole vocabulary
        out = kernel_call(case, whole_vocab=True, layout=layout)(x, targets)
        (grad,) = torch.autograd.grad(out, x, grad_outputs)
    err_fwd = (out.double() - ref_out).abs().max().item()
    err_bwd = (grad.double() - ref_grad).abs().max().item()
    return err_fwd, err_bwd
