"""Float64 reference and tolerances shared by the kernel tests."""

from __future__ import annotations

import torch

# Float32 logits: forward and backward are float32 arithmetic end to end.
FP32_FWD_TOL = 2e-6
FP32_BWD_TOL = 2e-5
# bf16 / fp16 logits are exact inputs to float32 math, so the forward keeps
# the float32 tolerance. The gradient is rounded to the logits' dtype at the
# end: that adds at most half a unit in the last place of the largest
# gradient entry (bf16 keeps 8 significant bits, fp16 keeps 11).
HALF_ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 0.0}


def reference(logits: torch.Tensor, targets: torch.Tensor, grad_out: torch.Tensor):
    x = logits.detach().double().requires_grad_()
    out = torch.log_softmax(x, -1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    (grad,) = torch.autograd.grad(out, x, grad_out.double())
    return out.detach(), grad


def bwd_tolerance(dtype: torch.dtype, ref_grad: torch.Tensor) -> float:
    scale = ref_grad.abs().max().item() if ref_grad.numel() else 0.0
    return FP32_BWD_TOL + HALF_ULP[dtype] * scale


def inputs(batch: int, seq: int, vocab: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, seq, vocab, generator=gen) * 3).to(dtype)
    targets = torch.randint(0, vocab, (batch, seq), generator=gen)
    grad_out = torch.randn(batch, seq, generator=gen)
    return logits, targets, grad_out
