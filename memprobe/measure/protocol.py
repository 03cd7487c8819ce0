"""The kernel's input protocol as an object: what a step of a kernel takes and gives back.

Two protocols (``KernelSpec.inputs``):

* ``logits`` — ``fn(logits [B,S,V], targets [B,S], *, chunk_size=None) -> [B,S]``;
  backward yields the logits' gradient. The floor is the logits and their gradient
  (the logits alone when backward writes into them).
* ``hidden`` — the hidden family: ``fn(hidden [B,S,H], weight [V,H], targets [B,S], *,
  chunk_size=None) -> [B,S]``, the logits being ``hidden @ weight.T`` (fused or not);
  backward yields the gradients of hidden and weight. The floor is hidden + weight +
  both gradients. It runs on one device (tp = cp = 1).

Each protocol says how to make the step's inputs (meta, cpu, cuda; and the small CPU
draw numerics verifies on), which inputs a peak counts from the start, how to call the
kernel, how to run backward, the floor and the float64 reference. Every backend (meta,
cpu, cuda), the tracer and numerics run any kernel through :func:`protocol_for`; none
asks which protocol it has.

Backward runs the way a training step sees it, ``torch.autograd.grad(out, leaves,
grad_outputs)``: the inputs come from an lm_head (or a decoder) in real training, so
there is no AccumulateGrad copy to count.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memprobe.kernels import get_spec
from memprobe.kernels.user import user_code
from memprobe.measure.parallel import RankLayout
from memprobe.measure.step import (
    SWEEP_FILTERS,
    StepInputs,
    checked_output,
    kernel_backward,
    kernel_call,
    make_inputs,
    refuse_written,
    torch_dtype,
    versions,
)
from memprobe.measure.tracker import AllocationTracker
from memprobe.records import Case

# Logits of the hidden family's verify inputs have about this standard deviation, as
# the logits kernels' verify draws them (randn x 3).
VERIFY_LOGIT_SCALE = 3.0
# The hidden family's verify shape: [B, S] tokens of the logits shape, this hidden
# size, and the same vocabulary (not a multiple of any tile).
VERIFY_HIDDEN = 48


# -- the hidden family's records ---------------------------------------------------
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


def hidden_shape(case: Case) -> HiddenShape:
    """A hidden-family case's shapes: hidden [B,S,H], weight [V,H]."""
    if case.hidden is None:
        raise ValueError(f"{case.kernel} takes hidden states: the case needs hidden=H")
    return HiddenShape(case.batch, case.tokens, case.hidden, case.vocab, torch_dtype(case.dtype))


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


# -- the hidden protocol for any callable (benchmarks and tests pass partials) ----------
HiddenKernel = Callable[..., torch.Tensor]


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


def traced_hidden_step(
    fn: HiddenKernel,
    inputs: HiddenInputs,
    *,
    chunk_size: int | None = None,
    capture_frames: bool = False,
) -> AllocationTracker:
    """Forward and backward of ``fn`` once under the allocation tracker, as
    :func:`memprobe.measure.traced.traced_step` runs a registered kernel; hidden and
    weight are counted from the start, the step's own tensors dropped before returning."""
    device = inputs.hidden.device.type  # its device's memory only, as traced_step counts
    tracker = AllocationTracker(capture_frames=capture_frames, device=device)
    for label, tensor in HIDDEN.leaves(inputs):
        tracker.track(tensor, op=f"input: {label}")
    with tracker:
        tracker.set_phase("forward")
        out = fn(inputs.hidden, inputs.weight, inputs.targets, chunk_size=chunk_size)
        tracker.set_phase("backward")
        grads = HIDDEN.backward(out, inputs)
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
    grad_h, grad_w = HIDDEN.backward(out, inputs)
    return (
        (out.double() - ref_out).abs().max().item(),
        (grad_h.double() - ref_gh).abs().max().item(),
        (grad_w.double() - ref_gw).abs().max().item(),
    )


# -- float64 references ------------------------------------------------------------
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


# -- the protocol --------------------------------------------------------------------
Forward = Callable[[Any], torch.Tensor]


class InputProtocol(ABC):
    """What a step of one kind of kernel takes, and how to run and check it."""

    name: str

    @abstractmethod
    def make_inputs(
        self, case: Case, device: str, *, seed: int = 0, layout: RankLayout | None = None
    ) -> Any:
        """The step's inputs on ``device`` (leaves that require grad, targets, the
        upstream gradient); on meta without values."""

    @abstractmethod
    def leaves(self, inputs: Any) -> tuple[tuple[str, torch.Tensor], ...]:
        """(label, tensor) of the inputs backward differentiates: the peaks count them
        from the start (targets and the upstream gradient, the same for every kernel
        of a protocol, are left out)."""

    @abstractmethod
    def forward(
        self, case: Case, *, layout: RankLayout | None = None, whole_vocab: bool = False
    ) -> Forward:
        """The case's kernel as ``f(inputs) -> log-probs [B,S]``; ``whole_vocab`` runs a
        vocabulary-parallel kernel on this rank alone over the whole vocabulary."""

    def backward(self, out: torch.Tensor, inputs: Any) -> tuple[torch.Tensor, ...]:
        """The gradients of :meth:`leaves`, as a training step's backward makes them."""
        leaves = tuple(t for _, t in self.leaves(inputs))
        return torch.autograd.grad(out, leaves, self._grad_outputs(out, inputs))

    def backward_of(self, case: Case) -> Callable[[torch.Tensor, Any], tuple[torch.Tensor, ...]]:
        """:meth:`backward` for ``case``'s kernel, run as its code (:func:`kernel_backward`),
        as :meth:`forward` calls it."""

        def backward(out: torch.Tensor, inputs: Any) -> tuple[torch.Tensor, ...]:
            leaves = self.leaves(inputs)
            before = versions(tuple(t for _, t in leaves))
            with kernel_backward(case.kernel):
                grads = self.backward(out, inputs)
            refuse_written(case.kernel, leaves, before)
            return grads

        return backward

    def _grad_outputs(self, out: torch.Tensor, inputs: Any) -> torch.Tensor:
        return inputs.grad_outputs

    @abstractmethod
    def floor_bytes(self, case: Case) -> int:
        """What must be resident whatever the kernel: its inputs and their gradients."""

    def unsupported_layout(self, tp: int, cp: int) -> str | None:
        """Why this protocol cannot run on this parallel layout, or None. The one rule:
        the sweep skips such cases and the planner refuses them, so neither answers with
        a whole-sequence simulation passed off as one rank's."""
        return None

    def unfit(self, case: Case) -> str | None:
        """Why this protocol cannot run ``case`` at all (it is then skipped), or None."""
        return self.unsupported_layout(case.tp, case.cp)

    @abstractmethod
    def verify_case(
        self, kernel: str, dtype: str, chunk_size: int | None, shape: tuple[int, int, int]
    ) -> Case:
        """The small CPU case numerics checks against float64 (``shape`` = B, S, V)."""

    @abstractmethod
    def verify_inputs(self, case: Case, *, seed: int, scale: float, offset: float) -> Any:
        """Inputs with values for that check."""

    @abstractmethod
    def reference(self, case: Case, inputs: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Log-probs and the gradients of :meth:`leaves` in float64, from the same values."""


class LogitsProtocol(InputProtocol):
    name = "logits"

    def make_inputs(
        self, case: Case, device: str, *, seed: int = 0, layout: RankLayout | None = None
    ) -> StepInputs:
        return make_inputs(case, device, seed=seed, layout=layout)

    def leaves(self, inputs: StepInputs) -> tuple[tuple[str, torch.Tensor], ...]:
        return (("logits", inputs.logits),)

    def forward(
        self, case: Case, *, layout: RankLayout | None = None, whole_vocab: bool = False
    ) -> Forward:
        call = kernel_call(case, whole_vocab=whole_vocab, layout=layout)
        return lambda inputs: call(inputs.logits, inputs.targets)

    def floor_bytes(self, case: Case) -> int:
        """The logits and their gradient (none when backward writes into the logits)."""
        return case.logits_bytes * (1 if get_spec(case.kernel).consumes_logits else 2)

    def verify_case(
        self, kernel: str, dtype: str, chunk_size: int | None, shape: tuple[int, int, int]
    ) -> Case:
        return Case(kernel, *shape, dtype=dtype, chunk_size=chunk_size, device="cpu")

    def verify_inputs(self, case: Case, *, seed: int, scale: float, offset: float) -> StepInputs:
        """Logits ``randn * scale + offset`` rounded to the dtype: a large ``offset``
        (every logit near 1e4) or ``scale`` checks that a kernel keeps the row max and
        the log-sum apart instead of subtracting two large numbers."""
        shape = (case.batch, case.tokens, case.vocab)
        gen = torch.Generator().manual_seed(seed)
        logits = (torch.randn(shape, generator=gen) * scale + offset).to(torch_dtype(case.dtype))
        targets = torch.randint(0, shape[2], shape[:2], generator=gen)
        if case.kernel in SWEEP_FILTERS:
            # Targets outside the kept set have log-prob -inf; take kept ones so
            # the comparison measures arithmetic, not the filter.
            targets = logits.float().argmax(-1)
        grad_outputs = torch.randn(shape[:2], generator=gen)
        # A copy: an in-place kernel writes its gradient into the logits it is given.
        return StepInputs(logits.clone().requires_grad_(), targets, grad_outputs)

    def reference(
        self, case: Case, inputs: StepInputs
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        if case.kernel in SWEEP_FILTERS:
            out, grad = filtered_reference(case, inputs.logits, inputs.targets, inputs.grad_outputs)
        else:
            out, grad = float64_reference(inputs.logits, inputs.targets, inputs.grad_outputs)
        return out, (grad,)


class HiddenProtocol(InputProtocol):
    name = "hidden"

    def make_inputs(
        self, case: Case, device: str, *, seed: int = 0, layout: RankLayout | None = None
    ) -> HiddenInputs:
        return make_hidden_inputs(hidden_shape(case), device, seed=seed)

    def leaves(self, inputs: HiddenInputs) -> tuple[tuple[str, torch.Tensor], ...]:
        return (("hidden", inputs.hidden), ("weight", inputs.weight))

    def forward(
        self, case: Case, *, layout: RankLayout | None = None, whole_vocab: bool = False
    ) -> Forward:
        fn: Any = get_spec(case.kernel).fn
        chunk = case.chunk_size

        def call(i: HiddenInputs) -> torch.Tensor:
            # As a logits kernel is called (kernel_call): a user's hidden kernel had none
            # of user_code's guards, so its print() went into `sweep --json`'s object and
            # the gradients it turned off failed every later case; nor was its result
            # checked to be one log-prob per target.
            grad_from = i.hidden.requires_grad or i.weight.requires_grad
            leaves = self.leaves(i)
            before = versions((i.hidden, i.weight))
            with user_code(case.kernel):
                out = fn(i.hidden, i.weight, i.targets, chunk_size=chunk)
            refuse_written(case.kernel, leaves, before)
            return checked_output(out, i.targets, grad_from=grad_from)

        return call

    def _grad_outputs(self, out: torch.Tensor, inputs: HiddenInputs) -> torch.Tensor:
        return inputs.grad_outputs.to(out.dtype)

    def floor_bytes(self, case: Case) -> int:
        """Hidden, weight and both their gradients."""
        return hidden_shape(case).floor_bytes

    def unsupported_layout(self, tp: int, cp: int) -> str | None:
        if tp > 1 or cp > 1:
            return "the hidden family runs on one device (tp = cp = 1)"
        return None

    def verify_case(
        self, kernel: str, dtype: str, chunk_size: int | None, shape: tuple[int, int, int]
    ) -> Case:
        b, s, v = shape
        return Case(kernel, b, s, v, dtype, chunk_size, device="cpu", hidden=VERIFY_HIDDEN)

    def verify_inputs(self, case: Case, *, seed: int, scale: float, offset: float) -> HiddenInputs:
        # The logits' spread comes from the weight's scale (VERIFY_LOGIT_SCALE); a
        # logits offset has no meaning for a matmul's output.
        return make_hidden_inputs(hidden_shape(case), "cpu", seed=seed)

    def reference(
        self, case: Case, inputs: HiddenInputs
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        out, grad_h, grad_w = hidden_float64_reference(inputs)
        return out, (grad_h, grad_w)


LOGITS = LogitsProtocol()
HIDDEN = HiddenProtocol()
PROTOCOLS: dict[str, InputProtocol] = {p.name: p for p in (LOGITS, HIDDEN)}


def protocol_for(kernel: str) -> InputProtocol:
    """The input protocol of a registered (or user) kernel."""
    return PROTOCOLS[get_spec(kernel).inputs]


def floor_bytes(case: Case) -> int:
    """What must be resident for ``case``, whichever inputs its kernel takes."""
    return protocol_for(case.kernel).floor_bytes(case)
