"""What each live byte is: parameters, gradients, optimizer state, forward activations,
backward temporaries, logits-family, or other; and whether a block is logits-family.

Provenance decides. A block is logits-family only when its size is one of the
inferred ``[N, V]`` sizes AND the code that made it is on the logits path (a softmax
/ loss over V or its backward, the lm_head matmul, memprobe's label); or, with no op
that says otherwise, when it was made and freed inside backward at exactly such a
size (the gradient of the logits). Optimizer state, parameters, weight gradients
and integer results never are.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from memprobe.attribute.ops import is_copy, is_int_op, is_matmul, is_opaque_generated
from memprobe.attribute.shapes import ShapeInference
from memprobe.attribute.sites import Phases, Site
from memprobe.snapshot.replay import BEFORE_TRACE, ReplayBlock

PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER = "optimizer state"
ACTIVATIONS = "forward activations"
BACKWARD_TEMP = "backward temporaries"
LOGITS = "logits-family"
ATTENTION = "attention scores"
AUTOCAST = "autocast weight copies"
CHECKPOINT = "checkpointed activations"
COMMUNICATION = "communication buffers"
OTHER = "other"
_COLLECTIVE_OP = re.compile(r"all_?reduce|all_?gather|reduce_?scatter|broadcast", re.I)
CATEGORIES = (
    PARAMETERS, GRADIENTS, OPTIMIZER, ACTIVATIONS, ATTENTION, AUTOCAST, CHECKPOINT,
    COMMUNICATION, BACKWARD_TEMP, LOGITS, OTHER,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Classification:
    """What :func:`classify` says of one block: its category, whether it is of the
    logits family, its phase, and why each."""

    category: str
    reason: str
    logits: bool
    logits_reason: str
    phase: str | None
    phase_reason: str


def logits_fit(size: int, site: Site, shapes: ShapeInference) -> str | None:
    """The dtype an ``[N, V]`` block of ``size`` bytes has, when the size fits."""
    if not shapes.known or not shapes.logits_path:
        return None
    if site.label_shape is not None and site.label_dtype:
        return site.label_dtype if _labelled_bsv(site, shapes) else None
    fit = shapes.fit(size)  # [B·S, V], or [B·(S−1), V] for a shifted loss
    return fit[0] if fit else None


def _rows_sizes(shapes: ShapeInference, loss_rows: bool) -> set[int]:
    n = shapes.loss_tokens if loss_rows else shapes.tokens
    return {(n or 0) * (shapes.vocab or 0) * k for k in (2, 4)}


def _labelled_bsv(site: Site, shapes: ShapeInference) -> bool:
    shape = site.label_shape
    if not shape or shapes.tokens is None or shapes.vocab is None:
        return False
    elements = 1
    for d in shape:
        elements *= d
    # The lm_head's B·S rows, or a shifted loss's B·(S − 1).
    return shape[-1] == shapes.vocab and any(elements == n * shapes.vocab for n in shapes.rows())


def classify(
    block: ReplayBlock,
    site: Site,
    phases: Phases,
    shapes: ShapeInference,
    *,
    trace_length: int,
    segment_site: Site | None = None,
    free_site: Site | None = None,
    casts: frozenset[int] = frozenset(),
) -> Classification:
    """Category and logits-family verdict of one block (see module notes)."""
    before = block.alloc_pos == BEFORE_TRACE
    # A block from before the trace is described by the stack its segment block kept.
    origin = segment_site if before and segment_site is not None else site
    if before:
        phase, phase_reason = None, "allocated before the recorded trace"
        if segment_site is not None and segment_site.has_frames:
            phase, phase_reason = segment_site.phase, "its block's stack in segments"
    else:
        phase = phases.phase(block.alloc_pos)
        phase_reason = phases.reason_at.get(block.alloc_pos) or site.phase_reason
        if phase is None and site.phase is not None:
            phase = site.phase

    logits, why = _logits(block, origin, phase, phases, shapes, before)
    if logits:
        return Classification(LOGITS, why, True, why, phase, phase_reason)
    category, reason = _category(block, origin, phase, phases, before, trace_length)
    if category in (OTHER, ACTIVATIONS, PARAMETERS):
        found = _recognized(block, origin, phase, phases, shapes, before, free_site, casts)
        if found is not None:
            category, reason = found
    return Classification(category, reason, False, "", phase, phase_reason)


def _recognized(
    block: ReplayBlock,
    site: Site,
    phase: str | None,
    phases: Phases,
    shapes: ShapeInference,
    before: bool,
    free_site: Site | None,
    casts: frozenset[int],
) -> tuple[str, str] | None:
    """What a trainer calls a block the plain phase rules leave as activations,
    parameters or other: checkpointing, communication, attention scores, autocast's
    weight copies, and an earlier step's optimizer state."""
    if site.checkpoint:
        return CHECKPOINT, "made under torch.utils.checkpoint (saved inputs or a recomputation)"
    if site.collective_buffer or (site.collective and _COLLECTIVE_OP.search(site.collective)):
        return COMMUNICATION, f"made by {site.collective} (a gradient bucket or collective buffer)"
    if before:
        if free_site is not None and free_site.optimizer:
            return OPTIMIZER, (
                "an earlier step's optimizer state: alive before the trace, freed under the "
                "optimizer's step"
            )
        if block.free_pos is not None and phases.phase_near(block.free_pos) == "optimizer":
            return OPTIMIZER, (
                "an earlier step's optimizer state: alive before the trace, freed among the "
                "optimizer step's allocations"
            )
        return None
    if phase != "forward":
        return None
    if site.attention and _attention_scores(block.size, site, shapes):
        return ATTENTION, f"made inside attention ({site.op or 'no op named'}): [B, h, S, S]"
    if site.autocast_cast and block.size in casts:
        return AUTOCAST, (
            "made by autocast's cast (at::autocast::cached_cast in its stack) at half a "
            "float32 parameter's bytes: its bfloat16 copy of a weight"
        )
    if block.size in casts and site.op is not None and "to" in site.op.lower():
        return AUTOCAST, (
            f"a forward {site.op} at half a float32 parameter's bytes: autocast's bfloat16 "
            "copy of a weight"
        )
    return None


def _attention_scores(size: int, site: Site, shapes: ShapeInference) -> bool:
    """[B, h, S, S]: with S known, a size of B·S² times a head count and itemsize; without
    it, only the softmax's own output (the one attention block that is surely scores)."""
    if shapes.seq and shapes.batch:
        square = shapes.seq * shapes.seq * shapes.batch
        return size % square == 0 and (size // square) % 2 == 0
    return bool(site.op) and "softmax" in (site.op or "").lower()


def _logits(
    block: ReplayBlock,
    site: Site,
    phase: str | None,
    phases: Phases,
    shapes: ShapeInference,
    before: bool,
) -> tuple[bool, str]:
    dtype = logits_fit(block.size, site, shapes)
    if dtype is None or site.optimizer or site.param_setup or site.autotune or site.zero_grad:
        return False, ""
    if is_int_op(site.op):
        return False, ""
    if site.label_shape is not None:
        return True, "memprobe's label records a [B, S, V] shape"
    if site.loss:
        return True, f"{dtype} [N, V] made on the logits path ({site.loss})"
    if is_matmul(site.op, site.node) and phase == "forward":
        return True, f"{dtype} [N, V] made by the matmul {site.op} in forward (the lm_head)"
    if is_copy(site.op) and phase == "forward" and not before:
        shifted = shapes.loss_tokens is not None and block.size in _rows_sizes(shapes, True)
        what = "the shifted copy logits[:, :-1].contiguous()" if shifted else "a copy of the logits"
        return True, f"{dtype} [N, V] made by {site.op} in forward ({what})"
    if is_opaque_generated(site.op, site.via) and phase == "forward":
        return True, f"{dtype} [N, V] allocated by torch.compile's generated forward (the lm_head)"
    if before or site.node is not None and is_matmul(site.op, None):
        return False, ""
    # Exactly [N, V], made and freed inside backward, no matmul: the logits' gradient.
    end = phases.backward_end.get(block.alloc_pos)
    freed_inside = end is not None and block.free_pos is not None and block.free_pos < end
    if phase == "backward" and freed_inside and not is_matmul(site.op, None):
        what = site.node or site.op or "no op recorded"
        return True, f"{dtype} [N, V] made and freed inside backward ({what})"
    return False, ""


def _category(
    block: ReplayBlock,
    site: Site,
    phase: str | None,
    phases: Phases,
    before: bool,
    trace_length: int,
) -> tuple[str, str]:
    if site.autotune:
        return OTHER, "triton autotuning buffer"
    if site.optimizer or phase == "optimizer":
        if site.zero_grad:
            return GRADIENTS, "made by zero_grad()"
        return OPTIMIZER, "made under the optimizer's step"
    if site.param_setup:
        return PARAMETERS, "made while building or moving a module"
    if before:
        if block.free_pos is None:
            if site.has_frames and phase == "backward":
                return GRADIENTS, "made in backward before the trace, still live"
            return PARAMETERS, "alive before the trace and to its end"
        if phases.backward_end and _in_backward(block.free_pos, phases):
            return ACTIVATIONS, "made before the trace, freed in backward (saved for it)"
        return OTHER, "made before the trace (its allocation was not recorded)"
    if phase == "backward":
        end = phases.backward_end.get(block.alloc_pos, trace_length)
        if block.free_pos is None or block.free_pos >= end:
            return GRADIENTS, "made in backward and still live after it"
        return BACKWARD_TEMP, "made and freed inside backward"
    if phase == "forward":
        if block.alloc_pos <= 0 and block.free_pos is None:
            return PARAMETERS, "alive for the whole trace"
        if block.free_pos is None and any(f.name == "__init__" for f in site.chain):
            return PARAMETERS, "made in a constructor (__init__) and alive to the end"
        return ACTIVATIONS, "made in forward"
    if phase == "setup":
        # A memprobe hidden-family step's inputs: the lm_head weight and the hidden states.
        if site.op == "input:_weight":
            return PARAMETERS, "the lm_head weight, an input of memprobe's step"
        if site.op == "input:_hidden":
            return ACTIVATIONS, "the hidden states, an input of memprobe's step"
        return OTHER, "made while setting up the step"
    return OTHER, "no phase known"


def _in_backward(pos: int, phases: Phases) -> bool:
    """Whether trace position ``pos`` lies inside one of the backward passes."""
    starts = phases.backward_starts
    if not starts:
        return False
    i = bisect.bisect_right(starts, pos) - 1
    return i >= 0 and pos < phases.backward_end[starts[i]]
