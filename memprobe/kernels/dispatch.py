"""``next_token_logprobs``: shift, pick a kernel, and pre-cast only when it helps."""

from __future__ import annotations

import torch

from memprobe.kernels.registry import get_spec


def select_kernel(top_k: int | None = None, top_p: float | None = None) -> str:
    """Filtering needs the whole distribution at once; otherwise chunk locally."""
    return "filtered" if top_k is not None or top_p is not None else "local_chunked"


def next_token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    chunk_size: int | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    kernel: str | None = None,
) -> torch.Tensor:
    """Log-prob of each next token: ``out[b, s] = log p(input_ids[b, s+1] | logits[b, s])``.

    Returns float32 ``[B, S-1]``. ``kernel`` overrides the choice (filters need
    ``filtered``). The whole tensor is cast to float32 first only when the
    chosen kernel does not cast chunk by chunk itself.
    """
    name = kernel or select_kernel(top_k, top_p)
    spec = get_spec(name)
    if (top_k is not None or top_p is not None) and name != "filtered":
        raise ValueError(f"top_k / top_p need the 'filtered' kernel, not {name!r}")
    if logits.dim() != 3 or input_ids.dim() != 2 or tuple(input_ids.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"expected logits [B, S, V] and input_ids [B, S], got {tuple(logits.shape)} "
            f"and {tuple(input_ids.shape)}"
        )
    # Shift by padding the targets rather than slicing the logits: slicing
    # logits[:, :-1] would make autograd build a full-size zero gradient for
    # the slice. The padded last position is dropped from the output, so it
    # gets a zero gradient.
    targets = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)
    if not spec.casts_per_chunk:
        logits = logits.float()
    filters = {"top_k": top_k, "top_p": top_p} if name == "filtered" else {}
    out = spec.fn(logits, targets, chunk_size=chunk_size, **filters)
    return out[:, :-1]
