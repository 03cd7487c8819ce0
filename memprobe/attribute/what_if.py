"""What-if: the same step with another logprob kernel, predicted from a recorded snapshot.

In a snapshot whose loss step materializes ``[N, V]`` blocks, the step is cut out of
the trace (from the logits' consumer in forward to the logits' gradient in backward),
KERNEL runs on meta at the inferred shape and dtype, and its blocks are spliced in
where the cut ones were; everything else stays as recorded. The spliced trace is then
read as any snapshot is: its peak allocated bytes (exact for the splice), what is
live there, and the reserved bytes memprobe's model of the caching allocator gives it.

This module is the facade; each concern has its own module:

- :mod:`memprobe.attribute.loss_step`: the cut (where the step lies, or why it cannot be cut),
  by the logits family, or for memprobe's own kernels by their frames
  (:mod:`memprobe.attribute.own_kernel_step`), as a :class:`LossStep`;
- :mod:`memprobe.attribute.kernel_trace`: KERNEL simulated on meta in a stand-in step;
- :mod:`memprobe.attribute.splice`: its blocks spliced in where the cut ones were;
- :mod:`memprobe.attribute.what_if_record`: the prediction as a record (JSON, text);
- :mod:`memprobe.attribute.other_memory`: what the rest of the step holds (``--other-from``).
"""

from __future__ import annotations

from typing import Any

from memprobe.allocator import replay_snapshot
from memprobe.attribute.findings import attribute, devices_with_data
from memprobe.attribute.kernel_trace import KernelTrace, simulate_kernel
from memprobe.attribute.loss_step import find_loss_step, locate_loss_step
from memprobe.attribute.loss_step_record import LossStep
from memprobe.attribute.other_memory import OtherMemory, other_memory
from memprobe.attribute.splice import SPLICE_ADDRESS, splice
from memprobe.attribute.what_if_record import UnmetRequest, WhatIf
from memprobe.errors import UserError
from memprobe.snapshot.load import normalize_snapshot
from memprobe.snapshot.replay import Replay, replay

__all__ = [
    "SPLICE_ADDRESS",
    "KernelTrace",
    "LossStep",
    "OtherMemory",
    "WhatIf",
    "check_what_if_kernel",
    "find_loss_step",
    "other_memory",
    "simulate_kernel",
    "splice",
    "what_if",
]


def check_what_if_kernel(kernel: str) -> None:
    """One line for a kernel --what-if cannot splice: unknown, or of the hidden family."""
    from memprobe.kernels import get_spec

    if "," in kernel:
        # The sweep and plan take lists; a prediction splices one kernel into the step.
        raise UserError(
            f"--what-if {kernel!r} names several kernels: a prediction swaps in one",
            "run one --what-if per kernel, e.g. --what-if "
            f"{next((k.strip() for k in kernel.split(',') if k.strip()), 'local_chunked')}",
        )
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
    from memprobe.kernels.peers import unavailable_reason

    if unavailable_reason(kernel, "meta") is not None:
        # The prediction splices a meta simulation in: a Triton peer failed there, and
        # the one line said to run a meta sweep "to see it" (which skips the kernel).
        raise UserError(
            f"{kernel} is a Triton kernel: its memory cannot be simulated on meta, where "
            "--what-if simulates the loss it swaps in",
            "name a kernel memprobe simulates (`memprobe kernels`), or measure it on a GPU: "
            f"memprobe sweep --device cuda --kernel {kernel}",
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
    first = attribute(snap, device=device, path=path, vocab=vocab, tokens=tokens, batch=batch)
    try:
        found, rep, step = locate_loss_step(
            snap, first, device=device, path=path, vocab=vocab, tokens=tokens, batch=batch
        )
    except UserError:
        _refuse_sizes_that_hide_the_loss(snap, device, path, vocab, tokens, batch)
        raise
    kt = simulate_kernel(kernel, step, chunk_size)
    spliced = splice(snap, found.device, step, kt)
    # The spliced trace is read at the shape the loss step was found at: the swapped-in
    # kernel leaves no softmax over [N, V] to infer it from, and re-inferring it there
    # called the logits the step still holds "forward activations".
    predicted = attribute(
        spliced,
        device=found.device,
        path=path,
        vocab=step.vocab,
        tokens=step.rows,
        batch=step.batch,
    )
    unmet = _unmet_request(rep, replay(spliced, device=found.device), step)
    model = {r.device: r for r in replay_snapshot(snap)}[found.device]
    modelled = {r.device: r for r in replay_snapshot(spliced)}[found.device]
    capacity, source = budget_bytes, "--budget" if budget_bytes is not None else None
    if capacity is None:
        capacity, source = _oom_capacity(rep)
    from memprobe.kernels import get_spec

    return WhatIf(
        kernel=kernel,
        shape=(step.batch, step.loss_rows, step.vocab),
        shifted=bool(step.shift),
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
        device=found.device if len(devices_with_data(snap)) > 1 else None,
        unmet=unmet,
    )


def _unmet_request(recorded: Replay, spliced: Replay, step: LossStep) -> UnmetRequest | None:
    """The recorded OOM outside the loss step that needs the most with the new kernel
    (allocated then, in the spliced trace, plus its request), else None. The splice keeps
    every OOM entry in order; one outside the step is a request the kernel does not change,
    and a prediction that left it out said "fits" for a step that failed there (the
    snapshot torch dumps at an OOM in the optimizer, the capacity read off that OOM)."""
    if len(recorded.ooms) != len(spliced.ooms):
        return None
    outside = [
        UnmetRequest(mine.pos, int(mine.entry["size"]), then.allocated_bytes)
        for mine, then in zip(recorded.ooms, spliced.ooms, strict=True)
        if not step.inside(mine.pos)
    ]
    return max(outside, key=lambda u: u.needed_bytes, default=None)


def _refuse_sizes_that_hide_the_loss(
    snap: dict[str, Any],
    device: int | None,
    path: str | None,
    vocab: int | None,
    tokens: int | None,
    batch: int | None,
) -> None:
    """When no loss step is found with the sizes given but one is without them, the sizes
    are the cause: the line blamed the loss ("no loss step with [N, V] blocks ... (a fused
    loss ...)") for a --vocab or --batch that was not the snapshot's. Returns otherwise."""
    given = [f"--{n} {v}" for n, v in (("vocab", vocab), ("tokens", tokens), ("batch", batch))
             if v is not None]  # fmt: skip
    if not given:
        return
    try:
        plain, _, _ = locate_loss_step(
            snap, attribute(snap, device=device, path=path), device=device, path=path
        )
    except UserError:
        return  # not the sizes: the loss itself is what cannot be cut
    one = len(given) == 1
    raise UserError(
        f"{' '.join(given)} {'does' if one else 'do'} not fit this snapshot: with "
        f"{'it' if one else 'them'} no loss step with [N, V] blocks in forward and backward "
        f"is found, without, its logits read as {plain.inference.shape_text()}",
        f"drop {'it' if one else 'them'}, or give the step's own sizes",
    ) from None


def _oom_capacity(rep: Replay) -> tuple[int | None, str | None]:
    """What the allocator could reach on the device, from the first recorded OOM."""
    for moment in rep.ooms:
        free = moment.entry.get("device_free")
        if isinstance(free, int) and moment.reserved_bytes is not None:
            return moment.reserved_bytes + free, "reserved + the device's free bytes at the OOM"
    return None, None
