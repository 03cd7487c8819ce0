"""On meta, attention runs the kernel a real device would pick, not meta's math fallback.

``F.scaled_dot_product_attention`` chooses its kernel by device. On cpu and cuda a fused
(flash-style) kernel is chosen, which never materializes the ``[B, h, S, S]`` scores;
on meta the choice falls back to the math path, which does (and saves them for
backward): 2 GiB per layer at 8k tokens and 16 heads in bf16, memory no real step
would hold. While a step is profiled on meta, calls with meta tensors that the fused
CPU kernel accepts go to it (it has meta kernels for forward and backward, so the
output, its log-sum-exp and the gradients are counted at their true sizes); anything
else keeps torch's own path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

_FUSED = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _fused_attention(original: Any) -> Any:
    def attention(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        **kwargs: Any,
    ) -> Any:
        fused = (
            query.device.type == "meta"
            and query.dim() == 4
            and key.shape[1] == query.shape[1] == value.shape[1]
            and query.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and query.dtype == key.dtype == value.dtype
            and not kwargs.get("enable_gqa", False)
        )
        if not fused:
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale, **kwargs)
        out, _ = _FUSED(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        return out

    return attention


@contextlib.contextmanager
def fused_attention_on_meta() -> Iterator[None]:
    """While active, ``F.scaled_dot_product_attention`` on meta runs the fused kernel."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_attention(original)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
