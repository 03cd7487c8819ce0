"""Worst deviation from float64 of filtered_chunked, beside filtered's own (unchunked).

    python benchmarks/filtered_numerics.py [--seeds 3]

Over seeds × dtypes × filters × logit scales (randn · 3, · 30, · 300) × chunk
sizes (7, None) at shapes whose sizes no chunk divides. The float64 reference
applies the same kept set (``filtered_out_mask``) and does the rest in float64;
errors are over the kept targets (the kernels agree on which are -inf: checked).
Targets (issue 27): forward within 2e-6 (plus float32's own rounding of a large
log-prob, m·2^-21), gradient within the unchunked reference's error.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from memprobe.kernels import filtered_chunked_logprobs, filtered_logprobs
from memprobe.kernels.filtered import filtered_out_mask

SHAPES = ((2, 67, 263), (1, 300, 1031))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FILTERS: dict[str, dict[str, Any]] = {
    "top_k=5": {"top_k": 5},
    "top_p=0.9": {"top_p": 0.9},
    "top_k=50,top_p=0.9": {"top_k": 50, "top_p": 0.9},
}
SCALES = (3.0, 30.0, 300.0)


def run(fn, logits, targets, go, **kw):  # type: ignore[no-untyped-def]
    x = logits.clone().requires_grad_()
    out = fn(x, targets, **kw)
    (grad,) = torch.autograd.grad(out, x, go)
    return out.double(), grad.double()


def errors(dtype: torch.dtype, filters: dict, scale: float, seed: int, shape) -> tuple:  # type: ignore[type-arg]
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(shape, generator=gen) * scale).to(dtype)
    targets = torch.randint(0, shape[2], shape[:2], generator=gen)
    targets[:, ::2] = logits.float().argmax(-1)[:, ::2]
    go = torch.randn(shape[:2], generator=gen)
    drop = filtered_out_mask(logits.float(), top_k=filters.get("top_k"), top_p=filters.get("top_p"))
    x = logits.double().requires_grad_()
    masked = x if drop is None else x.masked_fill(drop, float("-inf"))
    ref = torch.log_softmax(masked, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (ref_grad,) = torch.autograd.grad(ref, x, go.double())
    ref = ref.detach()
    kept = ~torch.isinf(ref)
    base_out, base_grad = run(filtered_logprobs, logits, targets, go, **filters)
    fwd_tol = 2e-6 + 2.0**-21 * ref[kept].abs().max().item()
    worst = [0.0, 0.0, (base_out[kept] - ref[kept]).abs().max().item()]
    worst.append((base_grad - ref_grad).abs().max().item())
    for chunk in (7, None):
        out, grad = run(filtered_chunked_logprobs, logits, targets, go, chunk_size=chunk, **filters)
        if not torch.equal(torch.isinf(out), ~kept):
            raise SystemExit(f"kept sets differ: {dtype} {filters} scale {scale} seed {seed}")
        worst[0] = max(worst[0], (out[kept] - ref[kept]).abs().max().item())
        worst[1] = max(worst[1], (grad - ref_grad).abs().max().item())
    return (*worst, fwd_tol)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    head = "| dtype | filters | scale | fwd | fwd (filtered) | grad | grad (filtered) | ok |"
    print(f"{head}  ({args.seeds} seeds)")
    print("|---|---|---|---|---|---|---|---|")
    failed = 0
    for dname, dtype in DTYPES.items():
        for fname, filters in FILTERS.items():
            for scale in SCALES:
                rows = [
                    errors(dtype, filters, scale, seed, shape)
                    for seed in range(args.seeds)
                    for shape in SHAPES
                ]
                fwd, grad, base_fwd, base_grad = (max(r[i] for r in rows) for i in range(4))
                ok = all(r[0] <= r[4] and r[1] <= max(r[3], 2e-5) for r in rows)
                failed += not ok
                print(
                    f"| {dname} | {fname} | {scale:g} | {fwd:.2e} | {base_fwd:.2e} | {grad:.2e} "
                    f"| {base_grad:.2e} | {'yes' if ok else 'NO'} |"
                )
    if failed:
        raise SystemExit(f"{failed} rows miss the targets")


if __name__ == "__main__":
    main()
