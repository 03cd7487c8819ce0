"""What the rest of a step holds beside its logprob step: ``plan --other-from``'s reading."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memprobe.attribute.findings import attribute
from memprobe.attribute.loss_step import locate_loss_step
from memprobe.snapshot.load import normalize_snapshot


@dataclass(frozen=True)
class OtherMemory:
    """What the rest of the step held while its logprob step ran: one snapshot's reading."""

    tokens: int  # N = B·S of the loss step
    other_bytes: int  # the most live bytes that were neither the logits nor the step's own
    at_index: int  # the trace entry where that was
    vocab: int = 0  # V of the loss step's logits (0: not read)


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
    _, rep, step = locate_loss_step(snap, found, device=device, path=path)
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
    return OtherMemory(step.batch * step.rows, most, at, step.vocab)
