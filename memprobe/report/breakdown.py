"""What made a peak: the blocks live at it, sorted into the categories the page names.

The categories follow the story the report tells. The input logits and their
gradient are the floor; float32 ``[B, S, V]`` blocks are what the chunked kernels
exist to remove; chunk workspace is the bounded cost of chunking; anything else
the size of a whole ``[B, S, V]`` (full-size slice gradients, int64 sort indices)
is named apart from the small rest, so no big block hides in "other".

These refine attribution's logits-family (:mod:`memprobe.attribute.categories`) for
one log-prob step; the rest is attribution's "other" (the same name, the same look
on every page: :data:`memprobe.render.style.CATEGORY_STYLE`).
"""

from __future__ import annotations

from dataclasses import dataclass

from memprobe.attribute.categories import OTHER
from memprobe.records import Case, torch_dtype_name
from memprobe.report.trace import BEFORE_STEP, Block, Trace
from memprobe.snapshot.allocator import could_hold

INPUT = "input logits"
GRADIENT = "gradient"
FP32_BSV = "float32 [B,S,V] blocks"
OTHER_BSV = "other full [B,S,V] blocks"
CHUNK = "chunk workspace"
CATEGORIES: tuple[str, ...] = (INPUT, GRADIENT, FP32_BSV, OTHER_BSV, CHUNK, OTHER)


@dataclass(frozen=True)
class Breakdown:
    """Bytes per category at one kernel's peak (every category present, maybe 0)."""

    kernel: str
    peak_bytes: int
    parts: dict[str, int]
    fp32_bsv_count: int


def logits_dtype(case: Case) -> str:
    """The logits' dtype as traces record it: ``"torch.bfloat16"``."""
    return f"torch.{torch_dtype_name(case.dtype)}"


def is_fp32_bsv(block: Block, case: Case) -> bool:
    # An unlabelled snapshot's size may be the allocator's rounding of the request.
    return case.is_fp32_bsv(block.nbytes, block.dtype, holds=could_hold)


def _is_full(block: Block, case: Case) -> bool:
    if block.shape is None:
        return False
    numel = 1
    for d in block.shape:
        numel *= d
    elements = case.batch * case.local_tokens * case.local_vocab
    return numel == elements and bool(block.shape) and block.shape[-1] == case.local_vocab


def _is_chunk(block: Block, case: Case) -> bool:
    if block.shape is None or not block.shape or block.shape[-1] != case.local_vocab:
        return False
    return not _is_full(block, case) and len(block.shape) >= 2


def gradient_block(trace: Trace, case: Case) -> Block | None:
    """The logits' gradient: made in backward in the logits' dtype and shape, freed last.

    Intermediate full-size gradients (a naive chunk loop's slice gradients and
    their running sums) are freed before the one autograd returns.
    """
    candidates = [
        b
        for b in trace.blocks
        if b.phase == "backward"
        and (b.dtype == logits_dtype(case) if b.dtype is not None else True)
        and (_is_full(b, case) if b.shape is not None else b.nbytes == case.logits_bytes)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda b: (b.end is None, b.end or 0, b.start))


def categorize(block: Block, case: Case, gradient: Block | None) -> str:
    if block.op.startswith("input"):
        return INPUT
    # An unlabelled block already live when the step began: the logits, if the size fits
    # (the allocator may round a block up), else the targets and the like.
    if block.op == BEFORE_STEP:
        return INPUT if could_hold(block.nbytes, case.logits_bytes) else OTHER
    if block is gradient:
        return GRADIENT
    if is_fp32_bsv(block, case):
        return FP32_BSV
    if _is_full(block, case):
        return OTHER_BSV
    if _is_chunk(block, case):
        return CHUNK
    return OTHER


def breakdown(kernel: str, trace: Trace, case: Case) -> Breakdown:
    """Bytes per category among the blocks live at the trace's peak."""
    gradient = gradient_block(trace, case)
    parts = dict.fromkeys(CATEGORIES, 0)
    count = 0
    for block in trace.live_at_peak():
        category = categorize(block, case, gradient)
        parts[category] += block.nbytes
        count += category == FP32_BSV
    return Breakdown(kernel, sum(parts.values()), parts, count)
