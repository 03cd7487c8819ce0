"""Context parallel in the sharded step (:mod:`memprobe.profile.sharded`): each rank
holds ``tokens`` of a sequence ``cp`` times as long, and attention all-gathers K and V
over the ``cp`` ranks before the attention kernel (reduce-scattering their gradients
after it), as torch's context parallel does with its all-gather rotation; the gathered
K and V are saved for backward. Ring (pass-KV) attention, which holds one peer's K/V at
a time, is not modelled."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memprobe.profile.phases import events_so_far


class _GatherSequence(torch.autograd.Function):
    """K or V all-gathered over the CP ranks along the sequence (dim -2); backward
    reduce-scatters the gradient back to this rank's block."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, ranks: int) -> torch.Tensor:
        ctx.ranks = ranks
        shape = list(local.shape)
        shape[-2] *= ranks
        gathered = local.new_empty(shape)
        # This rank's block; the other ranks' arrive over the (fake, no-op) all-gather.
        gathered.narrow(-2, 0, local.shape[-2]).copy_(local)
        return gathered

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        rows = grad.shape[-2] // ctx.ranks
        mine = torch.empty_like(grad.narrow(-2, 0, rows), memory_format=torch.contiguous_format)
        mine.copy_(grad.narrow(-2, 0, rows))
        return mine, None


@contextlib.contextmanager
def cp_attention(ranks: int, windows: list[tuple[int, int]]) -> Iterator[None]:
    """While active (``ranks`` > 1), every SDPA call sees K and V all-gathered over the
    CP ranks: a local query block against the whole sequence's keys. The event index
    window of each gather is appended to ``windows``."""
    if ranks == 1:
        yield
        return
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def attention(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *a: Any, **k: Any
    ) -> torch.Tensor:
        start = events_so_far() or 0
        key = _GatherSequence.apply(key, ranks)
        value = _GatherSequence.apply(value, ranks)
        windows.append((start, events_so_far() or 0))
        # The local query block against the whole sequence's keys. Torch's CP runs the
        # fused kernel per block, causal on the diagonal only; a fused kernel's memory
        # does not depend on the mask, and CUDA's flash kernel refuses a causal
        # non-square call, so the call is made non-causal (same bytes, no [S,S] scores).
        rest = list(a)
        if len(rest) >= 3:  # (attn_mask, dropout_p, is_causal, ...)
            rest[2] = False
        else:
            k["is_causal"] = False
        return original(query, key, value, *rest, **k)

    F.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
