"""Worst deviation from float64 of the hidden family: forward, hidden and weight gradients.

    python benchmarks/hidden_numerics.py [--seeds 4]

Over seeds × dtypes × chunk sizes (7, 64, None) at two shapes whose sizes no
chunk or tile divides; logits have a standard deviation of about 3.
"""

from __future__ import annotations

import argparse
import warnings

import torch

from memprobe.kernels import get_kernel, kernel_names
from memprobe.measure.protocol import HiddenShape, verify_hidden

SHAPES = ((2, 67, 64, 263), (1, 300, 128, 1031))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # torch warns when a tiny shape takes its reference path
    print(f"| kernel | dtype | forward | grad hidden | grad weight |  ({args.seeds} seeds)")
    print("|---|---|---|---|---|")
    for name in kernel_names(inputs="hidden"):
        for label, dtype in DTYPES.items():
            worst = [0.0, 0.0, 0.0]
            for seed in range(args.seeds):
                for b, s, h, v in SHAPES:
                    for chunk in (7, 64, None):
                        errs = verify_hidden(
                            get_kernel(name),
                            HiddenShape(b, s, h, v, dtype),
                            seed=seed,
                            chunk_size=chunk,
                        )
                        worst = [max(w, e) for w, e in zip(worst, errs, strict=True)]
            print(
                f"| {name} | {label} | " + " | ".join(f"{w:.2e}" for w in worst) + " |", flush=True
            )


if __name__ == "__main__":
    main()
