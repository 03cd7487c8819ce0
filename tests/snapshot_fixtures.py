"""Snapshots for the tests, built in code: every variant real files have, plus bad files.

Nothing here is a binary fixture: each builder returns a fresh dict (or bytes), so
tests can mutate what they get. Sizes are real (a 9.77 GiB block is 10485760000 in
the dict) but no tensor is ever allocated.
"""

from __future__ import annotations

import copy
import os
import pickle
from typing import Any

from memprobe.records import Case, Event, Frame
from memprobe.snapshot import format_label, synthesize_snapshot

B, S, V = 1, 20000, 131072
BSV = B * S * V
FP32_BSV = 4 * BSV  # 10485760000 bytes = 9.77 GiB
BF16_BSV = 2 * BSV
HEADLINE = Case("unchunked", B, S, V, dtype="bf16", chunk_size=None, device="meta")

SITE = "/venv/lib/python3.11/site-packages"
KERNEL = "/work/main/memprobe/kernels/autograd_reference.py"
STEP = "/work/main/memprobe/measure/step.py"
TRACED = "/work/main/memprobe/measure/traced.py"
DYNAMO = Frame("_fn", f"{SITE}/torch/_dynamo/eval_frame.py", 1446)
FWD_FRAMES = (
    DYNAMO,
    Frame("inner", f"{SITE}/torch/_compile.py", 54),
    Frame("unchunked_logprobs", KERNEL, 24),
    Frame("call", STEP, 52),
    Frame("traced_step", TRACED, 30),
)
GATHER_FRAMES = tuple(
    Frame(f.name, f.filename, 25) if f.filename == KERNEL else f for f in FWD_FRAMES
)
BWD_FRAMES = (
    DYNAMO,
    Frame("inner", f"{SITE}/torch/_compile.py", 54),
    Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 979),
    Frame("grad", f"{SITE}/torch/autograd/__init__.py", 594),
    Frame("backward", STEP, 70),
    Frame("traced_step", TRACED, 35),
)
SETUP_FRAMES = (Frame("traced_step", TRACED, 19),)


def unchunked_events() -> list[Event]:
    """The tracker's trace of the unchunked headline step (as memprobe.measure records it):
    logits bf16, then five float32 [B,S,V] blocks, two made in forward, three in backward."""
    full, row = (B, S, V), (B, S, 1)
    f32, bf16 = "torch.float32", "torch.bfloat16"
    lsm_bwd = "aten._log_softmax_backward_data.default"
    rows: list[tuple[str, int, int, tuple[int, ...], str, str, str, tuple[Frame, ...]]] = [
        # action, storage, nbytes, shape, dtype, op, phase, frames
        ("alloc", 1, BF16_BSV, full, bf16, "input: logits", "setup", SETUP_FRAMES),
        ("alloc", 2, FP32_BSV, full, f32, "aten._to_copy.default", "forward", FWD_FRAMES),
        ("alloc", 3, FP32_BSV, full, f32, "aten._log_softmax.default", "forward", FWD_FRAMES),
        ("free", 2, FP32_BSV, full, f32, "aten._to_copy.default", "forward", FWD_FRAMES),
        ("alloc", 4, 4 * B * S, row, f32, "aten.gather.default", "forward", GATHER_FRAMES),
        ("alloc", 5, FP32_BSV, full, f32, "aten.new_zeros.default", "backward", BWD_FRAMES),
        ("alloc", 6, FP32_BSV, full, f32, "aten.scatter_add.default", "backward", BWD_FRAMES),
        ("free", 5, FP32_BSV, full, f32, "aten.new_zeros.default", "backward", BWD_FRAMES),
        ("alloc", 7, FP32_BSV, full, f32, lsm_bwd, "backward", BWD_FRAMES),
        ("free", 6, FP32_BSV, full, f32, "aten.scatter_add.default", "backward", BWD_FRAMES),
        ("free", 3, FP32_BSV, full, f32, "aten._log_softmax.default", "backward", FWD_FRAMES),
        ("alloc", 8, BF16_BSV, full, bf16, "aten._to_copy.default", "backward", BWD_FRAMES),
        ("free", 7, FP32_BSV, full, f32, lsm_bwd, "backward", BWD_FRAMES),
        ("free", 4, 4 * B * S, row, f32, "aten.gather.default", "backward", GATHER_FRAMES),
    ]
    return [
        Event(i, 100.0 * i + 0.4, action, storage, nbytes, shape, dtype, op, phase, frames)
        for i, (action, storage, nbytes, shape, dtype, op, phase, frames) in enumerate(rows)
    ]


# logits + log_softmax out + scatter_add grad + log_softmax grad + the gathered [B,S,1]
HEADLINE_PEAK = BF16_BSV + 3 * FP32_BSV + 4 * B * S


def unchunked_snapshot() -> dict[str, Any]:
    """The headline run, synthesized: logits and the bf16 grad stay live at the end."""
    return synthesize_snapshot(unchunked_events(), case=HEADLINE)


def oom_snapshot() -> dict[str, Any]:
    """The headline run failing in backward: the log_softmax grad (9.77 GiB) does not fit.

    As on CUDA: an ``oom`` entry (``device_free``, no ``addr``) where the alloc would
    have been, and the snapshot taken then (nothing after it)."""
    events = unchunked_events()[:8]
    snap = synthesize_snapshot(events, case=HEADLINE)
    trace = snap["device_traces"][0]
    failing = unchunked_events()[8]
    trace.append(
        {
            "action": "oom",
            "device_free": 3 * 2**30,
            "size": failing.nbytes,
            "stream": 0,
            "time_us": trace[-1]["time_us"] + 50,
            "frames": [
                {"name": f.name, "filename": f.filename, "line": f.line} for f in failing.frames
            ],
            "user_metadata": format_label(
                case=HEADLINE.case_id, phase="backward", op=failing.op, dtype=failing.dtype
            ),
        }
    )
    return snap


def _f(name: str, filename: str = "??", line: int = 0) -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": line}


CPP_ALLOC = [
    _f("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)"),
    _f("CUDACachingAllocator.cpp"),
    _f("at::_ops::_log_softmax::call(at::Tensor const&, long, bool)"),
    _f("torch::autograd::THPVariable_log_softmax(_object*, _object*, _object*)"),
]
CPP_BACKWARD = [
    _f("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)"),
    _f("at::_ops::_log_softmax_backward_data::call(...)"),
    _f("torch::autograd::generated::LogSoftmaxBackward0::apply(...)"),
    _f("torch::autograd::Engine::evaluate_function(...)"),
    _f("torch::autograd::Engine::thread_main(...)"),
]
PY_TRAIN = [
    _f("log_softmax", f"{SITE}/torch/nn/functional.py", 2240),
    _f("compute_logprobs", "/home/me/rl/train.py", 41),
    _f("<module>", "/home/me/rl/train.py", 90),
]
WIN_TRAIN = [
    _f("log_softmax", "C:\\Users\\me\\venv\\Lib\\site-packages\\torch\\nn\\functional.py", 2240),
    _f("wrapper", "C:\\Python311\\Lib\\contextlib.py", 81),
    _f("compute_logprobs", "C:\\Users\\me\\rl\\train.py", 41),
]
MiB = 1 << 20
SEG_A = 0x7F0000000000
SEG_B = 0x7F0100000000  # an expandable segment grown with segment_map
SEG_C = 0x7F0200000000  # a small-pool segment returned with empty_cache()


def _e(action: str, addr: int, size: int, t: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": t,
        "frames": frames,
    }


def real_style_snapshot() -> dict[str, Any]:
    """A hand-written snapshot shaped like a caching allocator's: cached segments reused
    across allocations, every one of the nine actions, C++ and Python frames, an
    expandable segment mapped and unmapped, a pending free, and an OOM."""
    lsm = 40 * MiB  # a float32 [1, 80, 131072] log_softmax output
    alloc_stack = CPP_ALLOC + PY_TRAIN
    trace = [
        _e("segment_alloc", SEG_A, 64 * MiB, 10, alloc_stack),
        _e("alloc", SEG_A, lsm, 11, alloc_stack),
        _e("alloc", SEG_A + lsm, 1000, 12, PY_TRAIN[1:]),
        _e("segment_map", SEG_B, 32 * MiB, 13, CPP_BACKWARD),
        _e("alloc", SEG_B, lsm // 2, 14, CPP_BACKWARD),
        _e("free_requested", SEG_A + lsm, 1000, 15, []),
        _e("free_completed", SEG_A + lsm, 1000, 15, []),
        {"action": "oom", "device_free": 5 * MiB, "size": 400 * MiB, "stream": 0,
         "time_us": 16, "frames": CPP_BACKWARD},
        _e("free_requested", SEG_B, lsm // 2, 17, CPP_BACKWARD),
        _e("free_completed", SEG_B, lsm // 2, 18, CPP_BACKWARD),
        _e("segment_unmap", SEG_B, 32 * MiB, 19, []),
        _e("segment_alloc", SEG_C, 2 * MiB, 19, PY_TRAIN),
        _e("alloc", SEG_C, 512, 19, PY_TRAIN),
        _e("free_requested", SEG_C, 512, 19, PY_TRAIN),
        _e("free_completed", SEG_C, 512, 19, PY_TRAIN),
        _e("segment_free", SEG_C, 2 * MiB, 19, []),
        # freed by the program but still in use by another stream at snapshot time
        _e("free_requested", SEG_A, lsm, 20, PY_TRAIN),
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 21},
    ]  # fmt: skip
    blocks = [
        {"address": SEG_A, "size": lsm, "requested_size": lsm,
         "state": "active_pending_free", "frames": alloc_stack},
        {"address": SEG_A + lsm, "size": 64 * MiB - lsm, "requested_size": 0,
         "state": "inactive", "frames": []},
    ]  # fmt: skip
    segments = [
        {
            "device": 0,
            "address": SEG_A,
            "total_size": 64 * MiB,
            "allocated_size": 0,
            "active_size": lsm,
            "requested_size": lsm,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": alloc_stack,
            "blocks": blocks,
        }
    ]
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "external_annotations": [],
    }


def without_time_us(snap: dict[str, Any]) -> dict[str, Any]:
    snap = copy.deepcopy(snap)
    for trace in snap["device_traces"]:
        for e in trace:
            e.pop("time_us", None)
    return snap


def without_settings(snap: dict[str, Any]) -> dict[str, Any]:
    snap = copy.deepcopy(snap)
    snap.pop("allocator_settings", None)
    snap.pop("external_annotations", None)
    return snap


def awaiting_free_spelling(snap: dict[str, Any]) -> dict[str, Any]:
    """Older docs call the pending state ``active_awaiting_free``."""
    snap = copy.deepcopy(snap)
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_pending_free":
                b["state"] = "active_awaiting_free"
    return snap


def _map_frames(snap: dict[str, Any], fn: Any) -> dict[str, Any]:
    snap = copy.deepcopy(snap)
    for trace in snap["device_traces"]:
        for e in trace:
            if "frames" in e:
                e["frames"] = fn(e["frames"])
    for seg in snap["segments"]:
        seg["frames"] = fn(seg.get("frames", []))
        for b in seg["blocks"]:
            b["frames"] = fn(b.get("frames", []))
    return snap


def python_only_frames(snap: dict[str, Any]) -> dict[str, Any]:
    """As recorded with ``stacks="python"``: no C++ frames (backward has none at all)."""
    return _map_frames(snap, lambda fs: [f for f in fs if f["line"] != 0])


def windows_paths(snap: dict[str, Any]) -> dict[str, Any]:
    return _map_frames(snap, lambda fs: [f for f in fs if f["line"] == 0] + WIN_TRAIN if fs else fs)


def empty_trace_snapshot() -> dict[str, Any]:
    """Recorded without history: segments only, an empty trace."""
    snap = real_style_snapshot()
    snap["device_traces"] = [[]]
    return snap


def ring_buffer_snapshot() -> dict[str, Any]:
    """The headline run with the oldest entries dropped by ``max_entries``: the trace
    starts after the logits, the float32 copy and the log_softmax output were made, so
    its first events free blocks it never saw allocated."""
    snap = unchunked_snapshot()
    trace = snap["device_traces"][0]
    # Drop everything up to and including the alloc of the gathered [B,S,1] output.
    gather_alloc = next(
        i for i, e in enumerate(trace) if e["action"] == "alloc" and e["size"] == 4 * B * S
    )
    snap["device_traces"][0] = trace[gather_alloc + 1 :]
    return snap


def legacy_segment_list() -> list[dict[str, Any]]:
    """The oldest format: a bare list of segments, blocks with ``history`` and no address."""
    return [
        {
            "device": 0,
            "address": SEG_A,
            "total_size": 2 * MiB,
            "stream": 0,
            "blocks": [
                {"size": 1 * MiB, "state": "active_allocated",
                 "history": [{"real_size": 1000 * 1000, "frames": PY_TRAIN}]},
                {"size": 1 * MiB, "state": "inactive"},
            ],
        }
    ]  # fmt: skip


class _RunsCode:
    """Pickles to ``os.system(command)``: what a malicious snapshot would contain."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def malicious_pickle(command: str) -> bytes:
    return pickle.dumps({"segments": [], "device_traces": [], "x": _RunsCode(command)}, protocol=4)
