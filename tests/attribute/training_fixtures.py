"""Realistic training-step snapshots built in code, one per defect class of issue 12.

Nothing here is a file from someone's run: each builder writes the trace a CUDA
caching allocator would record for a small GPT-like (or CNN) training step, with
the frame styles real files have: C++ + Python frames, C++-only frames from the
autograd thread in backward, Python-only frames, Windows paths, third-party
libraries under site-packages, torch.compile generated code. Sizes are real bytes;
no tensor is ever allocated.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

SITE = "/opt/venv/lib/python3.11/site-packages"
MODEL = "/home/me/gpt/model.py"
TRAIN = "/home/me/gpt/train.py"
GENERATED = "/tmp/torchinductor_me/ab/cabqx3kz.py"
BASE = 0x7F0000000000
MiB = 1 << 20


def _f(name: str, filename: str = "??", line: int = 0) -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": line}


def _cpp(op: str) -> list[dict[str, Any]]:
    return [
        _f("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)"),
        _f(f"at::_ops::{op}::call(...)"),
    ]


def _backward(op: str, node: str) -> list[dict[str, Any]]:
    """What the autograd engine's thread records: C++ frames only."""
    return _cpp(op) + [
        _f(f"torch::autograd::generated::{node}::apply(...)"),
        _f("torch::autograd::Engine::evaluate_function(...)"),
        _f("torch::autograd::Engine::thread_main(...)"),
    ]


TRAIN_STEP = [_f("train_step", TRAIN, 61), _f("main", TRAIN, 90), _f("<module>", TRAIN, 95)]
MODULE_CALL = [_f("_call_impl", f"{SITE}/torch/nn/modules/module.py", 1750)]


def _forward(op: str, line: int, fn: str | None = None, py_fn: str | None = None,
             extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    torch_py = [_f(py_fn, f"{SITE}/torch/nn/functional.py", 2200)] if py_fn else []
    return (
        _cpp(op) + torch_py + (extra or []) + [_f(fn or "forward", MODEL, line)]
        + MODULE_CALL + [_f("forward", MODEL, 80)] + MODULE_CALL + TRAIN_STEP
    )  # fmt: skip


@dataclass
class Trace:
    """A bump allocator that records entries the way torch does."""

    device: int = 0
    entries: list[dict[str, Any]] = field(default_factory=list)
    live: dict[int, dict[str, Any]] = field(default_factory=dict)  # addr -> block
    next_addr: int = BASE
    t: int = 1_000_000

    def alloc(self, size: int, frames: list[dict[str, Any]]) -> int:
        addr = self.next_addr
        self.next_addr += -(-max(size, 1) // 512) * 512 + 512 * 1024
        self.t += 7
        self.entries.append(
            {"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": self.t,
             "frames": frames}
        )  # fmt: skip
        self.live[addr] = {"size": size, "frames": frames}
        return addr

    def free(self, addr: int) -> None:
        block = self.live.pop(addr)
        self.t += 3
        for action in ("free_requested", "free_completed"):
            self.entries.append(
                {"action": action, "addr": addr, "size": block["size"], "stream": 0,
                 "time_us": self.t, "frames": block["frames"]}
            )  # fmt: skip

    def before_trace(self, size: int, frames: list[dict[str, Any]] | None = None) -> int:
        """A block allocated before recording began: only the segments know it."""
        addr = self.next_addr
        self.next_addr += -(-size // 512) * 512 + 512 * 1024
        self.live[addr] = {"size": size, "frames": frames or []}
        return addr

    def segments(self) -> list[dict[str, Any]]:
        out = []
        for addr, b in sorted(self.live.items()):
            rounded = -(-max(b["size"], 1) // 512) * 512
            out.append(
                {"device": self.device, "address": addr, "total_size": rounded,
                 "allocated_size": rounded, "active_size": rounded,
                 "requested_size": b["size"], "stream": 0, "segment_type": "large",
                 "segment_pool_id": (0, 0), "is_expandable": False, "frames": b["frames"],
                 "blocks": [{"address": addr, "size": rounded, "requested_size": b["size"],
                             "state": "active_allocated", "frames": b["frames"]}]}
            )  # fmt: skip
        return out


@dataclass(frozen=True)
class Gpt:
    batch: int = 4
    seq: int = 512
    vocab: int = 10000
    hidden: int = 768
    heads: int = 12
    layers: int = 2
    extra_params: int = 0  # more parameter blocks alive before the trace (a big model)
    extra_param_bytes: int = 100 * MiB

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def gpt_training_step(cfg: Gpt = Gpt(), trace: Trace | None = None) -> Trace:
    """One step: forward (embedding, attention, MLP, lm_head, cross_entropy), backward
    (C++-only frames), Adam's first step (state made under torch/optim)."""
    tr = trace or Trace()
    n, v, h, f32 = cfg.tokens, cfg.vocab, cfg.hidden, 4
    weights = [v * h, v * h] + [3 * h * h, h * h, 4 * h * h, 4 * h * h] * cfg.layers
    params = [tr.before_trace(w * f32) for w in weights]
    params += [tr.before_trace(cfg.extra_param_bytes) for _ in range(cfg.extra_params)]
    data = [_f("get_batch", TRAIN, 30)] + TRAIN_STEP
    tokens_in = tr.alloc(8 * n, _cpp("to") + data)  # int64 [B, S] token ids
    targets = tr.alloc(8 * n, _cpp("to") + data)  # int64 [B, S] targets
    pos = tr.alloc(8 * cfg.seq, _forward("arange", 70, py_fn=None))  # int64 [S]
    mask = tr.alloc(cfg.seq * cfg.seq, _forward("tril", 71))  # bool [S, S]
    saved: list[int] = [tr.alloc(n * h * f32, _forward("embedding", 72, py_fn="embedding"))]
    att = n // cfg.seq * cfg.heads * cfg.seq * cfg.seq * f32
    attn = [_f("attention", MODEL, 40)]
    for _ in range(cfg.layers):
        saved.append(tr.alloc(4 * n, _forward("native_layer_norm", 30, py_fn="layer_norm")))
        saved.append(tr.alloc(n * h * f32, _forward("native_layer_norm", 30, py_fn="layer_norm")))
        saved.append(tr.alloc(3 * n * h * f32, _forward("mm", 41, py_fn="linear", extra=attn)))
        saved.append(tr.alloc(att, _forward("bmm", 43, fn="attention")))
        saved.append(tr.alloc(att, _forward("_softmax", 44, fn="attention", py_fn="softmax")))
        saved.append(tr.alloc(n * h * f32, _forward("bmm", 45, fn="attention")))
        saved.append(tr.alloc(4 * n * h * f32, _forward("mm", 50, py_fn="linear")))
        saved.append(tr.alloc(4 * n * h * f32, _forward("gelu", 51, py_fn="gelu")))
        saved.append(tr.alloc(n * h * f32, _forward("mm", 52, py_fn="linear")))
    logits = tr.alloc(n * v * f32, _forward("mm", 39, py_fn="linear"))
    loss_frames = _cpp("_log_softmax") + [
        _f("cross_entropy", f"{SITE}/torch/nn/functional.py", 3104), _f("train_step", TRAIN, 63),
        _f("main", TRAIN, 90),
    ]  # fmt: skip
    lsm = tr.alloc(n * v * f32, loss_frames)
    loss = tr.alloc(4, _cpp("nll_loss_forward") + loss_frames[2:])
    # backward: the autograd engine's thread
    nll_grad = tr.alloc(n * v * f32, _backward("zeros", "NllLossBackward0"))
    lsm_grad = tr.alloc(n * v * f32, _backward("_log_softmax_backward_data", "LogSoftmaxBackward0"))
    tr.free(nll_grad)
    tr.free(lsm)
    grads = [tr.alloc(v * h * f32, _backward("mm", "MmBackward0"))]  # lm_head weight grad
    hidden_grad = tr.alloc(n * h * f32, _backward("mm", "MmBackward0"))
    tr.free(lsm_grad)
    tr.free(logits)
    for w in weights[2:]:
        tmp = tr.alloc(4 * n * h * f32, _backward("gelu_backward", "GeluBackward0"))
        grads.append(tr.alloc(w * f32, _backward("mm", "MmBackward0")))
        tr.free(tmp)
    grads.append(tr.alloc(v * h * f32, _backward("embedding_dense_backward", "EmbeddingBackward0")))
    tr.free(hidden_grad)
    for b in saved:
        tr.free(b)
    for b in (tokens_in, pos, mask, loss, targets):
        tr.free(b)
    # Adam's first step: exp_avg and exp_avg_sq for every parameter, plus temporaries.
    adam = [_f("_single_tensor_adam", f"{SITE}/torch/optim/adam.py", 390),
            _f("adam", f"{SITE}/torch/optim/adam.py", 900),
            _f("step", f"{SITE}/torch/optim/adam.py", 240),
            _f("wrapper", f"{SITE}/torch/optim/optimizer.py", 493)] + TRAIN_STEP  # fmt: skip
    for w in weights:
        tr.alloc(w * f32, _cpp("zeros_like") + adam)
        tr.alloc(w * f32, _cpp("zeros_like") + adam)
        tmp = tr.alloc(w * f32, _cpp("sqrt") + adam)
        tr.free(tmp)
    del params
    return tr


def snapshot_of(*traces: Trace, settings: bool = True) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "segments": [s for tr in traces for s in tr.segments()],
        "device_traces": [tr.entries for tr in traces],
    }
    if settings:
        snap["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}
    return snap


def gpt_snapshot(cfg: Gpt = Gpt()) -> dict[str, Any]:
    return snapshot_of(gpt_training_step(cfg))


def ring_buffer(snap: dict[str, Any], dropped: int) -> dict[str, Any]:
    """``max_entries`` kept only the newest entries: the oldest ``dropped`` are gone."""
    snap = copy.deepcopy(snap)
    snap["device_traces"][0] = snap["device_traces"][0][dropped:]
    return snap


def _map_frames(snap: dict[str, Any], fn: Any) -> dict[str, Any]:
    snap = copy.deepcopy(snap)
    for trace in snap["device_traces"]:
        for e in trace:
            e["frames"] = fn(e.get("frames", []))
    for seg in snap["segments"]:
        seg["frames"] = fn(seg.get("frames", []))
        for b in seg["blocks"]:
            b["frames"] = fn(b.get("frames", []))
    return snap


def through_libraries(snap: dict[str, Any]) -> dict[str, Any]:
    """The model runs under accelerate's hooks and calls einops: library frames sit
    between torch and the user's model.py."""

    def fn(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for f in frames:
            if f["filename"] == MODEL and f["line"] == 39:  # the lm_head goes through einops
                out += [_f("einsum", f"{SITE}/einops/_backends.py", 288),
                        _f("einsum", f"{SITE}/einops/einops.py", 907)]  # fmt: skip
            if f["filename"] == MODEL and f["line"] == 80:
                out.append(_f("new_forward", f"{SITE}/accelerate/hooks.py", 170))
            out.append(f)
        return out

    return _map_frames(snap, fn)


def compiled(snap: dict[str, Any]) -> dict[str, Any]:
    """A torch.compile'd forward: allocations come from inductor's generated module."""

    def fn(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not any(f["filename"] == MODEL for f in frames):
            return frames
        cpp = [f for f in frames if f["line"] == 0][:2]
        outer = [f for f in frames if f["filename"] in (MODEL, TRAIN)]
        gen = [_f("call", GENERATED, 412),
               _f("run", f"{SITE}/torch/_inductor/output_code.py", 460),
               _f("_fn", f"{SITE}/torch/_dynamo/eval_frame.py", 655)]  # fmt: skip
        return cpp + gen + outer

    return _map_frames(snap, fn)


def without_time(snap: dict[str, Any]) -> dict[str, Any]:
    """Legacy files: no ``time_us``, no ``allocator_settings``."""
    snap = copy.deepcopy(snap)
    snap.pop("allocator_settings", None)
    for trace in snap["device_traces"]:
        for e in trace:
            e.pop("time_us", None)
    return snap


def windows_python_only(snap: dict[str, Any]) -> dict[str, Any]:
    """Recorded with stacks="python" on Windows: no C++ frames (so backward has none)."""

    def win(path: str) -> str:
        return (
            path.replace(SITE, "C:\\Users\\me\\venv\\Lib\\site-packages")
            .replace("/home/me/gpt", "C:\\Users\\me\\gpt")
            .replace("/", "\\")
        )

    return _map_frames(
        snap, lambda fs: [{**f, "filename": win(f["filename"])} for f in fs if f["line"] != 0]
    )


def cnn_snapshot() -> dict[str, Any]:
    """A CNN classifier step: conv activations and a cross_entropy over 10 classes."""
    tr = Trace()
    batch, classes = 64, 10
    for w in (64 * 3 * 9, 128 * 64 * 9, 256 * 128 * 9, classes * 256):
        tr.before_trace(4 * w)
    images = tr.alloc(4 * batch * 3 * 224 * 224, _cpp("to") + TRAIN_STEP)
    acts = [tr.alloc(4 * batch * c * s * s, _forward("cudnn_convolution", 20, py_fn="conv2d"))
            for c, s in ((64, 112), (128, 56), (256, 28))]  # fmt: skip
    logits = tr.alloc(4 * batch * classes, _forward("addmm", 30, py_fn="linear"))
    loss_frames = _cpp("_log_softmax") + [
        _f("cross_entropy", f"{SITE}/torch/nn/functional.py", 3104)] + TRAIN_STEP  # fmt: skip
    lsm = tr.alloc(4 * batch * classes, loss_frames)
    grad = tr.alloc(
        4 * batch * 128 * 56 * 56, _backward("convolution_backward", "ConvolutionBackward0")
    )
    for b in (*acts, logits, lsm, grad, images):
        tr.free(b)
    return snapshot_of(tr)


def two_devices_oom_on_1() -> dict[str, Any]:
    """A 2-GPU job: device 0 ran its step; device 1 failed a request that would have
    fit in its reserved-but-free memory, but in no single free block (fragmentation)."""
    cfg = Gpt(layers=1)
    dev0 = gpt_training_step(cfg)
    dev1 = Trace(device=1, next_addr=BASE + (1 << 40))
    seg = 1024 * MiB
    blocks: list[dict[str, Any]] = []
    for _ in range(2):  # two 1 GiB segments, each half used, half free
        addr = dev1.next_addr
        dev1.next_addr += seg
        dev1.entries.append({"action": "segment_alloc", "addr": addr, "size": seg, "stream": 0,
                             "time_us": dev1.t, "frames": []})  # fmt: skip
        dev1.next_addr = addr
        live = dev1.alloc(seg // 2, _forward("mm", 50, py_fn="linear"))
        blocks.append({"seg": addr, "live": live})
        dev1.next_addr = addr + seg
    request = 600 * MiB
    oom_frames = _forward("mm", 52, py_fn="linear")
    dev1.entries.append({"action": "oom", "device_free": 64 * MiB, "size": request, "stream": 0,
                         "time_us": dev1.t + 5, "frames": oom_frames})  # fmt: skip
    snap = snapshot_of(dev0, dev1)
    snap["segments"] = [s for s in snap["segments"] if s["device"] == 0]
    for b in blocks:
        frames = dev1.live[b["live"]]["frames"]
        snap["segments"].append(
            {"device": 1, "address": b["seg"], "total_size": seg, "allocated_size": seg // 2,
             "active_size": seg // 2, "requested_size": seg // 2, "stream": 0,
             "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
             "frames": frames,
             "blocks": [{"address": b["seg"], "size": seg // 2, "requested_size": seg // 2,
                         "state": "active_allocated", "frames": frames},
                        {"address": b["seg"] + seg // 2, "size": seg // 2, "requested_size": 0,
                         "state": "inactive", "frames": []}]}
        )  # fmt: skip
    return snap


HF = f"{SITE}/transformers/models/llama/modeling_llama.py"
NOTEBOOK = "/home/me/ipykernel_123/3105878423.py"


def hf_shifted_step(batch: int = 1, seq: int = 1000, vocab: int = 32000, hidden: int = 768,
                    layers: int = 8) -> dict[str, Any]:  # fmt: skip
    """A Hugging Face causal-LM step: the loss runs on logits[:, :-1] against labels[:, 1:],
    so its blocks are [B·(S−1), V] while activations and the lm_head output are [B·S, ·];
    the shifted slice is made contiguous first. float32 weights, as a notebook's."""
    tr = Trace()
    n, loss_n, v, h, f32 = batch * seq, batch * (seq - 1), vocab, hidden, 4
    for w in [v * h, v * h] + [4 * h * h, 3 * h * h, 3 * h * h, 3 * h * h] * layers:
        tr.before_trace(w * f32)
    cell = [_f("<module>", NOTEBOOK, 21)]
    model = [_f("forward", HF, 1180), _f("new_forward", f"{SITE}/accelerate/hooks.py", 170),
             _f("forward", f"{SITE}/peft/peft_model.py", 1430)] + cell  # fmt: skip
    ids = tr.alloc(8 * n, _cpp("to") + cell)  # input_ids [B, S]
    labels = tr.alloc(8 * n, _cpp("to") + cell)  # labels [B, S]
    saved = []
    for _ in range(layers):
        for width in (1, 1, 3, 1, 3, 3):
            saved.append(tr.alloc(width * n * h * f32, _cpp("mm") + model))
    logits = tr.alloc(n * v * f32, _cpp("mm") + model)  # lm_head: [B, S, V]
    shifted = tr.alloc(loss_n * v * f32, _cpp("clone") + model)  # logits[:, :-1].contiguous()
    lsm = tr.alloc(loss_n * v * f32, _cpp("_log_softmax") + [
        _f("cross_entropy", f"{SITE}/torch/nn/functional.py", 3104)] + model)  # fmt: skip
    nll = tr.alloc(loss_n * v * f32, _backward("nll_loss_backward", "NllLossBackward0"))
    lsm_grad = tr.alloc(loss_n * v * f32, _backward("_log_softmax_backward_data",
                                                    "LogSoftmaxBackward0"))  # fmt: skip
    tr.free(nll)
    tr.free(lsm)
    tr.free(shifted)
    full_grad = tr.alloc(n * v * f32, _backward("empty_memory_format", "SliceBackward0"))
    tr.free(lsm_grad)
    tr.free(full_grad)
    for b in (*saved, logits, ids, labels):
        tr.free(b)
    return snapshot_of(tr)


def forward_only(cfg: Gpt = Gpt(layers=16), lm_head_op: str = "bmm") -> dict[str, Any]:
    """A benchmark's forward pass under no_grad: no loss, the lm_head through einops.
    Sixteen layers, as a real model has: each per-layer weight size has 16+ blocks."""
    tr = Trace()
    n, v, h, f32 = cfg.tokens, cfg.vocab, cfg.hidden, 4
    weights = [v * h, v * h] + [3 * h * h, h * h, 4 * h * h, 4 * h * h] * cfg.layers
    for w in weights:
        tr.before_trace(w * f32)
    ids = tr.alloc(8 * n, _cpp("to") + TRAIN_STEP)
    einsum = [_f("einsum", f"{SITE}/einops/_backends.py", 288),
              _f("einsum", f"{SITE}/einops/einops.py", 907)]  # fmt: skip
    x = tr.alloc(n * h * f32, _forward("embedding", 72, py_fn="embedding"))
    for _ in range(cfg.layers):
        for width, op, line in ((3, "bmm", 41), (1, "bmm", 45), (4, "bmm", 50), (4, "gelu", 51),
                                (1, "bmm", 52)):  # fmt: skip
            b = tr.alloc(width * n * h * f32, _forward(op, line, extra=einsum))
            tr.free(b)
    logits = tr.alloc(n * v * f32, _forward(lm_head_op, 39, extra=einsum))
    for b in (x, logits, ids):
        tr.free(b)
    return snapshot_of(tr)


def vocab_parallel_step(ranks: int = 2, cfg: Gpt = Gpt()) -> dict[str, Any]:
    """One rank of a tensor-parallel job: the lm_head and loss hold V/ranks columns, and
    the vocab-parallel cross entropy all_reduces across ranks (Megatron-style frames)."""
    local = Gpt(cfg.batch, cfg.seq, cfg.vocab // ranks, cfg.hidden, cfg.heads, cfg.layers)
    snap = gpt_snapshot(local)
    parallel = [_f("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2500),
                _f("forward", f"{SITE}/megatron/core/tensor_parallel/cross_entropy.py", 40),
                _f("vocab_parallel_cross_entropy",
                   f"{SITE}/megatron/core/tensor_parallel/cross_entropy.py", 230)]  # fmt: skip

    def fn(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if any(f["name"] == "cross_entropy" for f in frames):
            return [f for f in frames if f["line"] == 0] + parallel + [
                f for f in frames if f["filename"] == TRAIN]  # fmt: skip
        return frames

    return _map_frames(snap, fn)
