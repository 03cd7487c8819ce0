"""Time and measure attribution of a snapshot with 1,000,000 trace entries.

    python benchmarks/bench_attribute.py [--entries 1000000] [--frames 16] [--corpus-only]

Targets (issues 12 and 22): a 1,000,000-entry snapshot read and attributed in ≤ 10 s,
``attribute --replay`` in ≤ 12 s, each with ≤ 2 GB resident.

Two snapshots:

- *synthetic*: imitates a caching allocator's trace of a chunked log-prob loop
  (addresses reused from a pool, C++ and Python frames on every entry, a few float32
  [B,S,V] blocks among many chunk-sized ones); attributed in this process, peak RSS
  of this process.
- *corpus*: a real-style training trace (the AdamW LM program of
  ``tests/attribute/corpus.py``, run on meta through the tracker: torch-style C++ and
  Python stacks, segments, the autograd engine's frames), its steady-state iteration
  repeated until the trace holds ``--entries`` entries, as a long training run's
  ring buffer would. ``memprobe attribute FILE`` and ``memprobe attribute FILE
  --replay`` each run as a fresh process, timed from start to exit (interpreter and
  imports included), with that process's own peak RSS.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memprobe.attribute import attribute, attribute_file
from memprobe.snapshot import load_snapshot, write_snapshot

MiB = 1 << 20
B, S, V = 1, 20000, 131072


def _frames(depth: int, step: int) -> list[dict[str, Any]]:
    cpp = [
        {"name": f"at::native::kernel_{i}(at::Tensor const&)", "filename": "??", "line": 0}
        for i in range(depth // 2)
    ]
    py = [
        {"name": f"layer_{i}", "filename": f"/home/me/rl/model_{i}.py", "line": 10 + step % 7}
        for i in range(depth - len(cpp))
    ]
    return cpp + py


LOSS = [
    {"name": "at::_ops::_log_softmax::call(at::Tensor const&, long, bool)", "filename": "??",
     "line": 0},
    {"name": "compute_logprobs", "filename": "/home/me/rl/loss.py", "line": 41},
]  # fmt: skip


def build_snapshot(entries: int, depth: int) -> dict[str, Any]:
    """About ``entries`` trace entries: alloc / free_requested / free_completed triples,
    a segment_alloc whenever the pool grows, a float32 [B,S,V] block (made by a
    log_softmax) every 5,000 steps. Each entry gets its own frames list (as a loaded
    file has), over frame dicts that repeat (as pickle's memo keeps them)."""
    trace: list[dict[str, Any]] = []
    free_addrs: list[int] = []
    live: list[tuple[int, int]] = []
    next_addr = 0x7F0000000000
    frame_sets = [_frames(depth, k) for k in range(8)]
    loss_frames = LOSS + frame_sets[1]
    t = 0
    step = 0
    while len(trace) < entries:
        step += 1
        t += 3
        big = step % 5000 == 0
        size = 4 * B * S * V if big else (4 * B * 1024 * V if step % 3 else 4096 + step % 512)
        if free_addrs and not big:
            addr = free_addrs.pop()
        else:
            addr = next_addr
            next_addr += max(size, 2 * MiB)
            trace.append(
                {"action": "segment_alloc", "addr": addr, "size": max(size, 2 * MiB), "stream": 0,
                 "time_us": t, "frames": frame_sets[step % 8]}
            )  # fmt: skip
        frames = loss_frames if big else frame_sets[step % 8]
        trace.append(
            {"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t,
             "frames": list(frames)}
        )  # fmt: skip
        live.append((addr, size))
        if len(live) > 6:  # keep a bounded working set, freeing the oldest
            old_addr, old_size = live.pop(0)
            for action in ("free_requested", "free_completed"):
                trace.append(
                    {"action": action, "addr": old_addr, "size": old_size, "stream": 0,
                     "time_us": t + 1, "frames": list(frame_sets[0])}
                )  # fmt: skip
            if old_size < 4 * B * S * V:
                free_addrs.append(old_addr)
    return {"segments": [], "device_traces": [trace[:entries]]}


def corpus_snapshot(entries: int) -> tuple[dict[str, Any], int]:
    """The corpus's AdamW LM with its steady iteration repeated to ``entries`` entries."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "attribute"))
    import corpus  # type: ignore[import-not-found]  # noqa: PLC0415 (needs torch)

    return corpus.repeated_training(entries)


# The child prints its own peak RSS and CPU time on exit: RUSAGE_CHILDREN would give
# the largest child's, not each one's.
_CHILD = (
    "import atexit, resource, runpy, sys; "
    "u = lambda: resource.getrusage(resource.RUSAGE_SELF); "
    "atexit.register(lambda: print('USAGE', u().ru_maxrss, u().ru_utime + u().ru_stime, "
    "file=sys.stderr)); sys.argv = ['memprobe', *sys.argv[1:]]; "
    "runpy.run_module('memprobe', run_name='__main__')"
)


def _timed(args: list[str]) -> tuple[float, float, float, str]:
    """``memprobe ARGS`` in a fresh process: (seconds from start to exit, its CPU
    seconds, its peak RSS in GiB, its stdout). On a shared machine the wall time waits
    for other processes; the CPU time is what the command itself costs."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"memprobe {' '.join(args)} failed: {done.stderr.strip()}")
    usage = next(x.split() for x in done.stderr.splitlines() if x.startswith("USAGE"))
    return seconds, float(usage[2]), int(usage[1]) / 2**20, done.stdout


def bench_corpus(entries: int, keep: Path | None = None) -> None:
    snap, period = corpus_snapshot(entries)
    n = len(snap["device_traces"][0])
    with tempfile.TemporaryDirectory() as tmp:
        path = write_snapshot(snap, keep or Path(tmp) / "corpus.pickle")
        size = path.stat().st_size
        del snap
        cli = ["attribute", str(path)]
        load = os.getloadavg()[0]
        t_attr, cpu_attr, rss_attr, text = _timed(cli)
        t_replay, cpu_replay, rss_replay, replay_text = _timed([*cli, "--replay"])
        load = max(load, os.getloadavg()[0])
    print(f"corpus trace entries:     {n:,} ({size / MiB:.1f} MiB pickle, one iteration "
          f"{period:,} entries, repeated)")  # fmt: skip
    print(f"memprobe attribute:          {t_attr:.2f} s wall, {cpu_attr:.2f} s CPU, peak RSS "
          f"{rss_attr:.2f} GiB  (target: <= 10 s, <= 2 GB)")  # fmt: skip
    print(f"memprobe attribute --replay: {t_replay:.2f} s wall, {cpu_replay:.2f} s CPU, peak "
          f"RSS {rss_replay:.2f} GiB  (target: <= 12 s, <= 2 GB)")  # fmt: skip
    print(f"  load average {load:.1f} on {os.cpu_count()} CPUs (wall time waits for the others)")
    shapes = next((line for line in text.splitlines() if line.startswith("shapes:")), "?")
    print(f"  {shapes}")
    replay = [line for line in replay_text.splitlines() if line.startswith("replay on")]
    print(f"  {replay[0] if replay else 'no replay line'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--frames", type=int, default=16, help="frames per trace entry")
    parser.add_argument("--corpus-only", action="store_true", help="skip the synthetic run")
    parser.add_argument("--keep", type=Path, help="also write the corpus snapshot here")
    args = parser.parse_args()
    bench_corpus(args.entries, keep=args.keep)
    if args.corpus_only:
        return
    snap = build_snapshot(args.entries, args.frames)
    n = len(snap["device_traces"][0])
    with tempfile.TemporaryDirectory() as tmp:
        path = write_snapshot(snap, Path(tmp) / "bench.pickle")
        size = path.stat().st_size
        t0 = time.perf_counter()
        load_snapshot(path)
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        attribute_file(path, vocab=V)
        t_file = time.perf_counter() - t0
    t0 = time.perf_counter()
    findings = attribute(snap, vocab=V)
    t_attr = time.perf_counter() - t0
    fp32 = sum(f.size == 4 * B * S * V and f.dtype == "float32" for f in findings.findings)
    print(
        f"trace entries:            {n:,} ({size / MiB:.1f} MiB pickle, {args.frames} frames each)"
    )
    print(f"load (safe unpickler):    {t_load:.2f} s")
    print(f"attribute (dict):         {t_attr:.2f} s")
    print(f"attribute_file (both):    {t_file:.2f} s  (target: <= 10 s)")
    print(f"findings: {len(findings.findings)}, float32 [B,S,V] among them: {fp32}")
    print(f"inferred: {findings.inference.shape_text()} ({findings.inference.confidence})")
    # ru_maxrss is KiB on Linux: the peak of this whole process (snapshot dict included).
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS:                 {peak_rss:.2f} GiB  (target: <= 2 GB)")


if __name__ == "__main__":
    main()
