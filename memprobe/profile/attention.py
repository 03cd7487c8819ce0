"""On meta, attention runs the kernel a real device would pick, not meta's math fallback.

``F.scaled_dot_product_attention`` chooses its kernel by device. On cpu and cuda a fused
(flash-style) kernel is chosen where it applies, which never materializes the
``[B, h, S, S]`` scores; on meta the choice falls back to the math path, which does (and
saves them for backward): 2 GiB per layer at 8k tokens and 16 heads in bf16, memory no
real step would hold. While a step is simulated on meta, each call goes to the kernel
the target device would choose:

- ``cpu``: the fused CPU kernel when it accepts the call (``memprobe profile``: meta then
  equals a real cpu run to the byte);
- ``cuda``: torch's CUDA choice on an sm80+ GPU at the default priority: flash attention
  (fp16/bf16, no mask, head dim a multiple of 8 up to 256, grouped-query heads
  natively), else memory-efficient attention (fp16/bf16/fp32, masks, equal head
  counts), else math. Both fused kernels have meta kernels for forward and backward,
  so the output, its log-sum-exp and the gradients are counted at their true sizes;
- ``math``: torch's math path, ``[B, h, S, S]`` scores and all (what ``--attn
  sdpa-math`` asks for).

Every call's choice is counted in the :class:`AttentionLog` the context yields, so a
report can say which kernel it simulated.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

ATTENTION_TARGETS = ("cpu", "cuda", "math")

_CPU_FUSED = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_CUDA_FLASH = torch.ops.aten._scaled_dot_product_flash_attention
_CUDA_EFFICIENT = torch.ops.aten._scaled_dot_product_efficient_attention
_HALF = (torch.float16, torch.bfloat16)
# torch's flash attention on CUDA: head dims up to 256 (sdp_utils.cpp).
_FLASH_MAX_HEAD_DIM = 256

AttentionLog = Counter  # kernel name ("flash", "efficient", "math", "cpu-flash") -> calls


def _heads_grouped(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Key/value heads divide the query heads (grouped-query attention, or equal)."""
    hq, hk = query.shape[1], key.shape[1]
    return hk == value.shape[1] and hk > 0 and hq % hk == 0


def cuda_choice(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    enable_gqa: bool,
) -> str:
    """The kernel torch's CUDA dispatch picks for this call on an sm80+ GPU at the default
    priority (flash, then memory-efficient, then math), from the checks of
    ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` that depend on the call."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "math"
    dtype = query.dtype
    if not (dtype == key.dtype == value.dtype) or dtype not in (*_HALF, torch.float32):
        return "math"
    d_qk, d_v = query.shape[-1], value.shape[-1]
    same_heads = query.shape[1] == key.shape[1] == value.shape[1]
    if enable_gqa and not same_heads and not _heads_grouped(query, key, value):
        return "math"
    if not enable_gqa and not same_heads:
        return "math"
    square = query.shape[-2] == key.shape[-2]
    if (
        dtype in _HALF
        and attn_mask is None
        and d_qk == key.shape[-1] == d_v
        and d_qk % 8 == 0
        and d_qk <= _FLASH_MAX_HEAD_DIM
        and (square or not is_causal)
    ):
        return "flash"
    alignment = 8 if dtype in _HALF else 4
    if same_heads and d_qk == key.shape[-1] and d_qk % alignment == 0 and d_v % alignment == 0:
        return "efficient"
    return "math"


def _cpu_fused_applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    return (
        query.dim() == 4
        and query.dtype in (torch.float32, *_HALF)
        and query.dtype == key.dtype == value.dtype
        and _heads_grouped(query, key, value)
    )


def _simulated(t: torch.Tensor) -> bool:
    """A tensor without data: meta, or a fake tensor (a sharded step's fake world)."""
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type == "meta" or is_fake(t)


def _routed(original: Any, target: str, log: AttentionLog) -> Any:
    def attention(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
    ):
        def fallback() -> Any:
            log["math"] += 1
            return original(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )

        if not _simulated(query) or target == "math":
            return fallback()
        if target == "cpu":
            gqa_ok = enable_gqa or query.shape[1] == key.shape[1]
            if not (gqa_ok and _cpu_fused_applies(query, key, value)):
                return fallback()
            log["cpu-flash"] += 1
            out, _ = _CPU_FUSED(
                query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
            )
            return out
        choice = cuda_choice(query, key, value, attn_mask, is_causal, enable_gqa)
        if choice == "flash":
            log["flash"] += 1
            return _CUDA_FLASH(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if choice == "efficient":
            log["efficient"] += 1
            grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return _CUDA_EFFICIENT(
                query, key, value, attn_mask, grad, dropout_p, is_causal, scale=scale
            )[0]
        return fallback()

    return attention


@contextlib.contextmanager
def sdpa_on_meta(target: str = "cpu") -> Iterator[AttentionLog]:
    """While active, ``F.scaled_dot_product_attention`` on meta runs the kernel ``target``
    (one of :data:`ATTENTION_TARGETS`) would choose; yields the count of each choice."""
    if target not in ATTENTION_TARGETS:
        raise ValueError(f"attention target {target!r} is not one of {ATTENTION_TARGETS}")
    log: AttentionLog = Counter()
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _routed(original, target, log)
    try:
        yield log
    finally:
        F.scaled_dot_product_attention = original


def fused_attention_on_meta() -> contextlib.AbstractContextManager[AttentionLog]:
    """While active, ``F.scaled_dot_product_attention`` on meta runs the fused CPU kernel
    (what ``memprobe profile`` simulates: meta equals a real cpu run)."""
    return sdpa_on_meta("cpu")
