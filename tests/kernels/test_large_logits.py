"""Large logits: a common offset (+1e4) and a large scale (x100), against float64.

A kernel that adds the row max to the log-sum and subtracts the sum again
(``x - (max + log Σ)``) rounds at an ulp of the logits: 1e-3 at 1e4 in
float32. Every logits kernel must meet the tolerance ``unchunked`` meets.
"""

from __future__ import annotations

import pytest
import torch
from reference import FP32_FWD_TOL, bwd_tolerance

from memprobe.kernels import KERNELS
from memprobe.measure.numerics import VERIFY_SCALE, verify
from memprobe.measure.step import torch_dtype

LOGITS_KERNELS = [n for n, s in KERNELS.items() if getattr(s, "inputs", "logits") == "logits"]
# name -> (scale, offset) of randn * scale + offset, as numerics.verify draws them.
REGIMES = {"offset": (VERIFY_SCALE, 1e4), "scaled": (100 * VERIFY_SCALE, 0.0)}
SHAPE = (2, 67, 263)
# float32 rounds a log-prob of magnitude m to within m * 2^-24; the reference
# kernel's own log_softmax stays within a few of those ulps.
FWD_RELATIVE_TOL = 2.0**-21


def _tolerances(dtype: str, seed: int, scale: float, offset: float) -> tuple[float, float]:
    """Forward and backward tolerances from the float64 result on verify's inputs."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(SHAPE, generator=gen) * scale + offset).to(torch_dtype(dtype))
    targets = torch.randint(0, SHAPE[2], SHAPE[:2], generator=gen)
    grad_out = torch.randn(SHAPE[:2], generator=gen)
    x = logits.double().requires_grad_()
    out = torch.log_softmax(x, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (grad,) = torch.autograd.grad(out, x, grad_out.double())
    fwd = FP32_FWD_TOL + FWD_RELATIVE_TOL * out.abs().max().item()
    return fwd, bwd_tolerance(torch_dtype(dtype), grad)


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kernel", [k for k in LOGITS_KERNELS if k != "filtered"])
def test_large_logits_match_float64(kernel, dtype, regime):
    scale, offset = REGIMES[regime]
    for seed in range(2):
        fwd_tol, bwd_tol = _tolerances(dtype, seed, scale, offset)
        for chunk in (7, None):
            err_fwd, err_bwd = verify(kernel, dtype, seed, chunk, SHAPE, scale=scale, offset=offset)
            assert err_fwd <= fwd_tol, (chunk, err_fwd, fwd_tol)
            assert err_bwd <= bwd_tol, (chunk, err_bwd, bwd_tol)


def test_the_offset_case_catches_a_rounded_logsumexp():
    """The tolerance is tight enough to see the bug it guards against."""
    scale, offset = REGIMES["offset"]
    fwd_tol, _ = _tolerances("fp32", 0, scale, offset)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(SHAPE, generator=gen) * scale + offset
    targets = torch.randint(0, SHAPE[2], SHAPE[:2], generator=gen)
    row_max = logits.amax(-1, keepdim=True)
    lse = row_max + (logits - row_max).exp().sum(-1, keepdim=True).log()
    rounded = (logits.gather(-1, targets.unsqueeze(-1)) - lse).squeeze(-1)
    exact = torch.log_softmax(logits.double(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert (rounded.double() - exact).abs().max().item() > 10 * fwd_tol
