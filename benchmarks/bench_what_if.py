"""``attribute --what-if`` at the origin story's scale, held to the kernel sweep's figures.

    python benchmarks/bench_what_if.py [--layers 2] [--hidden 256]

Profiles ``origin_step`` (20,000 tokens, V = 131,072, bf16, an lm_head and a few MLP
layers) on meta with ``unchunked`` log-probs and again with ``local_chunked``; predicts the
second from the first with ``--what-if local_chunked``; checks that the prediction equals
the second profile's peak allocated exactly (reserved within one 2 MiB page) and that the
saving equals what ``memprobe sweep --tokens 20000 --vocab 131072`` gives per kernel
(unchunked's peak minus local_chunked's). Prints the figures and the time taken.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from origin_step import VOCAB, step_with  # noqa: E402

from memprobe.attribute import attribute  # noqa: E402
from memprobe.attribute.what_if import what_if  # noqa: E402
from memprobe.io.sizes import format_bytes  # noqa: E402
from memprobe.kernels import get_kernel  # noqa: E402
from memprobe.plan import simulated_peak  # noqa: E402
from memprobe.profile import profile_step  # noqa: E402
from memprobe.records import Case  # noqa: E402

TOKENS, CHUNK, PAGE = 20_000, 1024, 2 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    shape = {"tokens": TOKENS, "layers": args.layers, "hidden": args.hidden}

    def kernel(name: str):  # type: ignore[no-untyped-def]
        fn = get_kernel(name)
        return lambda logits, ids: fn(logits, ids, chunk_size=CHUNK)

    t0 = time.perf_counter()
    a = profile_step(functools.partial(step_with, logprobs=kernel("unchunked"), **shape), "meta")
    b = profile_step(
        functools.partial(step_with, logprobs=kernel("local_chunked"), **shape), "meta"
    )
    t1 = time.perf_counter()
    w = what_if(a, "local_chunked", chunk_size=CHUNK)
    t2 = time.perf_counter()
    recorded = attribute(b)
    sweep = {
        k: simulated_peak(Case(k, 1, TOKENS, VOCAB, "bf16", CHUNK))
        for k in ("unchunked", "local_chunked")
    }
    sweep_saving = sweep["unchunked"] - sweep["local_chunked"]
    print(f"step: {TOKENS:,} tokens, V={VOCAB:,}, bf16, H={args.hidden}, {args.layers} layers")
    print(f"profiles (both kernels) {t1 - t0:.1f} s; what-if {t2 - t1:.1f} s")
    print(
        f"recorded with unchunked {format_bytes(w.recorded_peak_bytes)}; predicted with "
        f"local_chunked {format_bytes(w.predicted_peak_bytes)} "
        f"({w.predicted_peak_bytes:,} B); profiled with local_chunked "
        f"{format_bytes(recorded.peak_allocated_bytes)} ({recorded.peak_allocated_bytes:,} B)"
    )
    print(
        f"reserved: predicted {format_bytes(w.predicted_reserved_peak_bytes)}, profiled "
        f"{format_bytes(recorded.peak_reserved_bytes)}"
    )
    print(
        f"saving {format_bytes(w.saved_bytes)} ({w.saved_bytes:,} B); the sweep's "
        f"unchunked - local_chunked = {format_bytes(sweep['unchunked'])} - "
        f"{format_bytes(sweep['local_chunked'])} = {sweep_saving:,} B"
    )
    ok = (
        w.predicted_peak_bytes == recorded.peak_allocated_bytes
        and recorded.peak_reserved_bytes is not None
        and abs(w.predicted_reserved_peak_bytes - recorded.peak_reserved_bytes) <= PAGE
        and w.saved_bytes == sweep_saving
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
