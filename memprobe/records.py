"""The plain records that flow between stages: Case → Run (with its Event trace).

Each is a frozen dataclass that can be written to JSON and read back
(:mod:`memprobe.io.codec`).
"""

from __future__ import annotations

import hashlib
import math
import operator
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from memprobe.io.codec import NOT_JSON, to_json

# Logits dtypes by memprobe's short name: (torch's name, bytes per element). Names,
# not torch.dtype objects, so reading results or snapshots never imports torch;
# ``torch_dtype`` converts where tensors are made.
DTYPES: dict[str, tuple[str, int]] = {
    "bf16": ("bfloat16", 2),
    "fp16": ("float16", 2),
    "fp32": ("float32", 4),
}
DTYPE_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
}
# Far beyond any GPU's tokens, vocabulary or ranks (a bf16 [1, 2^40] row alone is 2 TiB);
# past it a shape's byte count no longer fits the 64-bit results columns. Every count a
# flag or a config gives is held to it.
MAX_COUNT = 2**40
# torch refuses a tensor of 2^63 bytes or more ("Storage size calculation overflowed"); the
# widest elements memprobe's kernels make are 8 bytes (int64 sort orders, float64 checks).
MAX_TENSOR_ELEMENTS = 2**63 // 8
STATUSES = ("ok", "oom", "skipped", "error")
PHASES = ("setup", "forward", "backward")
# Where a step runs; a sweep or a rule may also say "auto" (cuda when available, else meta).
DEVICES = ("meta", "cpu", "cuda")
DEVICE_CHOICES = ("auto", *DEVICES)


def dtype_bytes(dtype: str) -> int:
    return DTYPES[dtype][1]


def torch_dtype_name(dtype: str) -> str:
    """``"bf16"`` → ``"bfloat16"``: torch's spelling, as snapshots and labels use it."""
    return DTYPES[dtype][0]


def normalize_dtype(name: str) -> str | None:
    """A user's spelling (``bf16``, ``bfloat16``, ``BF16``) → memprobe's name, None if unknown."""
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    return key if key in DTYPES else None


@dataclass(frozen=True)
class Case:
    """What to run: one kernel at one shape on one device."""

    kernel: str
    batch: int
    tokens: int
    vocab: int
    dtype: str = "bf16"
    chunk_size: int | None = 1024
    tp: int = 1
    cp: int = 1
    device: str = "meta"
    # Hidden size H for the hidden family (kernels fed hidden [B,S,H] and the lm_head
    # weight [V,H] instead of logits); None for logits kernels.
    hidden: int | None = None

    @property
    def case_id(self) -> str:
        """Stable, file-name-safe id: readable prefix plus a short hash of every field."""
        fields_ = asdict(self)
        if self.hidden is None:
            del fields_["hidden"]  # logits cases keep the ids they had before H existed
        digest = hashlib.sha1(repr(sorted(fields_.items())).encode()).hexdigest()[:8]
        chunk = "none" if self.chunk_size is None else str(self.chunk_size)
        # A user kernel is named by its import path ("pkg.mod:fn"): keep file names portable.
        kernel = re.sub(r"[^A-Za-z0-9._-]", "_", self.kernel)
        hidden = "" if self.hidden is None else f"-h{self.hidden}"
        return (
            f"{kernel}{hidden}-b{self.batch}-s{self.tokens}-v{self.vocab}-{self.dtype}"
            f"-c{chunk}-tp{self.tp}-cp{self.cp}-{self.device}-{digest}"
        )

    @property
    def local_tokens(self) -> int:
        """Tokens one rank holds (context parallel splits the sequence)."""
        return self.tokens // self.cp

    @property
    def local_vocab(self) -> int:
        """Vocabulary ids one rank holds (tensor parallel splits the vocabulary)."""
        return self.vocab // self.tp

    @property
    def logits_bytes(self) -> int:
        return self.batch * self.local_tokens * self.local_vocab * dtype_bytes(self.dtype)

    @property
    def fp32_bsv_bytes(self) -> int:
        """Bytes of one float32 [B, S, V] block on one rank: the block to avoid."""
        return self.batch * self.local_tokens * self.local_vocab * 4

    def is_fp32_bsv(
        self, nbytes: int, dtype: str | None, *, holds: Callable[[int, int], bool] | None = None
    ) -> bool:
        """Whether a block is one float32 [B, S, V] of this case (one rank's shape).

        With its dtype known (``"float32"`` or torch's ``"torch.float32"``) it must be
        float32 and exactly that size. Without (an unlabelled snapshot) only the size
        speaks: ``holds(nbytes, fp32_bsv_bytes)`` says whether a block that big can be
        what the allocator gave such a request (its rounding); exact by default.
        """
        if dtype is not None:
            return dtype.removeprefix("torch.") == "float32" and nbytes == self.fp32_bsv_bytes
        return (holds or operator.eq)(nbytes, self.fp32_bsv_bytes)


@dataclass(frozen=True)
class Grid:
    """What a sweep runs, before it becomes Cases: the one definition of the grid's
    fields, shared by the ``sweep`` flags, ``[tool.memprobe.sweep]`` and the planner.

    ``kernel`` None means every kernel that fits the parallel layout. With
    ``ladder`` a single tokens or vocab value N becomes a ×2 ladder ending at N;
    ``cross`` False runs the full tokens × vocab product instead of the cross.
    """

    tokens: tuple[int, ...] = (20000,)
    vocab: tuple[int, ...] = (131072,)
    batch: tuple[int, ...] = (1,)
    dtype: tuple[str, ...] = ("bf16",)
    kernel: tuple[str, ...] | None = None
    chunk_size: tuple[int | None, ...] = (1024,)
    tp: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)
    device: str = "auto"
    grid: bool = False
    ladder: bool = True
    # Hidden sizes H: the hidden-family kernels' cases (None: logits kernels only).
    hidden: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Frame:
    name: str
    filename: str
    line: int
    # The file's own name, when ``filename`` was escaped for printing (a snapshot's frames):
    # split from the path before escaping, as an escape's backslash is no separator.
    basename: str = field(default="", repr=False, compare=False, metadata=NOT_JSON)


@dataclass(frozen=True)
class Event:
    """One allocation or free of a tensor storage seen by the tracker."""

    index: int
    time_us: float
    action: str  # "alloc" | "free"
    storage: int  # id of the storage, stable for its lifetime (stands in for an address)
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    op: str
    phase: str
    frames: tuple[Frame, ...] = ()


@dataclass(frozen=True)
class Run:
    """The outcome of one Case. Missing measurements are None, never 0."""

    case: Case
    status: str
    peak_bytes: int | None = None
    forward_peak_bytes: int | None = None
    backward_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    # "measured" (the CUDA allocator's own statistics) or "modelled" (memprobe's model
    # of the caching allocator replaying the tracked allocations); None without a figure.
    reserved_source: str | None = None
    floor_bytes: int | None = None
    fwd_time_s: float | None = None
    bwd_time_s: float | None = None
    max_abs_err_fwd: float | None = None
    max_abs_err_bwd: float | None = None
    big_fp32_blocks: int | None = None
    fwd_collectives: int | None = None
    bwd_collectives: int | None = None
    note: str = ""
    snapshot: str | None = None
    events: tuple[Event, ...] = field(default=(), repr=False, compare=False, metadata=NOT_JSON)
    # A real CUDA allocator snapshot taken by the cuda backend (not a results column).
    cuda_snapshot: dict[str, Any] | None = field(
        default=None, repr=False, compare=False, metadata=NOT_JSON
    )

    def row(self) -> dict[str, Any]:
        """One flat results row (no trace): the case's id and fields, then the outcome's."""
        row: dict[str, Any] = {"case_id": self.case.case_id, **to_json(self.case)}
        for name, value in to_json(self).items():
            if name != "case":
                finite = not isinstance(value, float) or math.isfinite(value)
                row[name] = value if finite else None
        return row


RESULT_COLUMNS: tuple[str, ...] = tuple(Run(Case("x", 1, 1, 1), "ok").row())


def too_large(batch: int, tokens: int, vocab: int, hidden: int | None = None) -> str | None:
    """Why one tensor of a step at these sizes is past what torch can make (its [B, S, V]
    logits, or with a hidden size its [B, S, H] states or [V, H] weight), or None. Each
    count is held to MAX_COUNT, their product is not: past it the simulation failed, and
    the one line blamed the kernel (plan), the model's config (step) or wrote error rows."""
    shapes = {"[B, S, V]": batch * tokens * vocab}
    if hidden is not None:
        shapes |= {"[B, S, H]": batch * tokens * hidden, "[V, H]": vocab * hidden}
    for name, count in shapes.items():
        if count > MAX_TENSOR_ELEMENTS:
            return (
                f"a {name} tensor of {count:,} elements (batch {batch:,}, tokens {tokens:,}, "
                f"vocabulary {vocab:,}{'' if hidden is None else f', hidden {hidden:,}'}) is "
                f"past what one torch tensor holds ({MAX_TENSOR_ELEMENTS:,})"
            )
    return None
