"""CPU forward + backward time of the hidden family, interleaved in one run.

    python benchmarks/hidden_speed.py [--shape 4096,1024,32768] [--reps 3] [--skip-torch]

Each repetition runs every route once, in turn, so a noisy neighbour slows
all of them alike; the figure is the median. Backward runs as a training step
sees it: ``torch.autograd.grad(out, (hidden, weight), grad_outputs)``. The
reference is the unfused route: one bf16 matmul to logits, then
``log_softmax(logits.float())`` and gather under autograd.

Targets (issue 15): fused_linear_chunked within 1.1x of the reference and at
least 4x faster than torch's linear_cross_entropy with acc_policy='accurate'.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from memprobe.kernels import get_kernel
from memprobe.measure.hidden import HiddenShape, make_hidden_inputs


def reference(hidden, weight, targets, *, chunk_size=None):  # type: ignore[no-untyped-def]
    logits = hidden @ weight.t()
    logprobs = torch.log_softmax(logits.float(), -1)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def torch_cpu_default(hidden, weight, targets, *, chunk_size=None):  # type: ignore[no-untyped-def]
    """torch's 'auto' on CPU: 'accurate' with float32 accumulators."""
    b, s, h = hidden.shape
    loss = torch.nn.functional.linear_cross_entropy(
        hidden.reshape(b * s, h),
        weight,
        targets.reshape(-1),
        reduction="none",
        options=torch.nn.LinearCrossEntropyOptions(),
    )
    return loss.neg().float().view(b, s)


def step_seconds(fn, inputs) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    out = fn(inputs.hidden, inputs.weight, inputs.targets)
    torch.autograd.grad(out, (inputs.hidden, inputs.weight), inputs.grad_outputs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4096,1024,32768", help="TOKENS,H,V")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-torch", action="store_true", help="leave torch's routes out")
    args = parser.parse_args()
    tokens, size, vocab = (int(v) for v in args.shape.split(","))
    inputs = make_hidden_inputs(HiddenShape(1, tokens, size, vocab), "cpu")
    routes = {
        "reference (matmul + log_softmax)": reference,
        "linear_local_chunked": get_kernel("linear_local_chunked"),
        "fused_linear_chunked": get_kernel("fused_linear_chunked"),
    }
    if not args.skip_torch:
        routes["torch_linear_ce (compact)"] = get_kernel("torch_linear_ce")
        routes["torch_linear_ce_accurate"] = get_kernel("torch_linear_ce_accurate")
        routes["torch auto (CPU: accurate + fp32 acc)"] = torch_cpu_default
    times: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(args.reps):
        for name, fn in routes.items():
            times[name].append(step_seconds(fn, inputs))
            print(f"  {name}: {times[name][-1]:.2f} s", flush=True)
    ref = statistics.median(times["reference (matmul + log_softmax)"])
    fused = statistics.median(times["fused_linear_chunked"])
    print(f"\nbf16 {tokens} tokens x H={size} x V={vocab}, fwd+bwd, median of {args.reps}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} s | {med / ref:.2f}x reference | {med / fused:.2f}x fused |")


if __name__ == "__main__":
    main()
