"""``memprobe step`` on an 8B Llama-shaped config, on meta.

    python benchmarks/bench_step.py            # the timed step and the origin story

(``plan --step``'s speed: ``benchmarks/bench_plan_step.py``; the sharded step's:
``benchmarks/bench_sharded_step.py``. Both take their config from here.)

1. Speed (issue 24): an 8B-parameter Llama-shaped config (hidden 4096, 32 layers,
   intermediate 14336, 32 heads / 8 key-value heads, V 128,256) at 20,000 tokens with
   activation checkpointing, the whole step (forward, local_chunked, backward, AdamW):
   target <= 60 s on the development machine.
2. The origin story in shape: the same model with V = 131,072 at 20,000 tokens, the
   whole step with each kernel side by side: the forward/backward peak and the whole
   step's peak (allocated and reserved), and the logprob step's own working set. The
   unchunked kernel adds two float32 [B,S,V] blocks (2 x 9.77 GiB) on top of the rest;
   local_chunked and local_tiled do not.
"""

from __future__ import annotations

import argparse
import time

from memprobe.io.sizes import format_bytes
from memprobe.profile.hf import HFStep, config_from_dict
from memprobe.profile.step import simulate_step

STEP_TARGET_S = 60.0
LLAMA_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128_256,
}
# The origin story's vocabulary (and the other 8B benchmarks').
LLAMA_8B_131K = {**LLAMA_8B, "vocab_size": 131_072}
ORIGIN_KERNELS = ("unchunked", "local_chunked", "local_tiled", "fused_linear_chunked")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    args = parser.parse_args()

    config = config_from_dict(dict(LLAMA_8B))
    start = time.perf_counter()
    result = simulate_step(HFStep(config, tokens=args.tokens, checkpointing=True))
    took = time.perf_counter() - start
    print(
        f"{result.parameters / 1e9:.2f}B parameters, {args.tokens:,} tokens, checkpointing, "
        f"local_chunked, AdamW: peak {format_bytes(result.peak_allocated_bytes)} allocated, "
        f"{format_bytes(result.peak_reserved_bytes)} reserved ({result.peak_phase}), "
        f"{len(result.events):,} events"
    )
    verdict = "PASS" if took <= STEP_TARGET_S else "FAIL"
    print(f"{verdict}: the whole step took {took:.1f} s (target <= {STEP_TARGET_S:.0f} s)")

    origin = config_from_dict(dict(LLAMA_8B_131K))
    print(f"\nV = 131,072, {args.tokens:,} tokens, checkpointing, AdamW, bf16:")
    print(
        f"{'kernel':<22}{'fwd+bwd peak':>14}{'step peak':>12}{'reserved':>12}"
        f"{'logprob working set':>21}{'time':>8}"
    )
    for kernel in ORIGIN_KERNELS:
        start = time.perf_counter()
        r = simulate_step(HFStep(origin, tokens=args.tokens, kernel=kernel, checkpointing=True))
        took = time.perf_counter() - start
        fwd_bwd = max(r.phase_peaks.get("forward", 0), r.phase_peaks.get("backward", 0))
        print(
            f"{kernel:<22}{format_bytes(fwd_bwd):>14}{format_bytes(r.peak_allocated_bytes):>12}"
            f"{format_bytes(r.peak_reserved_bytes):>12}"
            f"{format_bytes(r.logprob_working_bytes):>21}{took:>7.1f}s"
        )


if __name__ == "__main__":
    main()
