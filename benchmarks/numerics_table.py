"""Worst forward / backward deviation from float64, per kernel × dtype × logits regime.

    python benchmarks/numerics_table.py [--seeds 8] [--kernel NAME ...] [--regime NAME ...]

Over seeds × chunk sizes (1, 2, 3, 5, 7, 8, 64, and None = each kernel's
default) at two shapes, one of them S = 1024 + 7 so the default chunk does
not divide it. Three logits regimes: ``typical`` (randn x 3), ``offset``
(randn x 3 + 1e4: a common shift, as some models' logits carry) and ``scaled``
(randn x 300: peaked distributions). A kernel that computes
``x - (max + log sum)`` loses the low bits of the log-sum under the last two.
"""

from __future__ import annotations

import argparse

from memprobe.kernels import get_spec, kernel_names
from memprobe.measure.numerics import VERIFY_SCALE, verify
from memprobe.records import DTYPES

CHUNKS = (1, 2, 3, 5, 7, 8, 64, None)
SHAPES = ((2, 67, 263), (1, 1031, 97))
# name -> (scale, offset) of the logits randn * scale + offset.
REGIMES: dict[str, tuple[float, float]] = {
    "typical": (VERIFY_SCALE, 0.0),
    "offset": (VERIFY_SCALE, 1e4),
    "scaled": (100 * VERIFY_SCALE, 0.0),
}


def worst(kernel: str, dtype: str, regime: str, seeds: int) -> tuple[float, float]:
    scale, offset = REGIMES[regime]
    worst_f = worst_b = 0.0
    for seed in range(seeds):
        for shape in SHAPES:
            # Chunk 1 on the long shape is 1031 loop steps: covered by the short one.
            for chunk in CHUNKS if shape[1] < 1000 else (64, None):
                f, b = verify(kernel, dtype, seed, chunk, shape, scale=scale, offset=offset)
                worst_f, worst_b = max(worst_f, f), max(worst_b, b)
    return worst_f, worst_b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--kernel", action="append", help="default: every logits kernel")
    parser.add_argument("--regime", action="append", choices=list(REGIMES))
    parser.add_argument("--dtype", action="append", choices=list(DTYPES))
    args = parser.parse_args()
    # The hidden family takes hidden states, not logits: its table is
    # benchmarks/hidden_numerics.py.
    kernels = args.kernel or [k for k in kernel_names() if _takes_logits(k)]
    print(f"| kernel | dtype | logits | worst forward | worst backward |  ({args.seeds} seeds)")
    print("|---|---|---|---|---|")
    for kernel in kernels:  # distributed ones at TP=1
        for dtype in args.dtype or DTYPES:
            for regime in args.regime or REGIMES:
                f, b = worst(kernel, dtype, regime, args.seeds)
                print(f"| {kernel} | {dtype} | {regime} | {f:.2e} | {b:.2e} |", flush=True)


def _takes_logits(name: str) -> bool:
    return getattr(get_spec(name), "inputs", "logits") == "logits"


if __name__ == "__main__":
    main()
