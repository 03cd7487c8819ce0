"""Flash attention backward's workspace on meta, as torch's CUDA path (mha_bwd, FA2)
allocates it: the figures at a small shape against the formula."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memprobe.profile.flash_workspace import head_dim_rounded
from memprobe.profile.run import trace_step

B, S, H, HK, D = 2, 300, 4, 2, 72
S_ROUNDED, D_ROUNDED = 384, 96  # round_up(300, 128), round_up(72, 32)


def _attention_step(device: torch.device) -> None:
    q = torch.empty(B, S, H, D, dtype=torch.bfloat16, device=device).transpose(1, 2)
    k = torch.empty(B, S, HK, D, dtype=torch.bfloat16, device=device).transpose(1, 2)
    v = torch.empty(B, S, HK, D, dtype=torch.bfloat16, device=device).transpose(1, 2)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    # sum's backward hands flash an expanded gradient: not contiguous, so CUDA copies it.
    out.sum().backward()


def test_the_workspace_is_the_formula_and_freed_with_the_op() -> None:
    tracked = trace_step(_attention_step, "meta", capture_frames=False, attention="cuda")
    assert tracked.attention == {"flash": 1}
    work = [e for e in tracked.events if "flash attention backward workspace" in e.op]
    allocs = [(e.op.split(": ")[1], e.nbytes) for e in work if e.action == "alloc"]
    assert allocs == [
        ("grad_out made contiguous", B * H * S * D * 2),
        ("softmax_d", B * H * S_ROUNDED * 4),
        ("dq_accum", B * S_ROUNDED * H * D_ROUNDED * 4),
        ("dk_expanded", B * S * H * D * 2),
        ("dv_expanded", B * S * H * D * 2),
    ]
    frees = [e.op.split(": ")[1] for e in work if e.action == "free"]
    assert frees == [
        "dv_expanded",
        "dk_expanded",
        "dq_accum",
        "softmax_d",
        "grad_out made contiguous",
    ]
    # Allocated after the op's outputs (dq, dk, dv), all freed before anything else happens.
    first = tracked.events.index(work[0])
    outputs = tracked.events[first + 1 : first + 4]
    assert [e.op for e in outputs] == [
        str(torch.ops.aten._scaled_dot_product_flash_attention_backward.default)
    ] * 3
    assert [e.nbytes for e in outputs] == [B * S * H * D * 2] + [B * S * HK * D * 2] * 2
    last = tracked.events.index(work[-1])
    assert last - first + 1 == len(work) + 3
    # The workspace is on top of everything live at the op: the backward peak holds it.
    live_at_op = sum(n for _, n in allocs) + B * S * (H + 2 * HK) * D * 2
    assert tracked.phase_peaks["backward"] >= live_at_op


def test_head_dims_round_as_flash_does() -> None:
    assert [head_dim_rounded(d) for d in (64, 72, 128, 136, 192, 256)] == [
        64, 96, 128, 192, 192, 256,
    ]  # fmt: skip
