"""Flash attention backward's own workspace, which its meta kernel does not allocate.

On CUDA, ``aten._scaled_dot_product_flash_attention_backward`` (torch's FlashAttention-2
path for sm80+) calls ``_flash_attention_backward`` and ``mha_bwd``
(``aten/src/ATen/native/transformers/cuda/attention_backward.cu`` and
``.../flash_attn/flash_api.cpp``). Besides its outputs ``dq, dk, dv`` (which the meta
kernel does make), the dense, non-deterministic path allocates, in this order:

1. ``grad_out.transpose(1, 2).contiguous()`` and ``out.transpose(1, 2).contiguous()``:
   a copy only when that view is not contiguous already (``[B, S, h, d]`` layout);
2. the outputs ``dq, dk, dv``;
3. ``softmax_d``: float32 ``[B, h, round_up(S_q, 128)]``;
4. ``dq_accum``: float32 ``[B, round_up(S_q, 128), h, d_rounded]``, ``d_rounded`` the head
   dim rounded up to a multiple of 32 (to 64 above 128);
5. grouped-query heads only (``h_k != h``): ``dk_expanded`` and ``dv_expanded``, each
   ``[B, S_k, h, d]`` in the inputs' dtype, summed into ``dk`` and ``dv`` at the end.

``mha_bwd`` returns and frees ``dv_expanded``, ``dk_expanded`` and ``dq_accum`` (C++ locals
die in reverse order); ``_flash_attention_backward`` then drops ``softmax_d`` and the two
copies. :func:`flash_backward_workspace` lists these for one call, so the tracker can
count them around the op. Not modelled: ``torch.use_deterministic_algorithms(True)``
(``dq_accum`` then has one split per group of SMs: it depends on the GPU), and dropout's
extra state (the training steps here run attention without dropout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
_Q_BLOCK = 128  # seqlen_q rounded to this for softmax_d and dq_accum


@dataclass(frozen=True)
class Workspace:
    """One buffer flash backward allocates for itself: ``before`` the outputs (the
    contiguous copies) or after them; listed in allocation order."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    before: bool

    @property
    def op(self) -> str:
        return f"flash attention backward workspace: {self.name}"

    def make(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="meta")


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def head_dim_rounded(d: int) -> int:
    return _round_up(d, 32 if d <= 128 else 64)


def flash_backward_workspace(args: tuple[Any, ...]) -> list[Workspace]:
    """The workspace of one ``_scaled_dot_product_flash_attention_backward`` call with
    these arguments (``grad_out, query, key, value, out, ...`` as ``[B, h, S, d]``)."""
    grad_out, query, key, _value, out = args[:5]
    batch, heads, seq_q, dim = (int(n) for n in query.shape)
    heads_k, seq_k = int(key.shape[1]), int(key.shape[2])
    found = [
        Workspace(f"{name} made contiguous", tuple(int(n) for n in t.shape), t.dtype, True)
        for name, t in (("grad_out", grad_out), ("out", out))
        if not t.transpose(1, 2).is_contiguous()
    ]
    rows = _round_up(seq_q, _Q_BLOCK)
    found.append(Workspace("softmax_d", (batch, heads, rows), torch.float32, False))
    found.append(
        Workspace("dq_accum", (batch, rows, heads, head_dim_rounded(dim)), torch.float32, False)
    )
    if heads_k != heads:
        for name in ("dk_expanded", "dv_expanded"):
            found.append(Workspace(name, (batch, seq_k, heads, dim), query.dtype, False))
    return found


def free_order(workspace: list[Workspace]) -> list[int]:
    """Indices of ``workspace`` in the order CUDA frees them: mha_bwd's locals in reverse
    (the expanded gradients, dq_accum), then softmax_d, then the copies in reverse."""
    after = [i for i, w in enumerate(workspace) if not w.before]
    before = [i for i, w in enumerate(workspace) if w.before]
    softmax_d = [i for i in after if workspace[i].name == "softmax_d"]
    return [i for i in reversed(after) if i not in softmax_d] + softmax_d + before[::-1]
