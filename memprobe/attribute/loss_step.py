"""Where a snapshot's loss step lies in its trace: the cut --what-if replaces.

The step runs from the logits' consumer in forward (the first block the loss makes
from the lm_head's output) to the logits' gradient in backward. Where it cannot be
cut cleanly (no loss found, a fused loss, several loss steps, a trace that ends inside
the step, a shape inferred with low confidence) :class:`memprobe.errors.UserError`
says so: a guess is never shown as a prediction.
"""

from __future__ import annotations

import bisect
from typing import Any

from memprobe.allocator.snapshot_format import (
    ALLOC,
)
from memprobe.attribute.findings import Findings, attribute, devices_with_data
from memprobe.attribute.loss_step_record import LossStep, refuse_an_oom_inside
from memprobe.attribute.ops import is_matmul, is_opaque_generated
from memprobe.attribute.own_kernel_step import own_kernel_step
from memprobe.attribute.shape_records import NO_STACKS
from memprobe.attribute.sites import SiteCache, resolve_phases
from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes
from memprobe.records import normalize_dtype
from memprobe.snapshot.replay import BEFORE_TRACE, Replay, replay

_CONFIDENT = ("given", "high", "medium")


def locate_loss_step(
    snap: dict[str, Any],
    found: Findings,
    *,
    device: int | None = None,
    path: str | None = None,
    vocab: int | None = None,
    tokens: int | None = None,
    batch: int | None = None,
) -> tuple[Findings, Replay, LossStep]:
    """The findings, replay and loss step of ``found``'s device (``attribute``'s reading
    of ``device``, or of the device it picks), else, with no ``device`` asked for, of the
    first other device with a trace whose loss step is found. One process may drive
    several GPUs (a model spread over them with ``device_map="auto"``, pipeline stages):
    the loss is on one of them, not necessarily the one with the longest trace, and the
    file was read as "no loss in the snapshot". Raises ``found``'s UserError when no
    device has a loss step."""
    rep = replay(snap, device=found.device)
    try:
        return found, rep, find_loss_step(snap, found, rep)
    except UserError:
        if device is not None:
            raise
        for other in devices_with_data(snap):
            if other == found.device:
                continue
            try:
                there = attribute(
                    snap, device=other, path=path, vocab=vocab, tokens=tokens, batch=batch
                )
                other_rep = replay(snap, device=other)
                return there, other_rep, find_loss_step(snap, there, other_rep)
            except UserError:
                continue
        raise


def find_loss_step(
    snap: dict[str, Any],
    found: Findings,
    rep: Replay,
) -> LossStep:
    """Where the loss step is, or a UserError saying why it cannot be cut cleanly."""
    if found.source != "trace":
        raise UserError(
            "the snapshot has no trace: the loss step cannot be found in it",
            "record it with torch.cuda.memory._record_memory_history() (or memprobe profile)",
        )
    try:
        return _materialized_step(found, rep)
    except UserError:
        if found.inference.shards or found.inference.per_rank:
            raise
        # A step made with one of memprobe's own kernels (chunked: no [N, V] float32
        # blocks) is found by its frames instead.
        sites = SiteCache()
        own = own_kernel_step(found, rep, sites, resolve_phases(rep.entries, sites))
        if own is None:
            raise
        return own


def _materialized_step(found: Findings, rep: Replay) -> LossStep:
    """The loss step from the logits family: [N, V] blocks in forward and backward."""
    shapes = found.inference
    if not shapes.logits_path and any(NO_STACKS in why for why in shapes.evidence):
        raise UserError(f"no loss step can be found: {NO_STACKS}")
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
    refuse_an_oom_inside(rep, bs, gradient, "the loss step")
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
    shift = 0
    if shapes.loss_tokens:
        # The lm_head's output has B·S rows and the loss B·(S − 1): a slice's copy in
        # forward, the slice's backward making the [B, S, V] gradient.
        if shapes.loss_tokens != rows - batch:
            raise UserError(
                f"the loss's rows ({shapes.loss_tokens:,}) are not B·(S − 1) of the logits "
                f"{shapes.shape_text()}: the shifted loss cannot be cut",
                "give the shape with --vocab, --tokens and --batch",
            )
        shift = 1
    # The shifted targets are int64 [B, S − 1]: a block of exactly that size in the
    # forward window is the user's copy of them, not the loss's.
    targets_bytes = 8 * (rows - batch)
    copies_targets = shift == 1 and any(
        fs <= b.alloc_pos <= fe
        and b.size == targets_bytes
        and (sites.site(b.alloc_entry).label_dtype or "int64") == "int64"
        for b in cut
        if b.alloc_entry is not None
    )
    copy_sizes = {(rows - batch) * v * k for k in (2, 4)}
    holds_copy = shift == 1 and any(
        fs <= b.alloc_pos <= fe
        and b.size in copy_sizes
        and (b.free_pos is None or not (fs <= b.free_pos <= be))
        for b in cut
    )
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
        shift=shift,
        copies_targets=copies_targets,
        holds_copy=holds_copy,
    )
