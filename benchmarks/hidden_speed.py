"""CPU forward + backward time of the hidden family, interleaved in one run.

    python benchmarks/hidden_speed.py [--shape 4096,1024,32768] [--reps 3] [--skip-torch]

Each repetition runs every route once, in turn, so a noisy neighbour slows
all of them alike; the figure is the median. Backward runs as a training step
sees it: ``torch.autograd.grad(out, (hidden, weight), grad_outputs)``. The
reference is the unfused route: one bf16 matmul to logits, then
``log_softmax(logits.float())`` and gather under autograd.

Targets (issue 15): fused_linear_chunked within 1.1x of the reference and at
least 4x faster than torch's linear_cross_entropy with acc_policy='accurate'
(its CPU default, float32 accumulation). The script prints each verdict, and
the matmul floor of the fused design on this machine: one float32-output
matmul (the forward's exact logits) and four bf16 ones (two per backward
pass), each ``N x H x V``, timed on their own.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from memprobe.kernels import get_kernel
from memprobe.measure.protocol import HiddenShape, make_hidden_inputs


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


def matmul_seconds(tokens: int, size: int, vocab: int, reps: int) -> tuple[float, float]:
    """Median seconds of one bf16 matmul and of one float32-output matmul of
    bf16-valued blocks (the fused forward's, in oneDNN's bf16 math mode)."""
    from memprobe.kernels.fused_linear import _bf16_valued_matmuls

    hidden = torch.randn(tokens, size).bfloat16()
    weight = torch.randn(vocab, size).bfloat16()
    wide = (hidden.float(), weight.float())

    def bf16() -> object:
        return hidden @ weight.t()

    def fp32_out() -> object:
        with _bf16_valued_matmuls(torch.bfloat16, hidden.device):
            return wide[0] @ wide[1].t()

    medians = []
    for fn in (bf16, fp32_out):
        fn()
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        medians.append(statistics.median(samples))
    return medians[0], medians[1]


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
    ratio = fused / ref
    print(f"target fused <= 1.1x reference: {'met' if ratio <= 1.1 else 'MISSED'} ({ratio:.2f}x)")
    if "torch auto (CPU: accurate + fp32 acc)" in times:
        speedup = statistics.median(times["torch auto (CPU: accurate + fp32 acc)"]) / fused
        verdict = "met" if speedup >= 4 else "MISSED"
        print(f"target fused >= 4x faster than torch CPU default: {verdict} ({speedup:.2f}x)")
    bf16, fp32_out = matmul_seconds(tokens, size, vocab, args.reps)
    floor = fp32_out + 4 * bf16
    print(
        f"matmul floor of the fused design: {fp32_out:.2f} s (float32-output) + 4 x {bf16:.2f} s "
        f"(bf16) = {floor:.2f} s = {floor / ref:.2f}x the reference's whole step"
    )


if __name__ == "__main__":
    main()
