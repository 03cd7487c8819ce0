"""Top-k / top-p filtered log-probabilities on plain autograd.

Sampling with top-k or top-p draws from the renormalised filtered
distribution, so the log-probs a policy-gradient step needs are taken from
the same filtered distribution. A target outside the kept set gets -inf.
"""

from __future__ import annotations

import torch

from memprobe.kernels._checks import check_chunk_size, check_logprob_inputs, check_size_parameter


def check_filters(top_k: int | None, top_p: float | None) -> None:
    check_size_parameter("top_k", top_k)
    if top_p is not None and not (0.0 < float(top_p) <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


def filter_logits(
    logits: torch.Tensor, *, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Return float32 logits with every entry outside top-k / top-p set to -inf."""
    check_filters(top_k, top_p)
    filtered = logits.float()
    drop = filtered_out_mask(filtered, top_k=top_k, top_p=top_p)
    return filtered if drop is None else filtered.masked_fill(drop, float("-inf"))


@torch.no_grad()
def filtered_out_mask(
    logits: torch.Tensor, *, top_k: int | None, top_p: float | None
) -> torch.Tensor | None:
    """Boolean mask of the entries top-k / top-p removes, or None when it removes none.

    Built without autograd: the mask carries no gradient, and tracking the
    sort would save a float32 and an int64 ``[B, S, V]`` for nothing.
    """
    vocab = logits.shape[-1]
    drop: torch.Tensor | None = None
    if top_k is not None and int(top_k) < vocab:
        kth = torch.topk(logits, int(top_k), dim=-1).values[..., -1:]
        drop = logits < kth
    if top_p is not None and float(top_p) < 1.0:
        masked = logits if drop is None else logits.masked_fill(drop, float("-inf"))
        # Stable: where top-p stops inside a run of equal logits, the ties kept
        # are the first in vocabulary order, not whatever an unstable sort leaves.
        sorted_logits, order = torch.sort(masked, dim=-1, descending=True, stable=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the mass before it already reaches top_p; the most
        # likely token is therefore always kept.
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= float(top_p)
        by_p = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        drop = by_p if drop is None else drop | by_p
    return drop


def filtered_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """log_softmax of the top-k / top-p filtered logits, gathered at the targets.

    ``chunk_size`` is accepted for a uniform kernel signature and ignored.
    """
    check_logprob_inputs(logits, targets)
    check_chunk_size(chunk_size)
    check_filters(top_k, top_p)
    logprobs = torch.log_softmax(filter_logits(logits, top_k=top_k, top_p=top_p), dim=-1)
    return logprobs.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
