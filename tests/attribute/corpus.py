"""The attribution corpus: small training programs with known truth, as CUDA-format snapshots.

Each program runs on the meta device through memprobe's tracker (nothing is
allocated), and its trace goes through memprobe's model of the caching allocator
(:func:`memprobe.snapshot.synthesize_snapshot`). Then everything memprobe alone
would know is taken away, so the file reads like one a real CUDA run wrote:

- no ``user_metadata`` labels and no ``memprobe`` record (no dtype, shape or op words);
- each allocation's stack is what torch records: the allocator's and the op's C++
  frames (``at::_ops::mm::call``) over the Python frames, with the user's files at
  ``/home/me/…`` and torch's under ``site-packages``;
- backward allocations come from the autograd engine's thread: C++ frames only
  (``…::MmBackward0::apply``, ``Engine::thread_main``, glibc's ``clone3.S``);
- a free carries the stack running when it was freed (torch's ``context='all'``);
- a ring buffer (``cut_before``) drops the trace's oldest entries, leaving blocks
  from before the window (parameters, the previous step's Adam state) live in
  ``segments`` or freed without an alloc.

Autocast has no meta kernel, so the autocast programs do what autocast does by
hand: a ``_to_copy`` of each weight and input to bfloat16 before its matmul, and
the loss on ``logits.float()``.

Each ``Program`` carries its truth (B, S, V, H, the logits' dtype, or no LM head at
all, and categories a reader should see); ``tests/attribute/test_corpus.py``
asserts every reading against it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from memprobe.measure.tracker import AllocationTracker
from memprobe.records import Event, Frame
from memprobe.snapshot import synthesize_snapshot

USER_DIR = "/home/me/proj/"
SITE = "/opt/venv/lib/python3.11/site-packages/"
_MALLOC = Frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", "??", 0)
_ENGINE = (
    Frame("torch::autograd::Engine::evaluate_function(...)", "??", 0),
    Frame("torch::autograd::Engine::thread_main(...)", "??", 0),
    Frame("start_thread", "./nptl/pthread_create.c", 447),
    Frame("__clone3", "../sysdeps/unix/sysv/linux/x86_64/clone3.S", 78),
)
META = torch.device("meta")
BF16 = torch.bfloat16


# -- the programs' models ------------------------------------------------------------------


class Linear(nn.Module):
    """nn.Linear, optionally under (emulated) bf16 autocast: weight and input cast first."""

    def __init__(self, d_in: int, d_out: int, *, bias: bool = True, autocast: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in, device=META))
        self.bias = nn.Parameter(torch.empty(d_out, device=META)) if bias else None
        self.autocast = autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.autocast:
            return F.linear(x, self.weight, self.bias)
        bias = self.bias.to(BF16) if self.bias is not None else None
        return F.linear(x.to(BF16), self.weight.to(BF16), bias)


def rotary_tables(seq: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    positions = torch.arange(seq, device=META)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=META).float() / head_dim))
    freqs = torch.outer(positions.float(), inv_freq)
    return positions, freqs.cos(), freqs.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    return scores.softmax(dim=-1).to(v.dtype) @ v


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, *, autocast: bool = False):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden, device=META)
        self.qkv = Linear(hidden, 3 * hidden, autocast=autocast)
        self.proj = Linear(hidden, hidden, autocast=autocast)
        self.ln2 = nn.LayerNorm(hidden, device=META)
        self.fc = Linear(hidden, 4 * hidden, autocast=autocast)
        self.out = Linear(4 * hidden, hidden, autocast=autocast)

    def forward(self, x, mask=None, rotary=None):  # type: ignore[no-untyped-def]
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        y = attention(q, k, v, mask).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    """A GPT-style LM with rotary embeddings (or learned positions), causal mask, tied-free
    lm_head."""

    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, *,
                 autocast: bool = False, rotary: bool = True):  # fmt: skip
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, device=META)
        self.pos = None if rotary else nn.Embedding(2048, hidden, device=META)
        self.blocks = nn.ModuleList(Block(hidden, heads, autocast=autocast) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden, device=META)
        self.lm_head = Linear(hidden, vocab, bias=False, autocast=autocast)
        self.head_dim = hidden // heads

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        mask = torch.ones(s, s, dtype=torch.bool, device=META).triu(1)
        x = self.embed(ids)
        rotary = None
        if self.pos is None:
            _, cos, sin = rotary_tables(s, self.head_dim)
            rotary = (cos, sin)
        else:
            position_ids = torch.arange(s, device=META).unsqueeze(0).expand(b, s)
            x = x + self.pos(position_ids)
        for block in self.blocks:
            x = block(x, mask, rotary)
        return self.lm_head(self.ln(x))


class Encoder(nn.Module):
    """A BERT-style encoder: bidirectional attention, a classifier on the first token."""

    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, device=META)
        self.pos = nn.Embedding(512, hidden, device=META)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.classifier = Linear(hidden, classes)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        position_ids = torch.arange(s, device=META).unsqueeze(0).expand(b, s)
        x = self.embed(ids) + self.pos(position_ids)
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.encode(ids)[:, 0])


# -- the steps -------------------------------------------------------------------------------


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def gpt_step(model: Gpt, batch: int, seq: int, vocab: int, *, autocast: bool = False):  # type: ignore[no-untyped-def]
    ids = torch.randint(0, vocab, (batch, seq), device=META)
    targets = torch.randint(0, vocab, (batch, seq), device=META)
    logits = model(ids)
    loss = lm_loss(logits.float() if autocast else logits, targets)
    loss.backward()


def hf_step(model: Gpt, batch: int, seq: int, vocab: int) -> None:
    """Hugging Face's causal-LM loss: logits[:, :-1] against labels[:, 1:]."""
    ids = torch.randint(0, vocab, (batch, seq), device=META)
    logits = model(ids)
    shift_logits = logits[:, :-1, :].contiguous()
    shift_labels = ids[:, 1:].contiguous()
    loss = F.cross_entropy(shift_logits.view(-1, vocab), shift_labels.view(-1))
    loss.backward()


# -- tracking, and making the snapshot look like a real one ---------------------------------


class _Tracker(AllocationTracker):
    """The tracker, also noting which autograd node each allocation ran under."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[int, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        before = len(self.events)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        node = torch._C._current_autograd_node()
        if node is not None:
            for ev in self.events[before:]:
                if ev.action == "alloc":
                    self.nodes[ev.index] = type(node).__name__
        return out


def _python_frame(f: Frame) -> Frame | None:
    path = f.filename.replace("\\", "/")
    if "/torch/" in path:
        return Frame(f.name, SITE + "torch/" + path.split("/torch/", 1)[1], f.line)
    if path.endswith("tests/attribute/corpus.py"):
        return Frame(f.name, USER_DIR + "model.py", f.line)
    if "/memprobe/" in path or "/_pytest/" in path or "/pluggy/" in path:
        return None  # the harness that ran the program: not in a user's real stack
    return f


def _op_frame(op: str) -> Frame:
    name = op.split(".")[1] if op.startswith("aten.") else op
    return Frame(f"at::_ops::{name}::call(...)", "??", 0)


def _real_frames(ev: Event, node: str | None) -> tuple[Frame, ...]:
    cpp = (_MALLOC, _op_frame(ev.op))
    if node is not None:  # the autograd engine's thread: no Python frames
        return (*cpp, Frame(f"torch::autograd::generated::{node}::apply(...)", "??", 0), *_ENGINE)
    py = tuple(p for f in ev.frames if (p := _python_frame(f)) is not None)
    return cpp + py


def _realistic(events: list[Event], nodes: dict[int, str]) -> list[Event]:
    """Events with torch-style stacks; a free carries the stack running when it happened
    (the latest allocation's), as ``context='all'`` records."""
    out: list[Event] = []
    current: tuple[Frame, ...] = ()
    for ev in events:
        if ev.action == "alloc":
            current = _real_frames(ev, nodes.get(ev.index))
            out.append(replace(ev, frames=current))
        else:
            out.append(replace(ev, frames=current))
    return out


CUT = "cut"  # the phase name that marks events a ring buffer drops


def track(program: Callable[[_Tracker], Any]) -> tuple[list[Event], dict[int, str]]:
    """Run ``program`` under the tracker. What it returns (its model, its optimizer)
    stays alive until the trace is taken, as a snapshot taken mid-training sees it."""
    tracker = _Tracker()
    with tracker:
        alive = program(tracker)
    events = list(tracker.events)
    del alive
    return events, tracker.nodes


OOM = "oom"  # the phase that marks what a program freed after its failed request


@dataclass(frozen=True)
class Oom:
    """A request the device refused, made where phase ``OOM`` begins (the frees after it
    are the exception unwinding); ``device_free`` is what the driver reported free."""

    requested: int
    device_free: int
    frames: tuple[Frame, ...]


def _oom_entry(oom: Oom, time_us: int) -> dict[str, Any]:
    frames = [{"name": f.name, "filename": f.filename, "line": f.line} for f in oom.frames]
    return {"action": "oom", "size": oom.requested, "device_free": oom.device_free,
            "stream": 0, "time_us": time_us, "frames": frames}  # fmt: skip


def real_snapshot(
    events: list[Event], nodes: dict[int, str], *, device: int = 0, oom: Oom | None = None
) -> dict[str, Any]:
    """A snapshot as a CUDA run records it: no memprobe labels, torch-style stacks, and
    the entries of phase ``CUT`` dropped from the front (a ring buffer's window); with
    ``oom``, torch's ``oom`` entry where phase ``OOM`` begins."""
    snap = synthesize_snapshot(_realistic(events, nodes), device=device)
    trace = snap["device_traces"][device]
    if oom is not None:
        at = next(
            i for i, e in enumerate(trace) if f"phase={OOM} " in e.get("user_metadata", "") + " "
        )
        trace.insert(at, _oom_entry(oom, trace[at - 1]["time_us"]))
    cut = 0
    for i, entry in enumerate(trace):
        if f"phase={CUT} " not in entry.get("user_metadata", "") + " ":
            cut = i
            break
    else:
        cut = len(trace)
    del trace[:cut]
    for entry in trace:
        entry.pop("user_metadata", None)
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            block.pop("user_metadata", None)
    del snap["memprobe"]
    return snap


# -- the corpus ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Truth:
    """What the program really did. ``vocab`` None: no LM head (no logits path)."""

    batch: int | None
    seq: int | None
    vocab: int | None
    hidden: int | None = None
    logits_dtype: str | None = None
    loss_rows: int | None = None  # B·(S−1) for a shifted loss
    categories: frozenset[str] = field(default_factory=frozenset)  # seen at the peak


@dataclass(frozen=True)
class Program:
    name: str
    what: str
    run: Callable[[_Tracker], Any]
    truth: Truth
    oom: Oom | None = None

    def snapshot(self, device: int = 0) -> dict[str, Any]:
        return real_snapshot(*track(self.run), device=device, oom=self.oom)


def _gpt_fp32(t: _Tracker) -> Any:
    torch.manual_seed(0)
    t.set_phase("setup")
    model = Gpt(10000, 256, 4, 2)
    t.set_phase("forward")
    gpt_step(model, 4, 96, 10000)
    return model


def gpt_program(batch: int, seq: int) -> Program:
    """The fp32 LM of ``gpt_rotary_fp32`` at another batch and sequence length."""

    def run(t: _Tracker) -> Any:
        t.set_phase("setup")
        model = Gpt(10000, 256, 4, 2)
        t.set_phase("forward")
        gpt_step(model, batch, seq, 10000)
        return model

    truth = Truth(batch, seq, 10000, 256, "float32")
    return Program(f"gpt_b{batch}_s{seq}", f"the fp32 LM at B={batch}, S={seq}", run, truth)


def _gpt_autocast(t: _Tracker) -> Any:
    t.set_phase("setup")
    model = Gpt(10000, 256, 4, 2, autocast=True)
    t.set_phase("forward")
    gpt_step(model, 4, 96, 10000, autocast=True)
    return model


def _hf_shifted(t: _Tracker) -> Any:
    t.set_phase("setup")
    model = Gpt(8000, 256, 4, 2, rotary=False)
    t.set_phase("forward")
    hf_step(model, 2, 160, 8000)
    return model


def _encoder_classifier(t: _Tracker) -> Any:
    t.set_phase("setup")
    model = Encoder(30522, 256, 4, 2, classes=3)
    t.set_phase("forward")
    ids = torch.randint(0, 30522, (8, 64), device=META)
    labels = torch.randint(0, 3, (8,), device=META)
    F.cross_entropy(model(ids), labels).backward()
    return model


def _cnn(t: _Tracker) -> Any:
    t.set_phase("setup")
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, device=META), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, device=META), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10, device=META),
    )  # fmt: skip
    t.set_phase("forward")
    images = torch.randn(64, 3, 32, 32, device=META)
    labels = torch.randint(0, 10, (64,), device=META)
    F.cross_entropy(net(images), labels).backward()
    return net


def _attention_bench(t: _Tracker) -> Any:
    t.set_phase("forward")
    q, k, v = (torch.randn(2, 8, 512, 64, device=META, requires_grad=True) for _ in range(3))
    for _ in range(2):
        attention(q, k, v, None).sum().backward()
    return q, k, v


def _retrieval(t: _Tracker) -> Any:
    """A dual encoder with in-batch negatives: a [B, B] similarity, softmax over B."""
    t.set_phase("setup")
    model = Encoder(30522, 256, 4, 2, classes=2)
    t.set_phase("forward")
    queries = torch.randint(0, 30522, (512, 16), device=META)
    docs = torch.randint(0, 30522, (512, 16), device=META)
    q = F.normalize(model.encode(queries)[:, 0], dim=-1)
    d = F.normalize(model.encode(docs)[:, 0], dim=-1)
    similarity = q @ d.T / 0.05
    F.cross_entropy(similarity, torch.arange(512, device=META)).backward()
    return model


def _adam_steps(t: _Tracker, *, steps: int, cut_first: bool) -> Any:
    t.set_phase(CUT if cut_first else "setup")
    model = Gpt(10000, 256, 4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    for step in range(steps):
        if step == steps - 1 or not cut_first:
            t.set_phase("forward")
        gpt_step(model, 4, 96, 10000)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def _adam_previous_state(t: _Tracker) -> Any:
    return _adam_steps(t, steps=2, cut_first=True)


def _two_iterations(t: _Tracker) -> Any:
    return _adam_steps(t, steps=2, cut_first=False)


def adam_iterations(steps: int) -> Program:
    """LM + AdamW, ``steps`` whole iterations in one trace (the truth of one)."""
    return Program(
        f"iterations_{steps}",
        f"LM + AdamW, {steps} iterations in one trace",
        lambda t: _adam_steps(t, steps=steps, cut_first=False),
        replace(GPT_TRUTH, categories=frozenset({"optimizer state"})),
    )


def _gpt_oom(t: _Tracker) -> Any:
    """The fp32 LM's forward, then the loss's float32 [N, V] log_softmax is refused: the
    step's activations are freed as the exception unwinds."""
    t.set_phase("setup")
    model = Gpt(10000, 256, 4, 2)
    t.set_phase("forward")
    ids = torch.randint(0, 10000, (4, 96), device=META)
    logits = model(ids)
    t.set_phase(OOM)
    del logits
    return model


GPT_OOM = Oom(
    requested=4 * 96 * 10000 * 4,
    device_free=2 << 20,
    frames=(
        _MALLOC,
        _op_frame("aten._log_softmax"),
        Frame("cross_entropy", SITE + "torch/nn/functional.py", 3104),
        Frame("lm_loss", USER_DIR + "model.py", 174),
        Frame("gpt_step", USER_DIR + "model.py", 181),
    ),
)


def two_devices_oom_on_1() -> dict[str, Any]:
    """A 2-GPU snapshot: device 0 ran the fp32 LM's step; device 1 ran out of memory."""
    ok = BY_NAME["gpt_rotary_fp32"].snapshot()
    failed = BY_NAME["gpt_oom"].snapshot(device=1)
    for seg in failed["segments"]:
        seg["device"] = 1
    return {
        **ok,
        "segments": ok["segments"] + failed["segments"],
        "device_traces": [ok["device_traces"][0], failed["device_traces"][1]],
    }


GPT_TRUTH = Truth(4, 96, 10000, 256, "float32")
PROGRAMS: tuple[Program, ...] = (
    Program("gpt_rotary_fp32", "GPT-style LM, rotary embeddings, float32", _gpt_fp32, GPT_TRUTH),
    Program(
        "gpt_rotary_autocast",
        "the same LM under bf16 autocast (weights cast per matmul, loss on logits.float())",
        _gpt_autocast,
        Truth(4, 96, 10000, 256, "bfloat16", categories=frozenset({"autocast weight copies"})),
    ),
    Program(
        "hf_shifted",
        "HF-style causal LM: learned positions, loss on logits[:, :-1] vs labels[:, 1:]",
        _hf_shifted,
        Truth(2, 160, 8000, 256, "float32", loss_rows=2 * 159),
    ),
    Program(
        "encoder_classifier",
        "BERT-style encoder (vocabulary 30,522) with a 3-class head on the first token",
        _encoder_classifier,
        Truth(None, None, None),
    ),
    Program("cnn", "a small CNN over 32x32 images, 10 classes", _cnn, Truth(None, None, None)),
    Program(
        "attention_bench",
        "attention alone (q, k, v [2, 8, 512, 64]), forward and backward twice",
        _attention_bench,
        Truth(None, None, None, categories=frozenset({"attention scores"})),
    ),
    Program(
        "retrieval",
        "dual encoder, in-batch negatives: softmax over a [512, 512] similarity",
        _retrieval,
        Truth(None, None, None),
    ),
    Program(
        "adam_previous_state",
        "LM + AdamW, the trace starting at step 2 (step 1's Adam state alive before it)",
        _adam_previous_state,
        replace(GPT_TRUTH, categories=frozenset({"optimizer state"})),
    ),
    Program(
        "two_iterations",
        "LM + AdamW, two whole iterations in one trace",
        _two_iterations,
        replace(GPT_TRUTH, categories=frozenset({"optimizer state"})),
    ),
    Program(
        "gpt_oom",
        "the fp32 LM's forward, then its loss's float32 [N, V] request runs out of memory",
        _gpt_oom,
        replace(GPT_TRUTH, categories=frozenset({"forward activations"})),
        oom=GPT_OOM,
    ),
)
BY_NAME = {p.name: p for p in PROGRAMS}


def repeated_training(entries: int) -> tuple[dict[str, Any], int]:
    """The AdamW LM, three iterations traced; the third (steady state: it runs in the
    cache the first two grew, at the same addresses) repeated until the trace holds
    about ``entries`` entries, cut where an iteration ends (so the final segments are
    the state the trace ends in), as a long run's trace reads. Returns the snapshot and
    the entries of one iteration."""

    def program(t: _Tracker) -> Any:
        t.set_phase("setup")
        model = Gpt(10000, 256, 4, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        for step in range(3):
            t.set_phase(f"step{step}")
            gpt_step(model, 4, 96, 10000)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return model, optimizer

    events, nodes = track(program)
    snap = synthesize_snapshot(_realistic(events, nodes))
    trace = snap["device_traces"][0]
    start = next(i for i, e in enumerate(trace) if "phase=step2" in e.get("user_metadata", ""))
    head, period = trace[:start], trace[start:]
    if any(e["action"].startswith("segment") for e in period):
        raise RuntimeError("the third iteration is not steady: it grew the cache")
    out = list(head)
    shift = period[-1]["time_us"] - period[0]["time_us"] + 1
    for k in range(max(1, (entries - len(head)) // len(period))):
        for e in period:  # each entry its own dict and frames list, as a loaded file has
            out.append({**e, "time_us": e["time_us"] + k * shift, "frames": list(e["frames"])})
    for e in out:
        e.pop("user_metadata", None)
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            b.pop("user_metadata", None)
    del snap["memprobe"]
    snap["device_traces"] = [out]
    return snap, len(period)


if __name__ == "__main__":  # print each program's reading: python tests/attribute/corpus.py
    from memprobe.attribute import attribute

    for p in PROGRAMS:
        if len(sys.argv) > 1 and p.name not in sys.argv[1:]:
            continue
        f = attribute(p.snapshot())
        inf = f.inference
        print(f"{p.name}: {inf.shape_text()} H={inf.hidden} {inf.logits_dtype} "
              f"conf={inf.confidence} | truth {p.truth}")  # fmt: skip
        print("   ", dict(f.breakdown))
