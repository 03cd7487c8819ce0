"""Time the allocator model on 1,000,000 requests.

    python benchmarks/bench_allocator.py [--requests 1000000] [--seed 0] [--alloc-conf TEXT]

Target (issue 13): replaying 1,000,000 requests (allocations and frees together) in ≤ 10 s.
The workload imitates a training step's mix: many tiny and sub-MiB tensors (small pool),
activation- and gradient-sized ones of a few MiB to a few hundred MiB (large pool), with
lifetimes mostly short (freed soon, as temporaries are) and some long, at a fixed seed.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from memprobe.allocator.config import parse_alloc_conf
from memprobe.allocator.model import CachingAllocatorModel

MiB = 1 << 20
TARGET_S = 10.0


def workload(requests: int, seed: int) -> list[tuple[bool, int]]:
    """(is_alloc, size_or_index) pairs: an allocation's size, or which live block to free."""
    rng = random.Random(seed)
    ops: list[tuple[bool, int]] = []
    live = 0
    while len(ops) < requests:
        if live and (rng.random() < 0.5 or live > 2000):
            # Mostly the youngest blocks die first (temporaries); sometimes an old one.
            back = int(rng.expovariate(1 / 4)) if rng.random() < 0.9 else rng.randrange(live)
            ops.append((False, max(live - 1 - back, 0)))
            live -= 1
            continue
        kind = rng.random()
        if kind < 0.45:
            size = rng.randint(1, 64 * 1024)
        elif kind < 0.65:
            size = rng.randint(64 * 1024, MiB)
        elif kind < 0.9:
            size = rng.randint(MiB, 16 * MiB)
        elif kind < 0.99:
            size = rng.randint(16 * MiB, 256 * MiB)
        else:
            size = rng.randint(256 * MiB, 1024 * MiB)
        ops.append((True, size))
        live += 1
    return ops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alloc-conf", default="")
    args = parser.parse_args()
    ops = workload(args.requests, args.seed)
    model = CachingAllocatorModel(parse_alloc_conf(args.alloc_conf), keep_segment_events=False)
    live: list[int] = []
    start = time.perf_counter()
    for is_alloc, value in ops:
        if is_alloc:
            live.append(model.malloc(value))
        else:
            model.free(live.pop(value))
    elapsed = time.perf_counter() - start
    stats = model.stats
    print(
        f"{len(ops):,} requests in {elapsed:.2f} s ({1e6 * elapsed / len(ops):.2f} µs each); "
        f"reserved peak {stats.reserved_peak_bytes / MiB:,.0f} MiB, allocated peak "
        f"{stats.allocated_peak_bytes / MiB:,.0f} MiB, {stats.segments} segments at the end"
    )
    ok = elapsed <= TARGET_S
    print(f"target ≤ {TARGET_S:.0f} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
