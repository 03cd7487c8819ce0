"""CPU forward + backward time of filtered_chunked against local_chunked, interleaved.

    python benchmarks/filtered_speed.py [--shape 1,4096,32768] [--reps 5]
        [--filters top_p=0.9;top_k=50,top_p=0.9]

Target (issue 27): bf16 [1, 4096, 32768] with top-p 0.9 within 1.5x local_chunked.
Each repetition runs every kernel once, in turn, so a noisy neighbour slows all
of them alike; the figure is the median over repetitions. Logits are standard
normal draws in bf16, as the sweep's cpu backend draws them. The load average
printed says how busy the cpu was.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from memprobe.kernels import filtered_chunked_logprobs, local_chunked_logprobs

Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def step_seconds(
    fn: Kernel, logits: torch.Tensor, targets: torch.Tensor, go: torch.Tensor
) -> tuple[float, float]:
    """(forward, backward) wall seconds."""
    x = logits.detach().requires_grad_()
    start = time.perf_counter()
    out = fn(x, targets)
    middle = time.perf_counter()
    torch.autograd.grad(out, x, go)
    return middle - start, time.perf_counter() - middle


def parse_filters(spec: str) -> dict[str, Any]:
    """``top_k=50,top_p=0.9`` → ``{"top_k": 50, "top_p": 0.9}``."""
    out: dict[str, Any] = {}
    for item in spec.split(","):
        key, value = item.split("=")
        out[key] = int(value) if key == "top_k" else float(value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,4096,32768")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--filters", default="top_p=0.9;top_k=50,top_p=0.9")
    args = parser.parse_args()
    batch, seq, vocab = (int(v) for v in args.shape.split(","))
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, seq, vocab, generator=gen).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (batch, seq), generator=gen)
    go = torch.randn(batch, seq, generator=gen)
    kernels: dict[str, Kernel] = {"local_chunked": local_chunked_logprobs}
    for spec in args.filters.split(";"):
        filters = parse_filters(spec)
        kernels[f"filtered_chunked {spec}"] = functools.partial(
            filtered_chunked_logprobs, **filters
        )
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in kernels}
    for fn in kernels.values():  # warm-up
        step_seconds(fn, logits, targets, go)
    for _ in range(args.reps):
        for name, fn in kernels.items():
            times[name].append(step_seconds(fn, logits, targets, go))

    def medians(name: str) -> tuple[float, float, float]:
        """Median (fwd+bwd, fwd, bwd) seconds of one kernel."""
        ts = times[name]
        return (
            statistics.median(f + b for f, b in ts),
            statistics.median(f for f, _ in ts),
            statistics.median(b for _, b in ts),
        )

    base = medians("local_chunked")
    print(f"bf16 {args.shape}, fwd+bwd, median of {args.reps} interleaved repetitions")
    # Other processes on the cpu slow every kernel, and unevenly: the more ops a
    # kernel hands to torch's thread pool, the more of them wait for a busy core.
    print(
        f"  load average (1 min) {os.getloadavg()[0]:.2f} at the end, on {os.cpu_count()} cpus,"
        f" {torch.get_num_threads()} torch threads"
    )
    for name in times:
        total, fwd, bwd = medians(name)
        print(
            f"  {name:40s} {total:7.3f} s  ({total / base[0]:.2f}x local_chunked;"
            f" fwd {fwd / base[1]:.2f}x, bwd {bwd / base[2]:.2f}x)"
        )


if __name__ == "__main__":
    main()
