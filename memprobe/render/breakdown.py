"""What made a peak: the blocks live at it, sorted into the categories the page names.

The categories follow the story the report tells. The input logits and their
gradient are the floor; float32 ``[B, S, V]`` blocks are what the chunked kernels
exist to remove; chunk workspace is the bounded cost of chunking; anything else
the size of a whole ``[B, S, V]`` (full-size slice gradients, int64 sort indices)
is named apart from the small rest, so no big block hides in "other".
"""

from __future__ import annotations

from dataclasses import dataclass

from memprobe.records import DTYPES, Case, torch_dtype_name
from memprobe.render.trace import BEFORE_STEP, Block, Trace
from memprobe.snapshot.allocator import could_hold

INPUT = "input logits"
GRADIENT = "gradient"
FP32_BSV = "float32 [B,S,V] blocks"
OTHER_BSV = "other full [B,S,V] blocks"
CHUNK = "chunk workspace"
OTHER = "other"
CATEGORIES: tuple[str, ...] = (INPUT, GRADIENT, FP32_BSV, OTHER_BSV, CHUNK, OTHER)


@dataclass(frozen=True)
class Breakdown:
    """Bytes per category at one kernel's peak (every category present, maybe 0)."""

    kernel: str
    peak_bytes: int
    parts: dict[str, int]
    fp32_bsv_count: int


@dataclass(frozen=True)
class CaseShape:
    """The facts about a case that classification needs (one rank's shapes)."""

    batch: int
    tokens: int
    vocab: int
    logits_dtype: str  # "torch.bfloat16"
    logits_bytes: int
    fp32_bsv_bytes: int

    @classmethod
    def of(cls, case: Case) -> CaseShape:
        return cls(
            batch=case.batch,
            tokens=case.local_tokens,
            vocab=case.local_vocab,
            logits_dtype=f"torch.{torch_dtype_name(case.dtype)}"
            if case.dtype in DTYPES
            else case.dtype,
            logits_bytes=case.logits_bytes,
            fp32_bsv_bytes=case.fp32_bsv_bytes,
        )

    @property
    def elements(self) -> int:
        return self.batch * self.tokens * self.vocab


def is_fp32_bsv(block: Block, shape: CaseShape) -> bool:
    if block.dtype is not None:
        return block.dtype == "torch.float32" and block.nbytes == shape.fp32_bsv_bytes
    # Unlabelled snapshot: only the size speaks, allowing for the allocator's rounding.
    return could_hold(block.nbytes, shape.fp32_bsv_bytes)


def _is_full(block: Block, shape: CaseShape) -> bool:
    if block.shape is None:
        return False
    numel = 1
    for d in block.shape:
        numel *= d
    return numel == shape.elements and bool(block.shape) and block.shape[-1] == shape.vocab


def _is_chunk(block: Block, shape: CaseShape) -> bool:
    if block.shape is None or not block.shape or block.shape[-1] != shape.vocab:
        return False
    return not _is_full(block, shape) and len(block.shape) >= 2


def gradient_block(trace: Trace, shape: CaseShape) -> Block | None:
    """The logits' gradient: made in backward in the logits' dtype and shape, freed last.

    Intermediate full-size gradients (a naive chunk loop's slice gradients and
    their running sums) are freed before the one autograd returns.
    """
    candidates = [
        b
        for b in trace.blocks
        if b.phase == "backward"
        and (b.dtype == shape.logits_dtype if b.dtype is not None else True)
        and (_is_full(b, shape) if b.shape is not None else b.nbytes == shape.logits_bytes)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda b: (b.end is None, b.end or 0, b.start))


def categorize(block: Block, shape: CaseShape, gradient: Block | None) -> str:
    if block.op.startswith("input"):
        return INPUT
    # An unlabelled block already live when the step began: the logits, if the size fits
    # (the allocator may round a block up), else the targets and the like.
    if block.op == BEFORE_STEP:
        return INPUT if could_hold(block.nbytes, shape.logits_bytes) else OTHER
    if block is gradient:
        return GRADIENT
    if is_fp32_bsv(block, shape):
        return FP32_BSV
    if _is_full(block, shape):
        return OTHER_BSV
    if _is_chunk(block, shape):
        return CHUNK
    return OTHER


def breakdown(kernel: str, trace: Trace, shape: CaseShape) -> Breakdown:
    """Bytes per category among the blocks live at the trace's peak."""
    gradient = gradient_block(trace, shape)
    parts = dict.fromkeys(CATEGORIES, 0)
    count = 0
    for block in trace.live_at_peak():
        category = categorize(block, shape, gradient)
        parts[category] += block.nbytes
        count += category == FP32_BSV
    return Breakdown(kernel, sum(parts.values()), parts, count)
