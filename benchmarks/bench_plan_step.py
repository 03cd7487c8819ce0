"""``plan --step`` speed on an 8B Llama-shaped config, on meta (issue 24).

    python benchmarks/bench_plan_step.py                       # logits kernels + --fused
    python benchmarks/bench_plan_step.py --kernels unchunked,local_chunked

The config is built in code (hidden 4096, intermediate 14336, 32 layers, 32 heads / 8
key-value heads, V = 131,072): ``plan --step --budget 80GiB --checkpointing`` over the
shipped single-device logits kernels and ``fused_linear_chunked`` (``--fused``), AdamW,
bf16, allocated and reserved. Prints, per kernel as it finishes, the answers, the whole
steps simulated and the wall and CPU time; then the totals against the target (<= 5 min
over the kernels) and the load average. The verdict is on this process's CPU time: the
search runs in one process, so that is its wall time on an idle machine, and the
development machine is shared (its wall time there says more of the load than of the
search).
"""

from __future__ import annotations

import argparse
import os
import time

from bench_step import LLAMA_8B_131K  # the one 8B config of the benchmarks

from memprobe.kernels.registry import kernel_names
from memprobe.plan import make_budget
from memprobe.plan.model import TokenPlan
from memprobe.plan.whole_step import plan_step
from memprobe.profile.hf import HFStep, config_from_dict

PLAN_TARGET_S = 300.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=None, help="comma list (default: logits + fused)")
    parser.add_argument("--budget", default="80GiB")
    args = parser.parse_args()
    kernels = (
        args.kernels.split(",")
        if args.kernels
        else [*kernel_names(distributed=False), "fused_linear_chunked"]
    )
    base = HFStep(config_from_dict(dict(LLAMA_8B_131K)), tokens=1, checkpointing=True)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    last = [wall0, cpu0]
    steps = [0]

    def done(plan: TokenPlan) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        traced = len({t for t, _ in plan.allocated.points} | _reserved_points(plan))
        steps[0] += traced
        reserved = plan.reserved.max_tokens if plan.reserved is not None else None
        print(
            f"  {plan.target.kernel:<22} {plan.max_tokens:>8,} tokens allocated, "
            f"{reserved:>8,} reserved; {traced:>2} whole steps; "
            f"{wall - last[0]:6.0f} s wall, {cpu - last[1]:6.0f} s CPU",
            flush=True,
        )
        last[:] = [wall, cpu]

    plans = plan_step(base, kernels, make_budget(args.budget), on_done=done)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    verdict = "PASS" if cpu <= PLAN_TARGET_S else "FAIL"
    print(
        f"{verdict}: plan --step over {len(plans)} kernels simulated {steps[0]} whole steps in "
        f"{cpu:.0f} s CPU (target <= {PLAN_TARGET_S:.0f} s; {cpu / steps[0]:.2f} s a step), "
        f"{wall:.0f} s wall; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


def _reserved_points(plan: TokenPlan) -> set[int]:
    return {t for t, _ in plan.reserved.points} if plan.reserved is not None else set()


if __name__ == "__main__":
    main()
