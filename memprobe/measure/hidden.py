"""One hidden-family step, measured: hidden ``[B,S,H]`` and weight ``[V,H]`` in, log-probs out.

The hidden family fuses (or not) the lm_head matmul with the log-prob, so its
step takes the hidden states and the lm_head weight, and its backward produces
both of their gradients. As for the logits kernels, backward runs the way a
training step sees it, ``torch.autograd.grad(out, (hidden, weight), grad_outputs)``:
no AccumulateGrad copies. The floor is what must be resident: hidden, weight
and their two gradients.

Kept free of :mod:`memprobe.records` so the sweep can wrap it whichever way
its records go; a kernel is any callable of the hidden protocol
``fn(hidden, weight, targets, *, chunk_size=None) -> [B, S]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from memprobe.measure.tracker import AllocationTracker

HiddenKernel = Callable[..., torch.Tensor]

# Logits of the verify inputs have about this standard deviation, as the
# logits kernels' verify draws them (randn x 3).
VERIFY_LOGIT_SCALE = 3.0


@dataclass(frozen=True)
class HiddenShape:
    """``B`` sequences of ``S`` tokens, hidden size ``H``, vocabulary ``V``, one dtype."""

    batch: int
    tokens: int
    hidden: int
    vocab: int
    dtype: torch.dtype = torch.bfloat16

    @property
    def element_bytes(self) -> int:
        return self.dtype.itemsize

    @property
    def hidden_bytes(self) -> int:
        return self.batch * self.tokens * self.hidden * self.element_bytes

    @property
    def weight_bytes(self) -> int:
        return self.vocab * self.hidden * self.element_bytes

    @property
    def floor_bytes(self) -> int:
        """Hidden, weight and their gradients (same dtype): what any route must hold."""
        return 2 * (self.hidden_bytes + self.weight_bytes)


@dataclass
class HiddenInputs:
    hidden: torch.Tensor  # [B, S, H], requires grad
    weight: torch.Tensor  # [V, H], requires grad
    targets: torch.Tensor  # [B, S] int64
    grad_outputs: torch.Tensor  # [B, S] float32


@dataclass(frozen=True)
class HiddenPeak:
    """Peaks of one hidden-family step, in bytes (inputs included)."""

    peak_bytes: int
    forward_peak_bytes: int
    backward_peak_bytes: int
    floor_bytes: int

    @property
    def over_floor(self) -> float:
        return self.peak_bytes / self.floor_bytes if self.floor_bytes else float("nan")


def make_hidden_inputs(
    shape: HiddenShape,
    device: str | torch.device,
    *,
    seed: int = 0,
    logit_scale: float = VERIFY_LOGIT_SCALE,
) -> HiddenInputs:
    """Hidden states, weight (leaves that require grad), targets and upstream gradient.

    On meta they carry no values. Elsewhere hidden is standard normal and the
    weight ``randn * logit_scale / sqrt(H)``, so the logits have a standard
    deviation of about ``logit_scale`` at any hidden size.
    """
    b, s, h, v = shape.batch, shape.tokens, shape.hidden, shape.vocab
    if torch.device(device).type == "meta":
        hidden = torch.empty((b, s, h), dtype=shape.dtype, device="meta")
        weight = torch.empty((v, h), dtype=shape.dtype, device="meta")
        targets = torch.empty((b, s), dtype=torch.long, device="meta")
        grad_outputs = torch.empty((b, s), dtype=torch.float32, device="meta")
    else:
        gen = torch.Generator(device=device).manual_seed(seed)
        # Drawn in their own dtype: a float32 draw cast down would hold a float32
        # staging copy of each (2 GiB for a 131,072 x 4096 weight) during setup.
        hidden = torch.randn((b, s, h), generator=gen, device=device, dtype=shape.dtype)
        weight = torch.randn((v, h), generator=gen, device=device, dtype=shape.dtype)
        weight.mul_(logit_scale / h**0.5)
        targets = torch.randint(0, v, (b, s), generator=gen, device=device)
        grad_outputs = torch.randn((b, s), generator=gen, device=device)
    return HiddenInputs(hidden.requires_grad_(), weight.requires_grad_(), targets, grad_outputs)


def traced_hidden_step(
    fn: HiddenKernel,
    inputs: HiddenInputs,
    *,
    chunk_size: int | None = None,
    capture_frames: bool = False,
) -> AllocationTracker:
    """Forward and backward once under the allocation tracker; hidden and weight
    are counted from the start, the step's own tensors are dropped before returning."""
    tracker = AllocationTracker(capture_frames=capture_frames)
    tracker.track(inputs.hidden, op="input: hidden")
    tracker.track(inputs.weight, op="input: weight")
    with tracker:
        tracker.set_phase("forward")
        out = fn(inputs.hidden, inputs.weight, inputs.targets, chunk_size=chunk_size)
        tracker.set_phase("backward")
        grads = torch.autograd.grad(
            out, (inputs.hidden, inputs.weight), inputs.grad_outputs.to(out.dtype)
        )
        del out, grads
    return tracker


def simulate_hidden(
    fn: HiddenKernel, shape: HiddenShape, *, chunk_size: int | None = None
) -> HiddenPeak:
    """Exact peaks of one step on meta tensors: any size, no real memory."""
    tracker = traced_hidden_step(fn, make_hidden_inputs(shape, "meta"), chunk_size=chunk_size)
    return HiddenPeak(
        peak_bytes=tracker.peak_bytes,
        forward_peak_bytes=tracker.phase_peaks.get("forward", 0),
        backward_peak_bytes=tracker.phase_peaks.get("backward", 0),
        floor_bytes=shape.floor_bytes,
    )


def hidden_float64_reference(
    inputs: HiddenInputs, *, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs and both gradients in float64, from the same input values."""
    h = inputs.hidden.detach().double().requires_grad_()
    w = inputs.weight.detach().double().requires_grad_()
    logits = (h @ w.t()) / temperature
    out = torch.log_softmax(logits, -1).gather(-1, inputs.targets.unsqueeze(-1)).squeeze(-1)
    grad_h, grad_w = torch.autograd.grad(out, (h, w), inputs.grad_outputs.double())
    return out.detach(), grad_h, grad_w


def verify_hidden(
    fn: HiddenKernel,
    shape: HiddenShape,
    *,
    seed: int = 0,
    chunk_size: int | None = None,
    logit_scale: float = VERIFY_LOGIT_SCALE,
) -> tuple[float, float, float]:
    """Max |error| against float64 on CPU: (forward, hidden gradient, weight gradient)."""
    inputs = make_hidden_inputs(shape, "cpu", seed=seed, logit_scale=logit_scale)
    ref_out, ref_gh, ref_gw = hidden_float64_reference(inputs)
    out = fn(inputs.hidden, inputs.weight, inputs.targets, chunk_size=chunk_size)
    grad_h, grad_w = torch.autograd.grad(
        out, (inputs.hidden, inputs.weight), inputs.grad_outputs.to(out.dtype)
    )
    return (
        (out.double() - ref_out).abs().max().item(),
        (grad_h.double() - ref_gh).abs().max().item(),
        (grad_w.double() - ref_gw).abs().max().item(),
    )
