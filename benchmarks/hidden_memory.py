"""Simulated peaks (meta tensors): the hidden family at the headline shape, and
local_tiled against its floor across token counts.

    python benchmarks/hidden_memory.py [--tokens 20000] [--hidden 4096] [--vocab 131072]

Targets (issue 15): fused_linear_chunked <= 1.02 x floor and never above
torch_linear_ce (compact); local_tiled <= 1.02 x its floor from 1,024 tokens up.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from memprobe.kernels import get_kernel, kernel_names
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.measure.protocol import HiddenShape, simulate_hidden
from memprobe.records import Case

GIB = 2**30


def _torch_cpu_default(hidden, weight, targets, *, chunk_size=None):  # type: ignore[no-untyped-def]
    """torch's own CPU default for comparison: 'accurate' with float32 accumulators."""
    options = torch.nn.LinearCrossEntropyOptions(acc_policy="accurate", acc_dtype=torch.float32)
    b, s, h = hidden.shape
    loss = torch.nn.functional.linear_cross_entropy(
        hidden.reshape(b * s, h), weight, targets.reshape(-1), reduction="none", options=options
    )
    return loss.neg().float().view(b, s)


def hidden_table(shape: HiddenShape) -> None:
    print(
        f"hidden family, {shape.tokens:,} tokens x H={shape.hidden} x V={shape.vocab:,} "
        f"{shape.dtype}, floor {shape.floor_bytes / GIB:.3f} GiB"
    )
    print("| kernel | peak GiB | x floor | forward peak GiB | simulated in |")
    print("|---|---|---|---|---|")
    kernels = {name: get_kernel(name) for name in kernel_names(inputs="hidden")}
    kernels["(torch accurate + fp32 acc, its CPU default)"] = _torch_cpu_default
    peaks = {}
    for name, fn in kernels.items():
        start = time.perf_counter()
        peak = simulate_hidden(functools.partial(fn), shape)
        peaks[name] = peak.peak_bytes
        print(
            f"| {name} | {peak.peak_bytes / GIB:.3f} | {peak.over_floor:.4f} | "
            f"{peak.forward_peak_bytes / GIB:.3f} | {time.perf_counter() - start:.1f} s |",
            flush=True,
        )
    fused, compact = peaks["fused_linear_chunked"], peaks["torch_linear_ce"]
    print(
        f"fused: {fused / GIB:.2f} GiB vs {peaks['linear_local_chunked'] / GIB:.2f} GiB for "
        f"matmul + local_chunked; <= torch compact: {fused <= compact}"
    )


def tiled_table(vocab: int, tokens: list[int]) -> None:
    print(f"\nlogits kernels at V={vocab:,} bf16 (peak / floor)")
    names = ["local_chunked", "local_tiled", "local_chunked_inplace", "local_tiled_inplace"]
    print("| tokens | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for s in tokens:
        cells = []
        for name in names:
            case = Case(name, 1, s, vocab, dtype="bf16", chunk_size=None, device="meta")
            peak = simulate_tracker(case, capture_frames=False).peak_bytes
            floor = case.logits_bytes * (1 if name.endswith("inplace") else 2)
            cells.append(f"{peak / GIB:.3f} GiB ({peak / floor:.3f}x)")
        print(f"| {s:,} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--skip-hidden", action="store_true")
    args = parser.parse_args()
    if not args.skip_hidden:
        hidden_table(HiddenShape(1, args.tokens, args.hidden, args.vocab))
    ladder = [1024, 2048, 4096, 8192, 16384]
    tiled_table(args.vocab, [t for t in ladder if t < args.tokens] + [args.tokens])


if __name__ == "__main__":
    main()
