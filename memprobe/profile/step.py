"""A Hugging Face model's whole training step on meta: the peak, what it is made of, and
the log-prob step's share.

:func:`simulate_step` traces an :class:`~memprobe.profile.hf.HFStep` with
:func:`~memprobe.profile.trace_step` (attention as CUDA would run it, unless asked
otherwise), models the caching allocator's reserved bytes on the same events, and
sorts the blocks live at the allocated peak into what they are. The sorting is exact,
not inferred: the step knows its parameters, gradients and optimizer state (by
storage) and marks where its log-prob kernel runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from memprobe.allocator import AllocConf
from memprobe.io.codec import NOT_JSON, to_json
from memprobe.measure.tracker import physical
from memprobe.profile import hf
from memprobe.profile.hf_config import has_attention_heads
from memprobe.profile.phases import events_so_far
from memprobe.profile.run import TrackedStep, trace_step
from memprobe.records import Event

# What a block live at the peak is, in the order they are told apart.
PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer state"
MASTER_WEIGHTS = "fp32 master weights"
# A sharded step's (memprobe.profile.sharded): FSDP2's all-gather and reduce-scatter
# buffers, and the parameters a unit holds all-gathered while it runs.
COMMUNICATION = "FSDP communication buffers"
UNSHARDED = "unsharded parameters"
CP_KV = "context-parallel K/V (all-gathered)"
LOGPROB = "logprob step"
LOGITS = "logits"
ATTENTION = "attention"
CHECKPOINTED = "checkpointed activations"
ACTIVATIONS = "activations"
BACKWARD = "backward temporaries"
OPTIMIZER_TEMP = "optimizer temporaries"
INPUTS = "inputs (token ids, targets)"
OTHER = "other"
CATEGORIES = (
    PARAMETERS,
    GRADIENTS,
    OPTIMIZER_STATE,
    MASTER_WEIGHTS,
    COMMUNICATION,
    UNSHARDED,
    CP_KV,
    LOGPROB,
    LOGITS,
    ATTENTION,
    CHECKPOINTED,
    ACTIVATIONS,
    BACKWARD,
    OPTIMIZER_TEMP,
    INPUTS,
    OTHER,
)

# The attention backend in words, by what profile.attention counted.
_BACKEND_WORDS = {
    "flash": "flash attention (CUDA's choice: no [S,S] scores; backward workspace counted)",
    "efficient": "memory-efficient attention (CUDA's choice: no [S,S] scores)",
    "cpu-flash": "the fused CPU kernel (no [S,S] scores)",
    "math": "math SDPA ([B,h,S,S] scores materialized)",
}


@dataclass(frozen=True)
class StepResult:
    """One simulated step: peaks, the breakdown at the allocated peak, the attention
    kernels simulated; ``bytes_by_category`` in :data:`CATEGORIES` order (zeros left out)."""

    model_type: str
    parameters: int
    tokens: int
    batch: int
    kernel: str
    checkpointing: bool
    optimizer: str
    dtype: str
    param_dtype: str
    attn: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_phase: str
    bytes_by_category: dict[str, int]
    attention: dict[str, int]
    phase_peaks: dict[str, int]
    # The most bytes the log-prob kernel's own allocations held at once, wherever
    # the step's peak is (its working set on top of the rest).
    logprob_working_bytes: int = 0
    budget_bytes: int | None = None
    # A sharded step's layout and per-rank sharding arithmetic (profile.sharded).
    sharded: dict[str, Any] | None = None
    events: tuple[Event, ...] = field(default=(), repr=False, compare=False, metadata=NOT_JSON)
    # An architecture without attention heads (mamba, rwkv, xlstm): no attention layer ran.
    attention_free: bool = field(default=False, compare=False, metadata=NOT_JSON)

    @property
    def logprob_bytes(self) -> int:
        return self.bytes_by_category.get(LOGPROB, 0)

    @property
    def logprob_share(self) -> float:
        return self.logprob_bytes / self.peak_allocated_bytes if self.peak_allocated_bytes else 0.0

    @property
    def attention_words(self) -> str:
        if not self.attention and self.attention_free:
            # Its mixer runs as transformers' torch code on meta, not a fused CUDA kernel
            # (mamba-ssm's, when installed on the GPU, holds less).
            return "none: an attention-free architecture (its mixer as transformers' torch code)"
        if not self.attention:
            return "eager (the model's own matmul + softmax: [B,h,S,S] scores)"
        return ", ".join(
            f"{_BACKEND_WORDS.get(k, k)} x{n}" if len(self.attention) > 1 else _BACKEND_WORDS[k]
            for k, n in sorted(self.attention.items())
        )

    def fits(self, kind: str = "reserved") -> bool | None:
        if self.budget_bytes is None:
            return None
        peak = self.peak_reserved_bytes if kind == "reserved" else self.peak_allocated_bytes
        return peak <= self.budget_bytes

    def row(self) -> dict[str, Any]:
        """The ``--json`` object."""
        row = to_json(self)
        row["logprob_bytes"] = self.logprob_bytes
        row["logprob_share"] = round(self.logprob_share, 6)
        row["fits_allocated"] = self.fits("allocated")
        row["fits_reserved"] = self.fits("reserved")
        return row


def attention_target(attn: str) -> str:
    """The meta routing (:func:`memprobe.profile.attention.sdpa_on_meta`) for ``--attn``."""
    return "math" if attn == "sdpa-math" else "cuda"


# The model is transformers' code built from config.json, and step and plan --step take
# no --device: "try --device cpu" named a flag neither has, and blamed meta for a size
# the architecture cannot take (an MoE of 0 experts failed at aten.histc); a sharded
# step's failure (its fake world runs on cpu) said to "fix the step", memprobe's own.
CONFIG_FAILED = (
    "the model built from config.json cannot run this op: check the config's sizes "
    "(one its architecture cannot take, e.g. 0 experts)"
)


def trace_hf_step(
    step: hf.HFStep,
    device: str = "meta",
    *,
    capture_frames: bool = False,
    attention: str | None = None,
    memo: bool = True,
) -> tuple[TrackedStep, _Owners]:
    """The tracker's record of ``step`` and who owns which storage (for the breakdown).

    ``attention``: the meta routing target; by default what ``step.attn`` asks
    (``cuda``'s choice for ``auto``). ``cpu`` makes a meta trace equal a real cpu run.
    ``memo``: a layer's repeated meta ops answered from memory (exact; see
    :mod:`memprobe.measure.memo`).
    """
    owners = _Owners()
    target = attention or attention_target(step.attn)
    # A sharded step runs in a fake world of ranks (profile.sharded); a plain one as is.
    with step.simulation(device) as traced_on:
        tracked = trace_step(
            owners.wrap(step),
            traced_on,
            capture_frames=capture_frames,
            attention=target,
            memo=memo,
            failure_hint=CONFIG_FAILED,
            # memprobe's model: what a kernel's module left of torch as it was imported
            # (a function replaced, a global module hook) is its kernel's own. Lent to the
            # whole step, a replaced F.scaled_dot_product_attention or torch.nn.Linear ran
            # in the model, and its failure was blamed on config.json's sizes.
            its_state=False,
        )
    return tracked, owners


def simulate_step(
    step: hf.HFStep,
    *,
    budget_bytes: int | None = None,
    alloc_conf: AllocConf | None = None,
    capture_frames: bool = False,
    device: str = "meta",
    attention: str | None = None,
) -> StepResult:
    """Trace ``step`` on meta and read its peaks and the breakdown at the allocated peak."""
    from memprobe.measure.reserved import modelled_reserved_peak

    tracked, owners = trace_hf_step(
        step, device, capture_frames=capture_frames, attention=attention
    )
    peak_event = tracked.events[tracked.peak_index]
    categories = categorize(tracked, owners, step)
    return StepResult(
        model_type=str(step.config.model_type),
        parameters=owners.parameter_count,
        tokens=step.tokens,
        batch=step.batch,
        kernel=step.kernel,
        checkpointing=step.checkpointing,
        optimizer=step.optimizer,
        dtype=step.dtype,
        param_dtype=step.param_dtype or step.dtype,
        attn=step.attn,
        peak_allocated_bytes=tracked.peak_bytes,
        peak_reserved_bytes=modelled_reserved_peak(tracked.events, alloc_conf),
        peak_phase=peak_event.phase,
        bytes_by_category=categories,
        attention=dict(tracked.attention),
        phase_peaks=dict(tracked.phase_peaks),
        logprob_working_bytes=working_set(tracked.events, logprob_windows(tracked.marks)),
        budget_bytes=budget_bytes,
        sharded=step.sharded_summary(),
        events=tracked.events,
        attention_free=not has_attention_heads(type(step.config)),
    )


class _Owners:
    """The storages of the step's parameters, gradients and optimizer state, read from
    the model and optimizer while the step runs (keys as the tracker's events have them)."""

    def __init__(self) -> None:
        self.parameters: set[int] = set()
        # Gradients and optimizer state: storage key -> the event counts at which a tensor
        # of that storage was noted. A key is an address, reused once its storage is freed:
        # the note names the allocation just before it, not a later one at the same key
        # (the logits' gradient, freed, then an lm_head gradient at its address).
        self.gradients: dict[int, list[int]] = {}
        self.optimizer_state: dict[int, list[int]] = {}
        self.master: set[int] = set()
        self.parameter_count = 0

    def wrap(self, step: hf.HFStep) -> Any:
        """``step`` as a plain step that notes its model and optimizer while it runs."""

        def traced(device: torch.device) -> None:
            # The optimizer's state and the gradients it stepped, read just after its step.
            hook = register_optimizer_step_post_hook(
                lambda optimizer, args, kwargs: self.note_optimizer(optimizer)
            )
            try:
                step.run(device, on_model=self.note_model)
            finally:
                hook.remove()

        return traced

    def note_model(self, model: torch.nn.Module) -> None:
        params = list(model.parameters())
        self.parameter_count = sum(p.numel() for p in params)
        self.parameters = {_key(p) for p in params} | {_key(b) for b in model.buffers()}
        # Gradients: AccumulateGrad's result, noted as each one lands.
        for p in params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._note_grad)

    def _note_grad(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            _note(self.gradients, p.grad)

    def note_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if _key(p) not in self.parameters:
                    self.master.add(_key(p))
                if p.grad is not None:
                    _note(self.gradients, p.grad)
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    _note(self.optimizer_state, value)


def _key(t: torch.Tensor) -> int:
    return int(physical(t).untyped_storage()._cdata)


def _note(notes: dict[int, list[int]], t: torch.Tensor) -> None:
    at = events_so_far()
    notes.setdefault(_key(t), []).append(at if at is not None else 0)


def _noted(event: Event, notes: dict[int, list[int]], next_alloc: dict[int, int]) -> bool:
    """``event``'s storage is one that was noted: a note after its allocation and before
    the next allocation at the same key."""
    until = next_alloc.get(event.index)
    return any(
        event.index < at and (until is None or at <= until) for at in notes.get(event.storage, ())
    )


def _next_allocs(events: Iterable[Event]) -> dict[int, int]:
    """Each alloc event's index -> the index of the next alloc at the same storage key."""
    last: dict[int, int] = {}
    out: dict[int, int] = {}
    for event in events:
        if event.action == "alloc":
            if event.storage in last:
                out[last[event.storage]] = event.index
            last[event.storage] = event.index
    return out


def logprob_windows(marks: Iterable[tuple[str, int]]) -> list[tuple[int, int]]:
    """Event index ranges ``[start, end)`` in which the step's log-prob kernel ran: its
    forward, and backward from its start until the gradient reached the logits."""
    at = dict(marks)
    windows = []
    if hf.LOGPROB_START in at and hf.LOGPROB_END in at:
        windows.append((at[hf.LOGPROB_START], at[hf.LOGPROB_END]))
    if hf.BACKWARD_START in at and hf.LOGPROB_GRAD in at:
        windows.append((at[hf.BACKWARD_START], at[hf.LOGPROB_GRAD]))
    return windows


def working_set(events: Iterable[Event], windows: list[tuple[int, int]]) -> int:
    """The most bytes live at once among the storages allocated inside ``windows``."""
    live: dict[int, int] = {}
    total = most = 0
    for event in events:
        if event.action == "alloc":
            if any(start <= event.index < end for start, end in windows):
                live[event.storage] = event.nbytes
                total += event.nbytes
                most = max(most, total)
        elif event.storage in live:
            total -= live.pop(event.storage)
    return most


def categorize(tracked: TrackedStep, owners: _Owners, step: hf.HFStep) -> dict[str, int]:
    """Bytes live at the allocated peak, by what they are (:data:`CATEGORIES`)."""
    windows = logprob_windows(tracked.marks)
    logits_start = dict(tracked.marks).get(hf.LOGPROB_START)
    seq = step.tokens
    out = dict.fromkeys(CATEGORIES, 0)
    next_alloc = _next_allocs(tracked.events)
    for event in tracked.live_at_peak():
        out[_category(event, owners, next_alloc, windows, logits_start, seq, step)] += event.nbytes
    return {k: v for k, v in out.items() if v}


def _scores_shaped(event: Event, seq: int, batch: int) -> bool:
    """Attention scores or a mask: ``[B, h, S, S]`` (``[B, 1, S, S]``), or the ``[B·h, S, S]``
    of a bmm, made in forward or backward. A trailing ``[S, S]`` alone is not enough: at
    --tokens equal to the hidden size an ``[H, H]`` projection's optimizer temporaries and
    the ``[1, S, H]`` or ``[S, H]`` activations end so too (2 GiB of AdamW's temporaries
    were "attention" for an 8B model at 4,096 tokens)."""
    shape = event.shape
    if event.phase not in ("forward", "backward") or shape[-2:] != (seq, seq):
        return False
    if len(shape) == 4:
        return True
    return len(shape) == 3 and shape[0] != batch and shape[0] % batch == 0


def _category(
    event: Event,
    owners: _Owners,
    next_alloc: dict[int, int],
    windows: list[tuple[int, int]],
    logits_start: int | None,
    seq: int,
    step: hf.HFStep,
) -> str:
    key = event.storage
    if event.phase == "setup" and key in owners.parameters:
        return PARAMETERS
    if event.phase in ("backward", "optimizer") and _noted(event, owners.gradients, next_alloc):
        return GRADIENTS
    # (Made before the step, in setup, as every step after the first holds it: hf._steady_state.)
    if event.phase in ("setup", "optimizer") and _noted(event, owners.optimizer_state, next_alloc):
        return OPTIMIZER_STATE
    if key in owners.master and event.phase == "setup":
        return MASTER_WEIGHTS
    special = step.category_of(event)
    if special is not None:
        return special
    if any(start <= event.index < end for start, end in windows):
        return LOGPROB
    if (
        not step.hidden_route
        and logits_start is not None
        and event.index < logits_start
        and event.shape[-1:] == (step.local_vocab,)
        and event.shape[-2:-1] == (seq,)
    ):
        return LOGITS
    if "attention" in event.op or _scores_shaped(event, seq, step.batch):
        return ATTENTION
    if event.phase == "forward":
        return CHECKPOINTED if step.checkpointing else ACTIVATIONS
    if event.phase == "backward":
        return BACKWARD
    if event.phase == "optimizer":
        return OPTIMIZER_TEMP
    if event.phase == "setup":
        return INPUTS
    return OTHER
