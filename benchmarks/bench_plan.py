"""Time a plan over every kernel x three TP values, in process and end to end.

    python benchmarks/bench_plan.py [--vocab 131072] [--budget 80GiB] [--other 54GiB]
                                    [--tp 1,2,8] [--jobs N]

Target (issue 14): a plan over the 8 kernels x 3 TP values in <= 10 s on a 2-core
machine. Single-device kernels cannot shard the vocabulary, so at tp > 1 only the
vocabulary-parallel ones are planned (as the sweep decides); every kernel runs at tp 1.
Prints each plan's answer, simulations and time (one process), then the whole
command's wall time, in order (the default) and with a pool of --jobs processes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from memprobe.io.sizes import format_bytes
from memprobe.kernels import kernel_names
from memprobe.plan import make_budget, plan_targets, run_plans, simulated_peak
from memprobe.records import Case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--budget", default="80GiB")
    parser.add_argument("--other", default="54GiB")
    parser.add_argument("--tp", default="1,2,8")
    parser.add_argument("--jobs", type=int, default=2, help="pool size for the pooled runs")
    args = parser.parse_args()
    tp = tuple(int(t) for t in args.tp.split(","))
    # Every logits kernel, as the plan's defaults with tp above 1.
    kernels = kernel_names(inputs="logits")
    budget = make_budget(args.budget, args.other)
    targets, skipped = plan_targets(kernels, vocab=args.vocab, tp=tp)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{len(kernels)} kernels x tp {args.tp}: {len(targets)} plans ({len(skipped)} skipped)")

    t0 = time.perf_counter()
    simulated_peak(Case("unchunked", 1, 1, 1))
    print(f"torch meta warm-up: {time.perf_counter() - t0:.2f} s")
    print(f"{'kernel':<22}{'tp':>3}{'tokens/GPU':>12}{'peak':>12}{'sims':>6}{'line':>7}{'s':>7}")
    serial = 0.0
    for target in targets:
        t1 = time.perf_counter()
        (p,) = run_plans([target], budget, reserved=False)
        dt = time.perf_counter() - t1
        serial += dt
        a = p.allocated
        line = "exact" if a.predicted == p.max_tokens else "off"
        print(
            f"{target.kernel:<22}{target.tp:>3}{p.max_tokens:>12,}"
            f"{format_bytes(a.peak_at_max):>12}{a.simulations:>6}{line:>7}{dt:>7.2f}"
        )
    print(f"in process, one after another: {serial:.2f} s")

    t2 = time.perf_counter()
    run_plans(targets, budget, jobs=args.jobs, reserved=False)
    print(f"in process, {args.jobs} jobs: {time.perf_counter() - t2:.2f} s")

    cmd = [sys.executable, "-m", "memprobe", "plan", "--vocab", str(args.vocab)]
    cmd += ["--budget", args.budget, "--other", args.other, "--tp", args.tp]
    cmd += ["--kernel", ",".join(kernels)]
    # Allocated only (the target: <= 10 s), then with the reserved answer too.
    for extra in (["--no-reserved"], []):
        t3 = time.perf_counter()
        done = subprocess.run([*cmd, *extra], capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t3
        what = "allocated only" if extra else "allocated and reserved"
        print(f"end to end (python -m memprobe plan, imports included, {what}): {wall:.2f} s")
    print(done.stdout.strip().splitlines()[-1])
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
