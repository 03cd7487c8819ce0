"""Time and measure attribution of a snapshot with 1,000,000 trace entries.

    python benchmarks/bench_attribute.py [--entries 1000000] [--frames 16]

Targets (issue 12): a 1,000,000-entry snapshot attributes in ≤ 10 s with ≤ 2 GB
resident (peak RSS of this process, printed at the end). The snapshot
imitates a caching allocator's trace of a chunked log-prob loop: addresses reused
from a pool, C++ and Python frames on every entry, a few float32 [B,S,V] blocks
among many chunk-sized ones. Loading (the safe unpickler) is timed separately.
"""

from __future__ import annotations

import argparse
import resource
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--frames", type=int, default=16, help="frames per trace entry")
    args = parser.parse_args()
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
