"""Input validation shared by every kernel.

Checks run before any large allocation so a bad call fails fast and cheaply.
"""

from __future__ import annotations

import torch


def check_logprob_shapes(
    logits: torch.Tensor, targets: torch.Tensor, *, vocab_name: str = "V"
) -> None:
    """Raise ``ValueError`` unless ``logits`` is ``[B, S, V]`` floating point and
    ``targets`` an integer ``[B, S]`` tensor. Reads no values: no device sync."""
    if not isinstance(logits, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise ValueError("logits and targets must be torch tensors")
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, S, {vocab_name}], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.is_complex():
        raise ValueError(f"targets must be an integer tensor of token ids, got {targets.dtype}")
    if tuple(targets.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"targets must be [B, S] = {tuple(logits.shape[:2])} to match logits "
            f"{tuple(logits.shape)}, got {tuple(targets.shape)}"
        )
    if logits.shape[-1] == 0:
        raise ValueError(f"logits have an empty vocabulary dimension ({vocab_name} = 0)")


def check_logprob_inputs(logits: torch.Tensor, targets: torch.Tensor) -> None:
    """:func:`check_logprob_shapes`, and every target id in ``[0, V)``."""
    check_logprob_shapes(logits, targets)
    _check_target_range(targets, logits.shape[-1])


def carries_values(tensor: torch.Tensor) -> bool:
    """False for meta and fake tensors (memprobe's sharded simulation): no values, so
    there is nothing to range-check."""
    from torch._subclasses.fake_tensor import is_fake

    return tensor.device.type != "meta" and not is_fake(tensor)


def _check_target_range(targets: torch.Tensor, vocab: int) -> None:
    if targets.numel() and carries_values(targets):
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(
                f"targets must be token ids in [0, {vocab}), found ids in [{lo}, {hi}]"
            )


def no_grad_wanted(logits: object, targets: object) -> bool:
    """Whether an autograd Function may skip saving for backward (no gradient wanted).

    Full validation happens once, inside ``forward`` (``apply`` is public too); only
    the type is checked here, since ``requires_grad`` needs a tensor.
    """
    if not isinstance(logits, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise ValueError("logits and targets must be torch tensors")
    return not (torch.is_grad_enabled() and logits.requires_grad)


def check_size_parameter(name: str, value: object) -> None:
    """Every size parameter (``chunk_size``, ``tile_size``, ``top_k``): a positive ``int`` or
    None. ``2.5`` or ``"8"`` is refused, never coerced through ``int()``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


def check_chunk_size(chunk_size: int | None) -> None:
    check_size_parameter("chunk_size", chunk_size)


def check_hidden_inputs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``hidden`` is ``[B, S, H]``, ``weight`` ``[V, H]`` of the
    same floating dtype, and ``targets`` integer ``[B, S]`` ids in ``[0, V)``."""
    if not all(isinstance(t, torch.Tensor) for t in (hidden, weight, targets)):
        raise ValueError("hidden, weight and targets must be torch tensors")
    if hidden.dim() != 3 or weight.dim() != 2:
        raise ValueError(
            f"hidden must be [B, S, H] and weight [V, H], got {tuple(hidden.shape)} "
            f"and {tuple(weight.shape)}"
        )
    if not hidden.is_floating_point() or hidden.dtype != weight.dtype:
        raise ValueError(
            f"hidden and weight must share one floating dtype, got {hidden.dtype} and "
            f"{weight.dtype}"
        )
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"hidden size differs: hidden {tuple(hidden.shape)} vs weight {tuple(weight.shape)}"
        )
    if targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.is_complex():
        raise ValueError(f"targets must be an integer tensor of token ids, got {targets.dtype}")
    if tuple(targets.shape) != tuple(hidden.shape[:2]):
        raise ValueError(
            f"targets must be [B, S] = {tuple(hidden.shape[:2])} to match hidden "
            f"{tuple(hidden.shape)}, got {tuple(targets.shape)}"
        )
    if weight.shape[0] == 0:
        raise ValueError("weight has an empty vocabulary dimension (V = 0)")
    _check_target_range(targets, weight.shape[0])
