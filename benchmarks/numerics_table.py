"""Worst forward / backward deviation from float64, per kernel × dtype.

    python benchmarks/numerics_table.py [--seeds 8]

Over seeds × chunk sizes (1, 2, 3, 5, 7, 8, 64, and None = each kernel's
default) at two shapes, one of them S = 1024 + 7 so the default chunk does
not divide it.
"""

from __future__ import annotations

import argparse

from memprobe.kernels import kernel_names
from memprobe.measure.numerics import verify
from memprobe.records import DTYPES

CHUNKS = (1, 2, 3, 5, 7, 8, 64, None)
SHAPES = ((2, 67, 263), (1, 1031, 97))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    print(f"| kernel | dtype | worst forward | worst backward |  ({args.seeds} seeds)")
    print("|---|---|---|---|")
    for kernel in kernel_names():  # distributed ones at TP=1
        for dtype in DTYPES:
            worst_f = worst_b = 0.0
            for seed in range(args.seeds):
                for shape in SHAPES:
                    # Chunk 1 on the long shape is 1031 loop steps: covered by the short one.
                    for chunk in CHUNKS if shape[1] < 1000 else (64, None):
                        f, b = verify(kernel, dtype, seed, chunk, shape)
                        worst_f, worst_b = max(worst_f, f), max(worst_b, b)
            print(f"| {kernel} | {dtype} | {worst_f:.2e} | {worst_b:.2e} |")


if __name__ == "__main__":
    main()
