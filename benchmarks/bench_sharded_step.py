"""``memprobe step --fsdp 8 --cp 8`` on an 8B Llama-shaped config, as rank 0 of a fake world.

    python benchmarks/bench_sharded_step.py            # the timed step and the origin table
    python benchmarks/bench_sharded_step.py --quick    # the timed step only

1. Speed (issue 26): an 8B-parameter Llama-shaped config (hidden 4096, 32 layers,
   intermediate 14336, 32 heads / 8 key-value heads, V 131,072), FSDP2 over 8 x 8 ranks
   with context parallel 8, 20,000 tokens per GPU (a 160,000-token sequence), activation
   checkpointing, bf16 compute on float32 shards, float32 reduce-scatter, float32 unit
   outputs, local_chunked, AdamW: the whole step simulated in <= 90 s.
2. The origin story in shape: the same step with the unchunked kernel and with
   local_chunked, each with FSDP2's ``output_dtype`` float32 and without, side by side
   (per-rank peaks of the forward, the backward and the whole step).
"""

from __future__ import annotations

import argparse
import time

from bench_step import LLAMA_8B_131K  # the one 8B config of the benchmarks

from memprobe.io.sizes import format_bytes
from memprobe.profile.hf import config_from_dict
from memprobe.profile.sharded import ShardedHFStep, Sharding
from memprobe.profile.step import StepResult, simulate_step

TARGET_S = 90.0


def run(kernel: str, mp_output: str | None, tokens: int) -> tuple[StepResult, float, float]:
    """The simulated step, its wall and CPU seconds."""
    step = ShardedHFStep(
        config_from_dict(dict(LLAMA_8B_131K)),
        tokens=tokens,
        kernel=kernel,
        checkpointing=True,
        dtype="bf16",
        param_dtype="fp32",
        sharding=Sharding(fsdp=8, cp=8, mp_reduce="fp32", mp_output=mp_output),
    )
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate_step(step)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000, help="tokens per GPU")
    parser.add_argument("--quick", action="store_true", help="the timed step only")
    args = parser.parse_args()

    result, wall, cpu = run("local_chunked", "fp32", args.tokens)
    s = result.sharded or {}
    print(
        f"{result.parameters / 1e9:.2f}B parameters, FSDP 8 x CP 8 (rank 0 of {s.get('world')}), "
        f"{args.tokens:,} tokens per GPU ({s.get('sequence_tokens', 0):,}-token sequence), "
        f"checkpointing, local_chunked, --mp-output fp32, AdamW: peak "
        f"{format_bytes(result.peak_allocated_bytes)} allocated, "
        f"{format_bytes(result.peak_reserved_bytes)} reserved ({result.peak_phase}), "
        f"{len(result.events):,} events"
    )
    verdict = "ok" if wall <= TARGET_S else "over target"
    print(
        f"simulated in {wall:.1f} s wall, {cpu:.1f} s CPU (target <= {TARGET_S:.0f} s): {verdict}"
    )
    if args.quick:
        return
    rows = {("local_chunked", "fp32"): result}
    for kernel in ("unchunked", "local_chunked"):
        for mp_output in ("fp32", None):
            key = (kernel, mp_output or "none")
            if key not in rows:
                rows[key] = run(kernel, mp_output, args.tokens)[0]
    print()
    print(
        "| kernel | --mp-output | forward peak | backward peak | step peak | logprob working set |"
    )
    print("|---|---|---|---|---|---|")
    for (kernel, mp_output), r in sorted(
        rows.items(), key=lambda kv: (kv[0][0] != "unchunked", kv[0][1])
    ):
        print(
            f"| {kernel} | {mp_output} | {format_bytes(r.phase_peaks.get('forward', 0))} | "
            f"{format_bytes(r.phase_peaks.get('backward', 0))} | "
            f"{format_bytes(r.peak_allocated_bytes)} ({r.peak_phase}) | "
            f"{format_bytes(r.logprob_working_bytes)} |"
        )


if __name__ == "__main__":
    main()
