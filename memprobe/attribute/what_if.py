"""What-if: the same step with another logprob kernel, predicted from a recorded snapshot.

In a snapshot whose loss step materializes ``[N, V]`` blocks, the step is cut out of
the trace (from the logits' consumer in forward to the logits' gradient in backward),
KERNEL runs on meta at the inferred shape and dtype, and its blocks are spliced in
where the cut ones were; everything else stays as recorded. The spliced trace is then
read as any snapshot is: its peak allocated bytes (exact for the splice), what is
live there, and the reserved bytes memprobe's model of the caching allocator gives it.

The splice keeps the step's own bookkeeping. KERNEL is simulated inside a stand-in
loss whose backward hands it an engine-owned gradient, as a real loss does, so:

- blocks the recorded step freed inside the cut (the gradient of the kernel's output)
  are freed where KERNEL's backward lets go of its incoming gradient;
- the kernel's output, freed by the user's code after the cut, is freed where the
  recorded output was; the logits' gradient, where the recorded one was.

Where the step cannot be cut cleanly (no loss found, a fused loss, several loss
steps, a trace that ends inside the step, a shape inferred with low confidence)
:class:`memprobe.errors.UserError` says so: a guess is never shown as a prediction.
torch is imported only when KERNEL is simulated.
"""

from __future__ import annotations

import bisect
import copy
from dataclasses import dataclass, replace
from typing import Any

from memprobe.allocator import replay_snapshot
from memprobe.allocator.snapshot_format import (
    ALLOC,
    BLOCK_ACTIONS,
    FREE_COMPLETED,
    FREE_REQUESTED,
    FREES,
    INACTIVE,
)
from memprobe.attribute.findings import Findings, attribute
from memprobe.attribute.ops import is_matmul, is_opaque_generated
from memprobe.attribute.sites import SiteCache, resolve_phases
from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes
from memprobe.records import Event, normalize_dtype
from memprobe.snapshot.labels import format_label
from memprobe.snapshot.load import normalize_snapshot
from memprobe.snapshot.replay import BEFORE_TRACE, Replay, ReplayBlock, replay
from memprobe.snapshot.synthesize import frames_to_dicts

# Spliced blocks get addresses far above any device's, so they never collide.
SPLICE_ADDRESS = 1 << 60
_CONFIDENT = ("given", "high", "medium")
# Phases of the kernel's simulation (the tracker's labels).
_KERNEL_FORWARD, _LOSS, _KERNEL_BACKWARD, _AFTER = "kf", "loss", "kb", "after"


@dataclass(frozen=True)
class LossStep:
    """Where a snapshot's loss step lies in its trace (positions into its entries)."""

    forward: tuple[int, int]  # first and last alloc of the step's forward
    backward: tuple[int, int]  # first alloc of its backward, and the logits' gradient
    logits: ReplayBlock  # the lm_head's output the step consumes
    gradient: ReplayBlock
    cut: tuple[ReplayBlock, ...]  # every block allocated in either window
    batch: int
    rows: int  # tokens per sequence the loss covers (S, or S − 1 for a shifted loss)
    vocab: int
    dtype: str  # memprobe's dtype name of the logits ("bf16")
    torch_dtype: str  # as attribution names it ("bfloat16")

    def inside(self, pos: int) -> bool:
        (a, b), (c, d) = self.forward, self.backward
        return a <= pos <= b or c <= pos <= d


@dataclass(frozen=True)
class WhatIf:
    """The prediction: the recorded step beside the same step with ``kernel``."""

    kernel: str
    shape: tuple[int, int, int]  # B, S, V of the logits the kernel was simulated at
    dtype: str
    chunk_size: int | None
    forward_entries: tuple[int, int]
    backward_entries: tuple[int, int]
    cut_blocks: int
    recorded_peak_bytes: int
    predicted_peak_bytes: int
    recorded_reserved_peak_bytes: int | None
    model_reserved_peak_bytes: int  # the allocator model on the recorded trace
    predicted_reserved_peak_bytes: int
    predicted: Findings  # the spliced trace, attributed: the new peak's place and makeup
    capacity_bytes: int | None
    capacity_source: str | None

    @property
    def saved_bytes(self) -> int:
        return self.recorded_peak_bytes - self.predicted_peak_bytes

    @property
    def fits(self) -> bool | None:
        """Whether the predicted reserved peak fits the capacity (None: none known)."""
        if self.capacity_bytes is None:
            return None
        return self.predicted_reserved_peak_bytes <= self.capacity_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "chunk_size": self.chunk_size,
            "recorded_peak_bytes": self.recorded_peak_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "recorded_reserved_peak_bytes": self.recorded_reserved_peak_bytes,
            "model_reserved_peak_bytes": self.model_reserved_peak_bytes,
            "predicted_reserved_peak_bytes": self.predicted_reserved_peak_bytes,
            "saved_bytes": self.saved_bytes,
            "fits": self.fits,
            "capacity_bytes": self.capacity_bytes,
            "capacity_source": self.capacity_source,
            "predicted_peak_index": self.predicted.peak_index,
            "predicted_peak_phase": self.predicted.peak_phase,
            "predicted_peak_op": self.predicted.peak_op,
            "predicted_breakdown": [list(b) for b in self.predicted.breakdown],
            "forward_entries": list(self.forward_entries),
            "backward_entries": list(self.backward_entries),
            "cut_blocks": self.cut_blocks,
        }

    def lines(self) -> list[str]:
        b, s, v = self.shape
        chunk = f", chunk {self.chunk_size}" if self.chunk_size else ""
        (fa, fb), (ba, bb) = self.forward_entries, self.backward_entries
        p = self.predicted
        where = f"at entry #{p.peak_index}" if p.peak_index is not None else "at snapshot time"
        if p.peak_phase:
            where += f" during {p.peak_phase}"
        if p.peak_op:
            where += f" (op {p.peak_op})"
        total = self.predicted_peak_bytes or 1
        made = ", ".join(f"{format_bytes(n)} {c} ({100 * n / total:.0f}%)" for c, n in p.breakdown)
        recorded_reserved = (
            format_bytes(self.recorded_reserved_peak_bytes)
            if self.recorded_reserved_peak_bytes is not None
            else "not recorded"
        )
        out = [
            f"what-if {self.kernel}: the loss step (forward entries #{fa}-#{fb}, backward "
            f"#{ba}-#{bb}: {self.cut_blocks} blocks) replaced by {self.kernel} at "
            f"[B={b:,}, S={s:,}, V={v:,}] {self.dtype}{chunk}, simulated on meta",
            f"  peak allocated: {format_bytes(self.recorded_peak_bytes)} recorded -> "
            f"{format_bytes(self.predicted_peak_bytes)} predicted "
            f"({_saving(self.saved_bytes)}), {where}",
            f"  made of: {made}",
            f"  peak reserved:  {recorded_reserved} recorded -> "
            f"{format_bytes(self.predicted_reserved_peak_bytes)} predicted by memprobe's "
            "caching-allocator model (which gives "
            f"{format_bytes(self.model_reserved_peak_bytes)} on the recorded trace)",
        ]
        verdict = f"  with {self.kernel}: {format_bytes(self.predicted_peak_bytes)} allocated, "
        verdict += f"{format_bytes(self.predicted_reserved_peak_bytes)} reserved"
        if self.capacity_bytes is None:
            verdict += "; no device capacity recorded (give --budget to say whether it fits)"
        else:
            word = "fits" if self.fits else "does not fit"
            verdict += f": {word} {format_bytes(self.capacity_bytes)} ({self.capacity_source})"
        return [*out, verdict]


def _saving(saved: int) -> str:
    if saved >= 0:
        return f"saves {format_bytes(saved)}"
    return f"costs {format_bytes(-saved)} more"


# ---------------------------------------------------------------------------- the cut


def find_loss_step(
    snap: dict[str, Any],
    found: Findings,
    rep: Replay,
) -> LossStep:
    """Where the loss step is, or a UserError saying why it cannot be cut cleanly."""
    shapes = found.inference
    if found.source != "trace":
        raise UserError(
            "the snapshot has no trace: the loss step cannot be found in it",
            "record it with torch.cuda.memory._record_memory_history() (or memprobe profile)",
        )
    if not shapes.logits_path or not shapes.known:
        raise UserError(
            "no loss over [N, V] logits found in the snapshot: nothing to replace",
            "--what-if needs a step whose loss materializes the logits",
        )
    if shapes.shards or shapes.per_rank:
        raise UserError(
            "the logits look vocabulary-parallel (a shard per rank): --what-if swaps a "
            "single-device loss",
            "profile the step with one rank's whole vocabulary",
        )
    if shapes.loss_tokens:
        raise UserError(
            f"the loss runs on shifted logits {shapes.shape_text()}: --what-if does not "
            "splice a shifted loss yet",
            "profile the step with the loss on the whole [B, S, V] logits",
        )
    if shapes.forward_only:
        if found.peak_phase in ("backward", "optimizer") or any(
            f.phase in ("backward", "optimizer") for f in found.findings
        ):
            raise UserError(
                "the trace holds the lm_head's output and a backward, but no loss over "
                "[N, V] blocks (a chunked or fused loss): nothing materialized to replace",
                "--what-if replaces a loss that makes [N, V] blocks; this step's does not",
            )
        raise UserError(
            "the trace holds the lm_head's output but no loss over it (a forward-only trace)",
            "record a training step: forward, loss and backward",
        )
    if shapes.confidence not in _CONFIDENT:
        raise UserError(
            f"the step's shape {shapes.shape_text()} is inferred with {shapes.confidence} "
            "confidence: too little to simulate a kernel at",
            "give it with --vocab, --tokens and --batch",
        )
    family = [f for f in found.logits_family if f.alloc_index is not None]
    heads = [
        f
        for f in family
        if f.phase in ("forward", "setup")
        and (is_matmul(f.op, f.node) or is_opaque_generated(f.op, f.via) or f.op == "input: logits")
    ]
    head_ids = {id(f) for f in heads}
    step_fwd = sorted(
        f.alloc_index
        for f in family
        if f.alloc_index is not None and f.phase == "forward" and id(f) not in head_ids
    )
    step_bwd = sorted(
        f.alloc_index for f in family if f.alloc_index is not None and f.phase == "backward"
    )
    if not step_fwd or not step_bwd:
        raise UserError(
            "no loss step with [N, V] blocks in both forward and backward found (a fused "
            "loss, or one the trace only partly holds)",
            "--what-if cuts a loss that materializes the logits and their gradient",
        )
    if len(heads) > 1 or step_fwd[-1] > step_bwd[0]:
        raise UserError(
            f"the trace holds several loss steps ({max(len(heads), 2)} candidates): "
            "--what-if cuts exactly one",
            "record a single training step (memprobe profile, or a shorter history)",
        )
    sites = SiteCache()
    phases = resolve_phases(rep.entries, sites)
    entries = rep.entries
    allocs = [i for i, e in enumerate(entries) if e["action"] == ALLOC]
    fs, fe = step_fwd[0], step_fwd[-1]
    # The step's small blocks after its last [N, V] one (the gathered log-probs, the
    # loss's per-row statistics) still belong to it while their stacks say "loss".
    k = bisect.bisect_right(allocs, fe)
    while k < len(allocs) and phases.phase(allocs[k]) == "forward":
        if sites.site(entries[allocs[k]]).loss is None:
            break
        fe = allocs[k]
        k += 1
    bs, be = step_bwd[0], step_bwd[-1]
    by_pos = {b.alloc_pos: b for b in rep.blocks if b.alloc_pos != BEFORE_TRACE}
    gradient = by_pos[be]
    oom = next((m.pos for m in rep.ooms if m.pos > bs), None)
    if oom is not None and (gradient.free_pos is None or gradient.free_pos > oom):
        raise UserError(
            f"the trace ends at an OOM (entry #{oom}) inside the loss step's backward: the "
            "rest of the step was never recorded, so it cannot be cut out",
            "profile the step at a size that completes (e.g. memprobe profile on meta)",
        )
    before = [
        b for b in rep.blocks if b.alloc_pos < fs and b.size == gradient.size and b.live_at(fs)
    ]
    if not before:
        raise UserError(
            "the loss step's last backward block is not the size of any logits alive "
            "when the loss began: the logits' gradient cannot be told (a fused loss?)",
            "--what-if cuts a loss that materializes the logits and their gradient",
        )
    logits = max(before, key=lambda b: b.alloc_pos)
    cut = tuple(
        b
        for b in rep.blocks
        if b.alloc_pos != BEFORE_TRACE and (fs <= b.alloc_pos <= fe or bs <= b.alloc_pos <= be)
    )
    rows, v = shapes.tokens or 0, shapes.vocab or 0
    itemsize = gradient.size // (rows * v) if rows * v else 0
    label_dtype = sites.site(logits.alloc_entry).label_dtype if logits.alloc_entry else None
    torch_name = label_dtype or {4: "float32", 2: "bfloat16"}.get(itemsize)
    dtype = normalize_dtype(torch_name) if torch_name else None
    if dtype is None or gradient.size != rows * v * itemsize:
        raise UserError(
            f"the logits' gradient ({format_bytes(gradient.size)}) is not [N, V] of "
            f"{shapes.shape_text()} in a 16- or 32-bit dtype",
            "give the shape with --vocab, --tokens and --batch",
        )
    batch = shapes.batch if shapes.batch and rows % shapes.batch == 0 else 1
    return LossStep(
        forward=(fs, fe),
        backward=(bs, be),
        logits=logits,
        gradient=gradient,
        cut=cut,
        batch=batch,
        rows=rows // batch,
        vocab=v,
        dtype=dtype,
        torch_dtype=torch_name or dtype,
    )


# --------------------------------------------------------------- the kernel, simulated


@dataclass(frozen=True)
class KernelTrace:
    """The kernel's own events in a stand-in step, split where the splice needs them."""

    forward: tuple[Event, ...]  # allocs and frees of its blocks during its forward
    backward: tuple[Event, ...]  # ... during its backward
    release_at: int  # where in ``backward`` it let go of its incoming gradient
    forward_escapes: tuple[Event, ...]  # its forward blocks alive after the step (outputs)
    backward_escapes: tuple[Event, ...]  # its backward blocks alive after (the gradient)
    # Where it let go of the logits (when nothing else held them): ("forward", i) or
    # ("backward", i), before event i of that list; ("after", 0): with its gradient.
    logits_release: tuple[str, int] = ("after", 0)


def simulate_kernel(kernel: str, step: LossStep, chunk_size: int | None) -> KernelTrace:
    """Run ``kernel`` forward and backward on meta at the step's shape, as the recorded
    step ran its loss: logits from before, an engine-owned gradient of its output."""
    import torch

    from memprobe.measure.step import kernel_call, process_group_for, torch_dtype
    from memprobe.measure.tracker import AllocationTracker
    from memprobe.records import Case

    case = Case(kernel, step.batch, step.rows, step.vocab, step.dtype, chunk_size)
    call = kernel_call(case)
    tracker = AllocationTracker(capture_frames=True)
    released: list[int] = []

    class _Loss(torch.autograd.Function):
        """Stands in for the user's loss code (kept as recorded): its backward makes the
        gradient of the kernel's output, owned by the autograd engine."""

        @staticmethod
        def forward(ctx: Any, out: torch.Tensor) -> torch.Tensor:
            ctx.like = (out.shape, out.dtype, out.device)
            return out.new_empty(())

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            shape, dtype, device = ctx.like
            seed = torch.empty(shape, dtype=dtype, device=device)
            released.append(len(tracker.events) - 1)  # its alloc, just registered
            tracker.set_phase(_KERNEL_BACKWARD)
            return seed

    class _Head(torch.autograd.Function):
        """Stands in for the lm_head: makes the logits, and takes their gradient in
        backward, which the engine frees once it returns (as after the real lm_head's)."""

        @staticmethod
        def forward(ctx: Any, weight: torch.Tensor) -> torch.Tensor:
            shape = (case.batch, case.tokens, case.vocab)
            made = torch.empty(shape, dtype=torch_dtype(case.dtype), device="meta")
            made_at.append(len(tracker.events) - 1)
            return made

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            tracker.set_phase(_AFTER)
            return grad.new_zeros(())

    made_at: list[int] = []

    def run() -> None:
        weight = torch.empty((), device="meta", requires_grad=True)
        targets = torch.empty((case.batch, case.tokens), dtype=torch.long, device="meta")
        with tracker:
            logits = _Head.apply(weight)
            tracker.set_phase(_KERNEL_FORWARD)
            out = call(logits, targets)
            del logits  # from here only the kernel holds them, if it saved them
            tracker.set_phase(_LOSS)
            loss = _Loss.apply(out)
            (grad,) = torch.autograd.grad(loss, weight)
            tracker.set_phase(_AFTER)
            del out, loss, grad

    tracker.stop_code = run.__code__
    with process_group_for(case):
        run()
    return _split(
        tracker.events, released[0] if released else None, made_at[0] if made_at else None
    )


def _split(events: list[Event], seed_at: int | None, logits_at: int | None) -> KernelTrace:
    # Storage ids are reused once freed: a block is known by its id only while live.
    live: dict[int, Event] = {}
    forward: list[Event] = []
    backward: list[Event] = []
    escapes: list[Event] = []
    release_at: int | None = None
    seed = events[seed_at].storage if seed_at is not None else None
    logits = events[logits_at].storage if logits_at is not None else None
    release: tuple[str, int] = ("after", 0)
    for e in events:
        if logits_at is not None and e.index > logits_at and e.storage == logits:
            logits_at = None  # its free: where the kernel let the logits go
            if e.phase in (_KERNEL_FORWARD, _LOSS):
                release = ("forward", len(forward))
            elif e.phase == _KERNEL_BACKWARD:
                release = ("backward", len(backward))
        if e.action == "alloc":
            if e.phase in (_KERNEL_FORWARD, _KERNEL_BACKWARD) and e.nbytes > 0:
                live[e.storage] = e
                (forward if e.phase == _KERNEL_FORWARD else backward).append(e)
            continue
        if seed_at is not None and e.index > seed_at and e.storage == seed:
            seed_at = None
            release_at = len(backward)
        made = live.pop(e.storage, None)
        if made is None:
            continue
        if e.phase == _AFTER:
            escapes.append(made)
        else:
            # A forward block freed before the kernel's backward began: at its forward's end.
            (forward if e.phase in (_KERNEL_FORWARD, _LOSS) else backward).append(e)
    escapes += live.values()
    escapes.sort(key=lambda e: e.index)
    return KernelTrace(
        forward=tuple(forward),
        backward=tuple(backward),
        release_at=len(backward) if release_at is None else release_at,
        forward_escapes=tuple(e for e in escapes if e.phase == _KERNEL_FORWARD),
        backward_escapes=tuple(e for e in escapes if e.phase == _KERNEL_BACKWARD),
        logits_release=release,
    )


# ------------------------------------------------------------------------- the splice


def splice(snap: dict[str, Any], dev: int, step: LossStep, kt: KernelTrace) -> dict[str, Any]:
    """The snapshot with the step's blocks replaced by the kernel's (see module notes)."""
    entries = snap["device_traces"][dev]
    (fs, fe), (bs, be) = step.forward, step.backward
    cut_pos: set[int] = set()
    by_addr: dict[int, list[int]] = {}
    for pos, e in enumerate(entries):
        if e["action"] in BLOCK_ACTIONS:
            by_addr.setdefault(e["addr"], []).append(pos)
    for b in step.cut:
        positions = by_addr[b.addr]
        i = bisect.bisect_left(positions, b.alloc_pos)
        cut_pos.add(b.alloc_pos)
        for pos in positions[i + 1 :]:
            if entries[pos]["action"] == ALLOC:
                break
            cut_pos.add(pos)

    # The logits, when only the loss held them, live as long as the kernel holds them.
    logits_entries: list[dict[str, Any]] = []
    logits_at: tuple[str, int] | None = None
    la, lf = step.logits.alloc_pos, step.logits.free_pos
    if lf is not None and lf <= be:
        where, k = kt.logits_release
        at = {"forward": fe, "backward": be}.get(where, step.gradient.free_pos)
        if at is None or at >= lf:
            positions = by_addr[step.logits.addr]
            for pos in positions[bisect.bisect_right(positions, la) :]:
                if entries[pos]["action"] == ALLOC:
                    break
                cut_pos.add(pos)
                logits_entries.append(entries[pos])
            if where != "after":
                logits_at = (where, k)
            elif at is not None:
                logits_at = ("at", at)
            else:
                logits_entries = []  # the gradient (the logits' buffer) lives to the end

    def escapes(lo: int, hi: int) -> list[ReplayBlock]:
        return sorted(
            (
                b
                for b in step.cut
                if lo <= b.alloc_pos <= hi and (b.free_pos is None or not step.inside(b.free_pos))
            ),
            key=lambda b: b.alloc_pos,
        )

    # The kernel's blocks that outlive it are freed where the recorded ones were: its
    # gradient where the logits' gradient was, an output where the recorded block of its
    # size was (else the one freed last: what the user's code held); with no recorded
    # counterpart at all, at the end of the kernel's backward.
    frees_at: dict[int, list[Event]] = {}
    after_backward: list[Event] = []
    for outliving, theirs in (
        (kt.forward_escapes, escapes(fs, fe)),
        (kt.backward_escapes, escapes(bs, be)),
    ):
        unused = list(theirs)
        for made in outliving:
            e = replace(made, action="free")
            if outliving is kt.backward_escapes and made.nbytes == step.gradient.size:
                match: ReplayBlock | None = step.gradient
            else:
                same = [b for b in unused if b.size == made.nbytes]
                match = same[0] if same else _last_freed(theirs)
            if match is None:
                after_backward.append(e)
                continue
            if match in unused:
                unused.remove(match)
            if match.free_pos is not None:  # else alive at the end, as the recorded one was
                frees_at.setdefault(match.free_pos, []).append(e)

    template = step.cut[0].alloc_entry or {}
    stream = int(template.get("stream", 0))
    addresses: dict[int, int] = {}  # storage -> address, while live
    count = [0]
    out: list[dict[str, Any]] = []
    last_time: list[Any] = [None]

    def emit(e: Event, base_frames: list[Any], phase: str) -> None:
        if e.action == "alloc":
            addr = addresses[e.storage] = SPLICE_ADDRESS + 512 * count[0]
            count[0] += 1
            actions: tuple[str, ...] = (ALLOC,)
        else:
            addr = addresses.pop(e.storage)
            actions = (FREE_REQUESTED, FREE_COMPLETED)
        for action in actions:
            entry = {
                "action": action,
                "addr": addr,
                "size": e.nbytes,
                "stream": stream,
                "frames": frames_to_dicts(e.frames) + list(base_frames),
                "user_metadata": format_label(phase=phase, op=e.op, dtype=e.dtype, shape=e.shape),
            }
            if last_time[0] is not None:
                entry["time_us"] = last_time[0]
            out.append(entry)

    fwd_frames = (entries[fs].get("frames") or []) if fs < len(entries) else []
    bwd_frames = (entries[bs].get("frames") or []) if bs < len(entries) else []
    held_fwd: list[dict[str, Any]] = []
    held_bwd: list[dict[str, Any]] = []
    for pos, e in enumerate(entries):
        if "time_us" in e:
            last_time[0] = e["time_us"]
        for ev in frees_at.pop(pos, ()):
            emit(ev, fwd_frames, "backward")
        if logits_at == ("at", pos):
            out.extend(logits_entries)
        if pos not in cut_pos:
            keep_free = e["action"] in FREES
            if keep_free and fs <= pos <= fe:
                held_fwd.append(e)
            elif keep_free and bs <= pos <= be:
                held_bwd.append(e)
            else:
                out.append(e)
        if pos == fe:
            for k, ev in enumerate(kt.forward):
                if logits_at == ("forward", k):
                    out.extend(logits_entries)
                emit(ev, fwd_frames, "forward")
            if logits_at == ("forward", len(kt.forward)):
                out.extend(logits_entries)
            out.extend(held_fwd)
        if pos == be:
            for k, ev in enumerate(kt.backward):
                if k == kt.release_at:
                    out.extend(held_bwd)
                    held_bwd = []
                if logits_at == ("backward", k):
                    out.extend(logits_entries)
                emit(ev, bwd_frames, "backward")
            out.extend(held_bwd)
            if logits_at == ("backward", len(kt.backward)):
                out.extend(logits_entries)
            for ev in after_backward:
                emit(ev, bwd_frames, "backward")

    # Cut blocks still live at snapshot time are gone from the final segments too.
    gone = {b.addr for b in step.cut if b.free_pos is None}
    segments = copy.deepcopy(snap["segments"])
    for seg in segments:
        if seg.get("device", 0) != dev:
            continue
        for block in seg["blocks"]:
            if block["address"] in gone:
                block["state"] = INACTIVE
    traces = list(snap["device_traces"])
    traces[dev] = out
    return {**snap, "segments": segments, "device_traces": traces}


def _last_freed(blocks: list[ReplayBlock]) -> ReplayBlock | None:
    if not blocks:
        return None
    return max(blocks, key=lambda b: (b.free_pos is None, b.free_pos or 0))


# ---------------------------------------------------------------------------- the API


def check_what_if_kernel(kernel: str) -> None:
    """One line for a kernel --what-if cannot splice: unknown, or of the hidden family."""
    from memprobe.kernels import get_spec

    try:
        spec = get_spec(kernel)
    except ValueError as exc:
        raise UserError(str(exc), "see `memprobe kernels`") from None
    if spec.inputs == "hidden":
        raise UserError(
            f"{kernel} takes hidden states and the lm_head weight: --what-if swaps the loss "
            "on the logits, not the lm_head",
            "name a logits kernel (`memprobe kernels`), e.g. --what-if local_chunked",
        )


def what_if(
    snapshot: dict[str, Any],
    kernel: str,
    *,
    budget_bytes: int | None = None,
    chunk_size: int | None = 1024,
    device: int | None = None,
    vocab: int | None = None,
    tokens: int | None = None,
    batch: int | None = None,
    path: str | None = None,
) -> WhatIf:
    """Predict the snapshot's step with ``kernel`` as its loss (see the module notes).

    ``budget_bytes`` is the device's capacity (else the one a recorded OOM implies:
    reserved plus the device's free bytes then); ``vocab``/``tokens``/``batch`` fix the
    shape as for :func:`memprobe.attribute.attribute`.
    """
    check_what_if_kernel(kernel)
    snap = normalize_snapshot(snapshot, source=path or "<snapshot>")
    found = attribute(snap, device=device, path=path, vocab=vocab, tokens=tokens, batch=batch)
    rep = replay(snap, device=found.device)
    step = find_loss_step(snap, found, rep)
    kt = simulate_kernel(kernel, step, chunk_size)
    spliced = splice(snap, found.device, step, kt)
    predicted = attribute(
        spliced, device=found.device, path=path, vocab=vocab, tokens=tokens, batch=batch
    )
    model = {r.device: r for r in replay_snapshot(snap)}[found.device]
    modelled = {r.device: r for r in replay_snapshot(spliced)}[found.device]
    capacity, source = budget_bytes, "--budget" if budget_bytes is not None else None
    if capacity is None:
        capacity, source = _oom_capacity(rep)
    from memprobe.kernels import get_spec

    return WhatIf(
        kernel=kernel,
        shape=(step.batch, step.rows, step.vocab),
        dtype=step.torch_dtype,
        chunk_size=chunk_size if get_spec(kernel).uses_chunk_size else None,
        forward_entries=step.forward,
        backward_entries=step.backward,
        cut_blocks=len(step.cut),
        recorded_peak_bytes=found.peak_allocated_bytes,
        predicted_peak_bytes=predicted.peak_allocated_bytes,
        recorded_reserved_peak_bytes=found.peak_reserved_bytes,
        model_reserved_peak_bytes=model.predicted_reserved_peak_bytes,
        predicted_reserved_peak_bytes=modelled.predicted_reserved_peak_bytes,
        predicted=predicted,
        capacity_bytes=capacity,
        capacity_source=source,
    )


def _oom_capacity(rep: Replay) -> tuple[int | None, str | None]:
    """What the allocator could reach on the device, from the first recorded OOM."""
    for moment in rep.ooms:
        free = moment.entry.get("device_free")
        if isinstance(free, int) and moment.reserved_bytes is not None:
            return moment.reserved_bytes + free, "reserved + the device's free bytes at the OOM"
    return None, None


@dataclass(frozen=True)
class OtherMemory:
    """What the rest of the step held while its logprob step ran: one snapshot's reading."""

    tokens: int  # N = B·S of the loss step
    other_bytes: int  # the most live bytes that were neither the logits nor the step's own
    at_index: int  # the trace entry where that was


def other_memory(
    snapshot: dict[str, Any], *, device: int | None = None, path: str | None = None
) -> OtherMemory:
    """The memory that is not the logprob step, at that step's moment: the most bytes live
    from the logits' consumer in forward until the logits' gradient is freed (the lm_head's
    backward makes its weight gradient while it lives) that are neither the logits nor a
    block the step made (what ``memprobe plan`` calls "other").
    Raises :class:`UserError` where the step cannot be cut (see :func:`find_loss_step`)."""
    snap = normalize_snapshot(snapshot, source=path or "<snapshot>")
    found = attribute(snap, device=device, path=path)
    rep = replay(snap, device=found.device)
    step = find_loss_step(snap, found, rep)
    fs = step.forward[0]
    be = step.gradient.free_pos if step.gradient.free_pos is not None else len(rep.entries)
    mine = {id(b) for b in step.cut} | {id(step.logits)}
    live = 0
    deltas: list[tuple[int, int]] = []
    for b in rep.blocks:
        if id(b) in mine:
            continue
        if b.live_at(fs):
            live += b.size
        elif fs < b.alloc_pos <= be:
            deltas.append((b.alloc_pos, b.size))
        if b.free_pos is not None and fs < b.free_pos <= be and b.alloc_pos <= be:
            deltas.append((b.free_pos, -b.size))
    most, at = live, fs
    for pos, delta in sorted(deltas):
        live += delta
        if live > most:
            most, at = live, pos
    return OtherMemory(step.batch * step.rows, most, at)
