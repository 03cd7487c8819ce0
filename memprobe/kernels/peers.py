"""GPU peers: Liger-Kernel's and Cut Cross-Entropy's losses, as optional memprobe kernels.

The kernels a team would otherwise pick, measured beside memprobe's own:

* ``liger_fused_linear_ce`` (hidden family) — Liger-Kernel's fused linear
  cross-entropy (``liger_kernel.transformers.functional.liger_fused_linear_cross_entropy``);
* ``cce_linear_ce`` (hidden family) — Apple's Cut Cross-Entropy
  (``cut_cross_entropy.linear_cross_entropy``, its default ``impl='cce'``);
* ``liger_cross_entropy`` (logits family) — Liger-Kernel's cross-entropy
  (``liger_kernel.transformers.functional.liger_cross_entropy``). Cut Cross-Entropy
  has no logits-only loss.

Each is called with ``reduction='none'`` (the per-token loss) and negated: the target
log-probs, as every memprobe kernel returns them. Both packages are Triton, CUDA
only, and neither is a dependency of memprobe (each pulls a CUDA build of torch):
they are imported when a peer is called. Where one cannot run — no CUDA device, the
package not installed — :func:`unavailable_reason` says why, ``memprobe kernels``
lists it as unavailable with that reason, and a sweep that names it records its
cases as skipped with it. Their memory cannot be simulated on meta tensors (a
Triton kernel needs real device memory), so there is no meta figure for them.

What the libraries do that memprobe reports rather than hides:

* Liger's cross-entropy writes the gradient into the logits during the forward
  pass (it consumes them), and with ``reduction='none'`` its backward scales that
  gradient by the upstream one into a new logits-sized tensor.
* Liger's fused linear cross-entropy computes both gradients in the forward pass;
  some versions scale them in backward by the first element of the upstream
  gradient only, so a per-token upstream gradient shows as a backward error
  against float64 (``benchmarks/gpu_check.py`` measures it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import torch

from memprobe.kernels._checks import check_hidden_inputs, check_logprob_shapes
from memprobe.kernels.spec import KernelSpec
from memprobe.kernels.unavailable import KernelUnavailable


@dataclass(frozen=True)
class Package:
    """An optional package a peer needs: its PyPI name and the module a peer calls."""

    pypi: str
    module: str


LIGER = Package("liger-kernel", "liger_kernel.transformers.functional")
CCE = Package("cut-cross-entropy", "cut_cross_entropy")


def _import(package: Package) -> ModuleType:
    try:
        return importlib.import_module(package.module)
    except ImportError as exc:
        raise KernelUnavailable(
            f"needs CUDA + {package.pypi} (pip install {package.pypi}): {exc}"
        ) from None


def _on_device(package: Package, tensor: torch.Tensor) -> None:
    """Triton reads real device memory: a meta tensor has none to read."""
    if tensor.device.type == "meta":
        raise KernelUnavailable(
            f"needs CUDA + {package.pypi}: a Triton kernel, whose memory cannot be "
            "simulated on meta tensors; measure it on a GPU (--device cuda)"
        )


def _negated(loss: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """The per-token loss → float32 target log-probs ``[B, S]``."""
    return loss.neg().float().view(batch, seq)


def liger_fused_linear_ce_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``-liger_fused_linear_cross_entropy(hidden, weight, targets, reduction='none')``.

    ``chunk_size`` is ignored: Liger picks its own chunking.
    """
    check_hidden_inputs(hidden, weight, targets)
    _on_device(LIGER, hidden)
    functional = _import(LIGER)
    batch, seq, size = hidden.shape
    loss = functional.liger_fused_linear_cross_entropy(
        hidden.reshape(batch * seq, size),
        weight,
        targets.reshape(batch * seq).long(),
        reduction="none",
    )
    return _negated(loss, batch, seq)


def liger_cross_entropy_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """``-liger_cross_entropy(logits, targets, reduction='none')``; consumes the logits."""
    check_logprob_shapes(logits, targets)
    _on_device(LIGER, logits)
    functional = _import(LIGER)
    batch, seq, vocab = logits.shape
    loss = functional.liger_cross_entropy(
        logits.reshape(batch * seq, vocab), targets.reshape(batch * seq).long(), reduction="none"
    )
    return _negated(loss, batch, seq)


def cce_linear_ce_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``-cut_cross_entropy.linear_cross_entropy(hidden, weight, targets, reduction='none')``.

    ``chunk_size`` is ignored: CCE tiles the vocabulary itself.
    """
    check_hidden_inputs(hidden, weight, targets)
    _on_device(CCE, hidden)
    cce = _import(CCE)
    batch, seq, size = hidden.shape
    loss = cce.linear_cross_entropy(
        hidden.reshape(batch * seq, size),
        weight,
        targets.reshape(batch * seq).long(),
        reduction="none",
    )
    return _negated(loss, batch, seq)


PEERS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (
        KernelSpec(
            "liger_cross_entropy",
            liger_cross_entropy_logprobs,
            "Liger-Kernel's Triton cross-entropy, reduction='none', negated "
            "(gradient written into the logits in forward)",
            casts_per_chunk=True,
            consumes_logits=True,
            uses_chunk_size=False,
        ),
        KernelSpec(
            "liger_fused_linear_ce",
            liger_fused_linear_ce_logprobs,
            "Liger-Kernel's Triton fused linear cross-entropy, reduction='none', negated",
            casts_per_chunk=True,
            inputs="hidden",
            uses_chunk_size=False,
        ),
        KernelSpec(
            "cce_linear_ce",
            cce_linear_ce_logprobs,
            "Cut Cross-Entropy's Triton linear cross-entropy (impl='cce'), "
            "reduction='none', negated",
            casts_per_chunk=True,
            inputs="hidden",
            uses_chunk_size=False,
        ),
    )
}
_NEEDS = {"liger_cross_entropy": LIGER, "liger_fused_linear_ce": LIGER, "cce_linear_ce": CCE}


def unavailable_reason(name: str, device: str | None = None) -> str | None:
    """Why peer ``name`` cannot run here (on ``device`` when given), or None; None for
    a kernel that is not a peer. Imports the package to find out."""
    package = _NEEDS.get(name)
    if package is None:
        return None
    needs = f"needs CUDA + {package.pypi}"
    if device == "meta":
        return f"{needs}: a Triton kernel, whose memory cannot be simulated on meta"
    if device not in (None, "cuda"):
        return f"{needs}: it runs on CUDA tensors, not {device}"
    if not torch.cuda.is_available():
        return f"{needs} (no CUDA device here)"
    try:
        importlib.import_module(package.module)
    except ImportError:
        return f"{needs} (not installed: pip install {package.pypi})"
    return None
