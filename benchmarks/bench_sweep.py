"""Time the headline sweep: per-case simulation time, then the whole command.

    python benchmarks/bench_sweep.py [--tokens 20000] [--vocab 131072]

Targets (issue 3): the headline command end to end, verify and report
included, in ≤ 30 s on a 2-core machine. And a small real cpu sweep (81 tiny cases):
each case's garbage is collected without scanning torch's, pandas' and matplotlib's
objects again (a full collection per case took 0.16 s: 17 s for the sweep), ≤ 10 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memprobe.io.sizes import format_bytes
from memprobe.measure import measure
from memprobe.sweep import plan_cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--vocab", type=int, default=131072)
    args = parser.parse_args()
    cases = plan_cases(tokens=[args.tokens], vocab=[args.vocab], device="meta")
    total = 0.0
    print(f"{'case':<72} {'sim ms':>8} {'peak':>12}")
    for case in cases:
        t0 = time.perf_counter()
        run = measure(case)
        dt = time.perf_counter() - t0
        total += dt
        print(f"{case.case_id:<72} {dt * 1e3:8.1f} {format_bytes(run.peak_bytes):>12}")
    print(f"simulation: {len(cases)} cases in {total:.2f} s")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "memprobe",
            "sweep",
            "--tokens",
            str(args.tokens),
            "--vocab",
            str(args.vocab),
            "--quiet",
            "--out",
            str(Path(tmp) / "run"),
        ]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        took = time.perf_counter() - t0
        print(f"end to end: `{' '.join(cmd[2:])}` in {took:.2f} s (target <= 30 s)")
        grid = ["--tokens", "64,128,256", "--vocab", "128,256,512", "--grid", "--no-ladder"]
        cpu = [*cmd[:3], "sweep", *grid, "--device", "cpu", "--quiet", "--no-verify"]
        cpu += ["--no-report", "--out", str(Path(tmp) / "cpu")]
        t0 = time.perf_counter()
        subprocess.run(cpu, check=True, stdout=subprocess.DEVNULL)
        took = time.perf_counter() - t0
        print(f"cpu sweep: `{' '.join(cpu[2:-1])} ...` in {took:.2f} s (target <= 10 s)")


if __name__ == "__main__":
    main()
