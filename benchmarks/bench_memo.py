"""Time kernels' meta simulations with every op run and with the memo (measure/memo.py).

    python benchmarks/bench_memo.py [--vocab 131072] [--per-kernel 8] [--seed 0]

A plan's search simulates each kernel at many token counts; this runs the same kind of
mix (every logits kernel at ``--per-kernel`` random counts from 5,000 to 110,000 tokens)
twice in one process, once with every op run (``memo=False``) and once with the memo,
checks that both give the same peaks, and prints the CPU seconds of each.
Target: the memo costs at most 90% of running every op (59-77% measured on the 2-core
machine with in-place ops remembered, 65-83% back to back when they always ran).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from memprobe.kernels import KERNELS, get_spec
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.records import Case

TARGET = 0.90


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--per-kernel", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kernels = [k for k in sorted(KERNELS) if get_spec(k).inputs == "logits"]
    cases = [
        Case(k, 1, rng.randint(5000, 110000), args.vocab)
        for k in kernels
        for _ in range(args.per_kernel)
    ]
    for kernel in kernels:  # torch's lazy imports and first-call set-up, paid once
        simulate_tracker(Case(kernel, 1, 2048, 4096), capture_frames=False, memo=False)

    def run(memo: bool) -> tuple[float, list[int]]:
        start = time.process_time()
        peaks = [simulate_tracker(c, capture_frames=False, memo=memo).peak_bytes for c in cases]
        return time.process_time() - start, peaks

    ran, ran_peaks = run(memo=False)
    remembered, peaks = run(memo=True)
    ratio = remembered / ran
    print(f"{len(cases)} simulations at vocab {args.vocab:,}")
    print(f"every op run:        {ran:6.2f} s CPU")
    print(f"answers remembered:  {remembered:6.2f} s CPU ({ratio:.0%} of the above)")
    if peaks != ran_peaks:
        print("FAIL: the peaks differ", file=sys.stderr)
        return 1
    ok = ratio <= TARGET
    print(f"{'PASS' if ok else 'FAIL'}: target {TARGET:.0%}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
