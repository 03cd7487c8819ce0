"""CPU forward + backward time of local_tiled against local_chunked, interleaved.

    python benchmarks/tiled_speed.py [--shape 1,4096,32768] [--reps 7] [--tiles 1024x2048,512x4096]

Each repetition runs every kernel once, in turn, so a noisy neighbour slows all
of them alike; the figure is the median over repetitions. Backward runs as a
training step sees it: ``torch.autograd.grad(out, logits, grad_outputs)``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from memprobe.kernels import local_chunked_logprobs
from memprobe.kernels.local_tiled import (
    DEFAULT_TILE_SIZE,
    DEFAULT_TILED_CHUNK_SIZE,
    local_tiled_logprobs,
)

Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def step_seconds(
    fn: Kernel, logits: torch.Tensor, targets: torch.Tensor, go: torch.Tensor
) -> float:
    x = logits.detach().requires_grad_()
    start = time.perf_counter()
    out = fn(x, targets)
    torch.autograd.grad(out, x, go)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,4096,32768")
    parser.add_argument("--reps", type=int, default=7)
    default_tiles = f"{DEFAULT_TILED_CHUNK_SIZE}x{DEFAULT_TILE_SIZE}"
    parser.add_argument("--tiles", default=default_tiles, help="comma list of CHUNKxTILE")
    args = parser.parse_args()
    batch, seq, vocab = (int(v) for v in args.shape.split(","))
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, seq, vocab, generator=gen).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (batch, seq), generator=gen)
    go = torch.randn(batch, seq, generator=gen)
    kernels: dict[str, Kernel] = {"local_chunked": local_chunked_logprobs}
    for spec in args.tiles.split(","):
        c, t = (int(v) for v in spec.split("x"))
        kernels[f"local_tiled {c}x{t}"] = lambda x, y, c=c, t=t: local_tiled_logprobs(
            x, y, chunk_size=c, tile_size=t
        )
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for fn in kernels.values():  # warm-up
        step_seconds(fn, logits, targets, go)
    for _ in range(args.reps):
        for name, fn in kernels.items():
            times[name].append(step_seconds(fn, logits, targets, go))
    base = statistics.median(times["local_chunked"])
    print(f"bf16 {args.shape}, fwd+bwd, median of {args.reps} interleaved repetitions")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:24s} {med:7.3f} s  ({med / base:.2f}x local_chunked)")


if __name__ == "__main__":
    main()
