"""Time the headline sweep: per-case simulation time, then the whole command.

    python benchmarks/bench_sweep.py [--tokens 20000] [--vocab 131072]

Targets (issue 3): the headline command end to end, verify and report
included, in ≤ 30 s on a 2-core machine.
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


if __name__ == "__main__":
    main()
