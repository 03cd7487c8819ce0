"""One prepared check of memprobe's cuda path on a machine with one GPU (≤ 5 minutes).

    python benchmarks/gpu_check.py --out gpu-check/

It runs the real ``memprobe sweep`` path on cuda for every single-device kernel at
4,096 and 20,000 tokens × 131,072 (bf16), and for the hidden family (lm_head fused
or not, H = 4096) at 4,096 tokens, and checks each case against the exact meta
simulation:

* allocated peaks (total, forward, backward): the allocator rounds every block up to
  512 bytes, so the measured peak may exceed the simulated one by at most 511 bytes per
  block live at once in the simulated trace (the tolerance is computed per case and
  written down), and never falls below it;
* ``big_fp32_blocks``: equal;
* reserved peak against the allocator model (``memprobe.allocator``) when that package
  is importable; shown, not judged;
* phase labels: the recorded trace labels forward and backward allocations (backward
  runs on autograd's device thread), and nothing else;

then a real out-of-memory error of ``unchunked`` at 160,000 tokens, captured in the
allocator snapshot and attributed with memprobe's attribution code;

* the sharded sweep (``torchrun --nproc-per-node <visible GPUs> -m memprobe sweep
  --shard``) of the logits kernels at the first ``--tokens``: judged on writing the
  same cases, statuses and allocated peaks as the one-process sweep above, in the same
  order; its wall time is shown beside the one-process one;
* the GPU peers (Liger-Kernel's fused linear cross-entropy and cross-entropy, Cut
  Cross-Entropy's linear cross-entropy) beside ``fused_linear_chunked`` and torch's
  ``linear_cross_entropy``: peak, time, and the worst error of the log-probs and of the
  gradients against float64 at a smaller shape (a peer not installed is listed as
  skipped with the reason; shown, not judged);
* each logits kernel's forward + backward time against the HBM floor: the bytes any
  such kernel must move (read the logits in forward; read them and write their
  gradient in backward: 3 × the logits' bytes) over the device's copy bandwidth,
  measured here with a device-to-device copy (shown, not judged);

and the whole run's wall time. It writes ``summary.json`` and ``summary.md`` (and the
sweeps' run directories and the OOM snapshot) under ``--out``. Exit 0 when every judged
check passes, 1 otherwise.

Without a GPU it says so in one line and exits 0, measuring nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

BUDGET_S = 300.0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 20000])
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--oom-tokens", type=int, default=160_000)
    parser.add_argument("--hidden", type=int, default=4096, help="0 leaves the hidden family out")
    parser.add_argument("--hidden-tokens", type=int, default=4096)
    parser.add_argument(
        "--error-shape",
        type=int,
        nargs=3,
        default=[1024, 32768, 1024],
        metavar=("TOKENS", "VOCAB", "HIDDEN"),
        help="where the peers' error against float64 is measured",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no GPU here (torch.cuda.is_available() is False); nothing measured")
        return 0
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    sweep_started = time.perf_counter()
    cases = _sweep(args)
    sweep_s = time.perf_counter() - sweep_started
    oom = _oom_check(args)
    sharded = _sharded_sweep(args, sweep_s)
    peers = _peers(args)
    floors = _hbm_floors(cases, peers)
    wall_s = time.perf_counter() - started
    judged = [c["pass"] for c in cases] + [oom["pass"], sharded["pass"], wall_s <= BUDGET_S]
    summary = {
        "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(),
        "device_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
        "allocator_backend": torch.cuda.memory.get_allocator_backend(),
        "allocator_model": _allocator_model() is not None,
        "tolerance": "measured - simulated in [0, 511 B x most blocks live at once (per case)]",
        "cases": cases,
        "oom": oom,
        "sharded": sharded,
        "peers": peers,
        "hbm_floor": floors,
        "wall_s": round(wall_s, 1),
        "budget_s": BUDGET_S,
        "pass": all(judged),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    (args.out / "summary.md").write_text(_markdown(summary), encoding="utf-8")
    verdict = "PASS" if summary["pass"] else "FAIL"
    print(f"gpu_check: {verdict} in {wall_s:.0f} s; summary in {args.out / 'summary.md'}")
    return 0 if summary["pass"] else 1


# -- the sweep ----------------------------------------------------------------
def _sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    from memprobe.kernels import kernel_names
    from memprobe.records import Case
    from memprobe.results import rows_of
    from memprobe.sweep import plan_cases, run_sweep

    cases = plan_cases(
        tokens=args.tokens,
        vocab=[args.vocab],
        dtype=["bf16"],
        kernel=kernel_names(distributed=False),
        device="cuda",
        ladder=False,
    )
    if args.hidden:
        cases += plan_cases(
            tokens=[args.hidden_tokens],
            vocab=[args.vocab],
            dtype=["bf16"],
            hidden=[args.hidden],
            device="cuda",
            ladder=False,
        )
    run_dir = args.out / "sweep"
    frame = run_sweep(cases, run_dir, verify=False, command="benchmarks/gpu_check.py")
    fields = {f.name for f in dataclasses.fields(Case)}
    return [
        _check_case(Case(**{k: v for k, v in row.items() if k in fields}), row, run_dir)
        for row in rows_of(frame)
    ]


def _check_case(case: Any, row: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    from memprobe.measure.compare import rounding_slack
    from memprobe.measure.meta_backend import simulate_tracker
    from memprobe.measure.traced import StepTrace, run_from_trace

    meta_case = dataclasses.replace(case, device="meta")
    trace = StepTrace(simulate_tracker(meta_case, capture_frames=False), 0, 0)
    meta = run_from_trace(meta_case, trace)
    slack = rounding_slack(trace.tracker.events)
    out: dict[str, Any] = {
        "case": case.case_id,
        "kernel": case.kernel,
        "tokens": case.tokens,
        "vocab": case.vocab,
        "hidden": case.hidden,
        "status": row["status"],
        "note": row["note"],
        "tolerance_bytes": slack,
        "fwd_time_s": row["fwd_time_s"],
        "bwd_time_s": row["bwd_time_s"],
    }
    checks: dict[str, bool] = {"status ok": row["status"] == "ok"}
    for name in ("peak_bytes", "forward_peak_bytes", "backward_peak_bytes"):
        measured, simulated = row[name], getattr(meta, name)
        out[name] = {"cuda": measured, "meta": simulated}
        ok = measured is not None and 0 <= measured - simulated <= slack
        checks[f"{name} within tolerance"] = ok
    out["big_fp32_blocks"] = {"cuda": row["big_fp32_blocks"], "meta": meta.big_fp32_blocks}
    checks["big_fp32_blocks equal"] = row["big_fp32_blocks"] == meta.big_fp32_blocks
    out["reserved"] = _reserved(case, trace.tracker.events, row["reserved_peak_bytes"])
    out["labels"] = _labels(run_dir, row.get("snapshot"))
    checks["phases labelled"] = (
        out["labels"].get("forward", 0) > 0
        and out["labels"].get("backward", 0) > 0
        and set(out["labels"]) <= {"forward", "backward"}
    )
    out["checks"] = checks
    out["pass"] = all(checks.values())
    return out


def _allocator_model() -> Any:
    try:
        import memprobe.allocator as model  # built in parallel; absent on older trees
    except ImportError:
        return None
    return model if hasattr(model, "simulate") else None


def _reserved(case: Any, events: Any, measured: int | None) -> dict[str, Any]:
    """The model's reserved peak for the inputs (targets and upstream gradient first,
    then the traced step, which starts with the logits) beside the measured one."""
    model = _allocator_model()
    if model is None:
        return {"cuda": measured, "model": None, "note": "memprobe.allocator not available"}
    tokens = case.batch * case.local_tokens
    inputs = [("alloc", "targets", tokens * 8), ("alloc", "grad_outputs", tokens * 4)]
    from memprobe.snapshot.synthesize import allocator_requests

    requests, _ = allocator_requests(events)  # what the allocator sees of the tracked step
    steps = [(e.action, e.storage, e.nbytes) for e in requests]
    try:
        predicted = model.simulate([*inputs, *steps], model.alloc_conf_from_env())
    except Exception as exc:  # the model is another piece's; report, do not stop
        return {"cuda": measured, "model": None, "note": f"model failed: {exc}"}
    value = predicted.reserved_peak_bytes
    diff = None if measured is None else round(100.0 * (measured - value) / value, 2)
    return {"cuda": measured, "model": value, "diff_pct": diff}


def _labels(run_dir: Path, snapshot: str | None) -> dict[str, int]:
    """Allocations in the recorded trace by phase label (``none``: unlabelled)."""
    if not snapshot:
        return {}
    from memprobe.snapshot import load_snapshot, parse_label

    snap = load_snapshot(run_dir / snapshot)
    phases: Counter[str] = Counter()
    for trace in snap.get("device_traces", []):
        for entry in trace:
            if entry.get("action") == "alloc":
                phases[parse_label(entry.get("user_metadata")).get("phase", "none")] += 1
    return dict(phases)


# -- a real out-of-memory error -----------------------------------------------
def _oom_check(args: argparse.Namespace) -> dict[str, Any]:
    from memprobe.attribute import attribute
    from memprobe.io.codec import to_json
    from memprobe.measure import measure
    from memprobe.measure.meta_backend import simulate_tracker
    from memprobe.records import Case
    from memprobe.snapshot import write_snapshot

    case = Case("unchunked", 1, args.oom_tokens, args.vocab, "bf16", 1024, device="cuda")
    capacity = torch.cuda.get_device_properties(0).total_memory
    simulated = simulate_tracker(dataclasses.replace(case, device="meta"), capture_frames=False)
    out: dict[str, Any] = {
        "case": case.case_id,
        "simulated_peak_bytes": simulated.peak_bytes,
        "device_memory_bytes": capacity,
    }
    run = measure(case)
    out.update(status=run.status, note=run.note)
    if run.status != "oom" or run.cuda_snapshot is None:
        out["pass"] = False
        return out
    path = write_snapshot(run.cuda_snapshot, args.out / "oom.pickle")
    findings = attribute(run.cuda_snapshot, vocab=case.vocab, tokens=case.tokens, batch=1, top=5)
    out["snapshot"] = str(path)
    out["ooms"] = to_json(findings.ooms)
    live = [f for f in findings.findings if f.live_at_oom]
    out["live_at_oom"] = [
        {
            "bytes": f.size,
            "dtype": f.dtype,
            "shape": list(f.shape) if f.shape else None,
            "op": f.op,
            "phase": f.phase,
        }
        for f in live
    ]
    bsv = (1, case.tokens, case.vocab)
    out["pass"] = bool(findings.ooms) and any(f.shape == bsv for f in live)
    return out


# -- the sharded sweep ----------------------------------------------------------
TIMING_COLUMNS = ("fwd_time_s", "bwd_time_s", "reserved_peak_bytes", "reserved_source")


def _sharded_sweep(args: argparse.Namespace, single_s: float) -> dict[str, Any]:
    """``torchrun ... sweep --shard`` on every visible GPU, against the one-process rows."""
    from memprobe.results import read_rows

    gpus = torch.cuda.device_count()
    run_dir = args.out / "sharded"
    tokens = args.tokens[0]
    if _device() != "cuda":
        # tests/measure/test_gpu_check.py's fake GPU lives in this process only.
        return {"gpus": gpus, "tokens": tokens, "pass": True, "skipped": "no real GPU"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus),
        "-m", "memprobe", "sweep", "--shard", "--device", "cuda", "--kernel",
        ",".join(_single_device_kernels()), "--tokens", str(tokens), "--vocab",
        str(args.vocab), "--dtype", "bf16", "--no-ladder", "--no-verify", "--quiet",
        "--out", str(run_dir),
    ]  # fmt: skip
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=BUDGET_S)
    wall_s = time.perf_counter() - started
    out: dict[str, Any] = {"gpus": gpus, "tokens": tokens, "wall_s": round(wall_s, 1)}
    out["one_process_sweep_s"] = round(single_s, 1)
    if done.returncode != 0:
        out.update({"pass": False, "error": done.stderr[-2000:]})
        return out
    single = [r for r in read_rows(args.out / "sweep") if r["tokens"] == tokens and not r["hidden"]]
    shard = read_rows(run_dir)

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (row["case_id"], row["status"], row["peak_bytes"])

    out["cases"] = len(shard)
    out["same_cases_in_order"] = [r["case_id"] for r in shard] == [r["case_id"] for r in single]
    out["same_status_and_peak"] = [key(r) for r in shard] == [key(r) for r in single]
    out["pass"] = out["same_cases_in_order"] and out["same_status_and_peak"]
    return out


def _device() -> str:
    """Where "cuda" tensors are made: the GPU, or the CPU under the tests' fake GPU."""
    from memprobe.measure import cuda_backend

    return cuda_backend.DEVICE


def _single_device_kernels() -> list[str]:
    from memprobe.kernels import kernel_names

    return kernel_names(distributed=False)


# -- the GPU peers -------------------------------------------------------------
HIDDEN_PEERS = ("liger_fused_linear_ce", "cce_linear_ce", "fused_linear_chunked", "torch_linear_ce")
LOGITS_PEERS = ("liger_cross_entropy", "local_chunked")


def _peers(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Peak and time at the hidden family's shape, error against float64 at a smaller one."""
    from memprobe.measure import measure
    from memprobe.records import Case

    out = []
    for kernel in (*HIDDEN_PEERS, *LOGITS_PEERS):
        hidden = args.hidden if kernel in HIDDEN_PEERS else None
        case = Case(
            kernel, 1, args.hidden_tokens, args.vocab, "bf16", 1024, device="cuda", hidden=hidden
        )
        run = measure(case)
        row: dict[str, Any] = {
            "kernel": kernel,
            "hidden": hidden,
            "tokens": case.tokens,
            "vocab": case.vocab,
            "status": run.status,
            "note": run.note,
            "peak_bytes": run.peak_bytes,
            "floor_bytes": run.floor_bytes,
            "fwd_time_s": run.fwd_time_s,
            "bwd_time_s": run.bwd_time_s,
        }
        if run.status == "ok":
            row.update(_error_vs_float64(kernel, hidden is not None, args.error_shape))
        out.append(row)
    return out


def _error_vs_float64(kernel: str, hidden_family: bool, shape: list[int]) -> dict[str, Any]:
    """Worst |error| of the log-probs and of the gradients against a float64 reference
    from the same (bf16-rounded) values, with a random upstream gradient (as memprobe's
    step has) and with ones (what a mean or sum loss hands down)."""
    from memprobe.kernels import get_spec

    tokens, vocab, size = shape
    device = _device()
    gen = torch.Generator(device=device).manual_seed(0)
    targets = torch.randint(0, vocab, (1, tokens), generator=gen, device=device)
    upstream = torch.randn(1, tokens, generator=gen, device=device)
    if hidden_family:
        leaves = [
            torch.randn(1, tokens, size, generator=gen, device=device).bfloat16(),
            (torch.randn(vocab, size, generator=gen, device=device) / size**0.5).bfloat16(),
        ]
    else:
        leaves = [(3 * torch.randn(1, tokens, vocab, generator=gen, device=device)).bfloat16()]

    def logits_of(ts: list[torch.Tensor]) -> torch.Tensor:
        return ts[0] @ ts[1].T if hidden_family else ts[0]

    result: dict[str, Any] = {"error_shape": shape}
    for name, grad_out in (("random", upstream), ("ones", torch.ones_like(upstream))):
        ref_leaves = [t.double().requires_grad_() for t in leaves]
        ref = logits_of(ref_leaves).log_softmax(-1).gather(-1, targets[..., None])[..., 0]
        ref_grads = torch.autograd.grad(ref, ref_leaves, grad_out.double())
        mine = [t.clone().requires_grad_() for t in leaves]  # a consuming kernel gets a copy
        fn: Any = get_spec(kernel).fn
        got = fn(*mine, targets) if hidden_family else fn(mine[0], targets)
        grads = torch.autograd.grad(got, mine, grad_out)
        result[f"max_abs_err_fwd_{name}"] = (got.double() - ref.detach()).abs().max().item()
        result[f"max_abs_err_bwd_{name}"] = max(
            (g.double() - r).abs().max().item() for g, r in zip(grads, ref_grads, strict=True)
        )
        del ref_leaves, ref, ref_grads, mine, got, grads
        torch.cuda.empty_cache()
    return result


# -- logits kernels against the HBM floor -------------------------------------
def _copy_bandwidth(repeats: int = 5) -> float:
    """Bytes per second a device-to-device copy moves (each byte read once, written once),
    over 2 GiB (or a quarter of the free memory): far past every cache."""
    free, _ = torch.cuda.mem_get_info()
    nbytes = min(2**31, free // 4)
    src = torch.empty(nbytes, dtype=torch.uint8, device=_device())
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / min(times)


def _hbm_floors(cases: list[dict[str, Any]], peers: list[dict[str, Any]]) -> dict[str, Any]:
    """fwd + bwd time over the time the floor's bytes take at the copy bandwidth."""
    bandwidth = _copy_bandwidth()
    rows = []
    timed = [c for c in cases if c["hidden"] is None] + [p for p in peers if p["hidden"] is None]
    for c in timed:
        if c["status"] != "ok" or c["fwd_time_s"] is None or c["bwd_time_s"] is None:
            continue
        logits_bytes = c["tokens"] * c["vocab"] * 2  # bf16
        moved = 3 * logits_bytes
        floor_s = moved / bandwidth
        total = c["fwd_time_s"] + c["bwd_time_s"]
        rows.append(
            {
                "kernel": c["kernel"],
                "tokens": c["tokens"],
                "bytes_moved": moved,
                "floor_s": floor_s,
                "fwd_bwd_s": total,
                "x_floor": round(total / floor_s, 2),
            }
        )
    return {"copy_bandwidth_bytes_per_s": bandwidth, "kernels": rows}


# -- the summary --------------------------------------------------------------
def _gib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**30:.3f} GiB"


def _markdown(s: dict[str, Any]) -> str:
    lines = [
        f"# memprobe GPU check: {'PASS' if s['pass'] else 'FAIL'}",
        "",
        f"{s['device_name']} ({_gib(s['device_memory_bytes'])}), torch {s['torch_version']}, "
        f"allocator {s['allocator_backend']}; wall time {s['wall_s']} s "
        f"(budget {s['budget_s']:.0f} s).",
        "",
        f"Tolerance: {s['tolerance']}.",
        "",
        "| kernel | tokens | status | peak cuda | peak meta | diff B | tol B "
        "| fp32 blocks cuda/meta | reserved cuda | reserved model | labels | fwd s | bwd s "
        "| pass |",
        "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---|",
    ]
    for c in s["cases"]:
        peak = c["peak_bytes"]
        diff = None if peak["cuda"] is None else peak["cuda"] - peak["meta"]
        labels = ", ".join(f"{k} {v}" for k, v in sorted(c["labels"].items()))
        lines.append(
            f"| {c['kernel']} | {c['tokens']} | {c['status']} | {_gib(peak['cuda'])} "
            f"| {_gib(peak['meta'])} | {diff} | {c['tolerance_bytes']} "
            f"| {c['big_fp32_blocks']['cuda']}/{c['big_fp32_blocks']['meta']} "
            f"| {_gib(c['reserved']['cuda'])} | {_gib(c['reserved'].get('model'))} "
            f"| {labels} | {_secs(c['fwd_time_s'])} | {_secs(c['bwd_time_s'])} "
            f"| {'yes' if c['pass'] else 'NO: ' + _failed(c['checks'])} |"
        )
    o = s["oom"]
    lines += [
        "",
        f"## Out of memory: {o['case']}",
        "",
        f"Simulated peak {_gib(o['simulated_peak_bytes'])} on a {_gib(o['device_memory_bytes'])} "
        f"device: status **{o['status']}** ({o['note']}); attributed: "
        f"{'yes' if o['pass'] else 'NO'}.",
        "",
    ]
    for block in o.get("live_at_oom", []):
        lines.append(
            f"- {_gib(block['bytes'])} {block['dtype']} {block['shape']} "
            f"op {block['op']} phase {block['phase']}"
        )
    lines += _sharded_lines(s["sharded"]) + _peer_lines(s["peers"]) + _floor_lines(s["hbm_floor"])
    return "\n".join(lines) + "\n"


def _sharded_lines(sh: dict[str, Any]) -> list[str]:
    head = ["", f"## Sharded sweep: {sh['gpus']} GPU(s), {sh['tokens']} tokens", ""]
    if "skipped" in sh:
        return [*head, f"Not run: {sh['skipped']}."]
    if "error" in sh:
        return [*head, "torchrun failed:", "", "```", sh["error"], "```"]
    return [
        *head,
        f"{sh['cases']} cases in {sh['wall_s']} s (the one-process sweep of every case above: "
        f"{sh['one_process_sweep_s']} s); same cases in the same order: "
        f"{sh['same_cases_in_order']}; same statuses and allocated peaks: "
        f"{sh['same_status_and_peak']}.",
    ]


def _peer_lines(peers: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## GPU peers",
        "",
        "| kernel | hidden | tokens | status | peak | floor | fwd s | bwd s "
        "| err fwd | err bwd (random upstream) | err bwd (ones) | note |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in peers:
        lines.append(
            f"| {p['kernel']} | {p['hidden'] or '—'} | {p['tokens']} | {p['status']} "
            f"| {_gib(p['peak_bytes'])} | {_gib(p['floor_bytes'])} | {_secs(p['fwd_time_s'])} "
            f"| {_secs(p['bwd_time_s'])} | {_err(p.get('max_abs_err_fwd_random'))} "
            f"| {_err(p.get('max_abs_err_bwd_random'))} | {_err(p.get('max_abs_err_bwd_ones'))} "
            f"| {p['note']} |"
        )
    return lines


def _floor_lines(floor: dict[str, Any]) -> list[str]:
    bandwidth = floor["copy_bandwidth_bytes_per_s"]
    lines = [
        "",
        "## Logits kernels against the HBM floor",
        "",
        f"Copy bandwidth (device to device, read + write): {bandwidth / 1e9:.0f} GB/s. "
        "Floor: 3 x the logits' bytes (read in forward; read and gradient written in "
        "backward) at that bandwidth.",
        "",
        "| kernel | tokens | bytes moved | floor s | fwd+bwd s | x floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in floor["kernels"]:
        lines.append(
            f"| {r['kernel']} | {r['tokens']} | {_gib(r['bytes_moved'])} | {_secs(r['floor_s'])} "
            f"| {_secs(r['fwd_bwd_s'])} | {r['x_floor']} |"
        )
    return lines


def _err(value: float | None) -> str:
    return "—" if value is None else f"{value:.2e}"


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def _failed(checks: dict[str, bool]) -> str:
    return ", ".join(name for name, ok in checks.items() if not ok)


if __name__ == "__main__":
    sys.exit(main())
