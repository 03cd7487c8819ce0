"""Vocabulary-parallel (tensor-parallel) target log-probabilities on torch.distributed.

Each rank of a process group holds the logits ``[B, S, V_local]`` for the
vocabulary ids ``[vocab_start, vocab_end)``; the targets ``[B, S]`` are
global ids and the same on every rank. Every rank returns the same float32
``[B, S]`` target log-probs and, in backward, the gradient of its own shard.

Two kernels:

* :class:`DistributedLogprob` — the memory-hungry reference: the whole shard
  is cast to float32, the log-softmax is distributed with three all_reduces
  (MAX of the row max, SUM of the sum of exps, SUM of the target logit), and
  the float32 softmax ``[B, S, V_local]`` is saved for backward.
* :class:`ChunkedDistributedLogprob` — the same math chunk by chunk over S,
  saving only its inputs and one float32 logsumexp per token, recomputing in
  backward. It batches its communication: each chunk first reduces its own
  rows locally, and after the loop two all_reduces over ``[B, S]``-sized
  statistics finish the job (MAX of the local row max, then one SUM of the
  rescaled sum of exps stacked with the target logit and an ownership flag).
  The collective count is therefore independent of the chunk size, and the
  messages are per-token (tiny) instead of one latency-bound round per chunk.

Backward of both needs no collective: ``d logprob / d logits = onehot - softmax``
is local to each shard once the global logsumexp is known.

The kernels never create or tear down process groups; the caller passes one
(or initialises the default group). They run unchanged on ``meta`` tensors
under torch's fake process group, which is how memprobe simulates per-rank
memory on one machine.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from memprobe.kernels._checks import carries_values, check_chunk_size, check_logprob_shapes
from memprobe.kernels._steps import block_starts
from memprobe.kernels.local_chunked import DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE

__all__ = [
    "ChunkedDistributedLogprob",
    "DistributedLogprob",
    "chunked_distributed_collectives",
    "chunked_distributed_logprobs",
    "distributed_collectives",
    "distributed_logprobs",
]


# --------------------------------------------------------------------------
# Collective counts (the sweep reports them as a column)
# --------------------------------------------------------------------------


def distributed_collectives(num_tokens: int, chunk_size: int | None = None) -> tuple[int, int]:
    """``(forward, backward)`` all_reduces of one :class:`DistributedLogprob` pass.

    Three in forward (row max, sum of exps, target logit), none in backward.
    ``num_tokens`` is ``B * S``; with no tokens nothing is communicated.
    ``chunk_size`` is accepted for a uniform signature and ignored.
    """
    return (3, 0) if num_tokens > 0 else (0, 0)


def chunked_distributed_collectives(
    num_tokens: int, chunk_size: int | None = None
) -> tuple[int, int]:
    """``(forward, backward)`` all_reduces of one :class:`ChunkedDistributedLogprob` pass.

    Two in forward whatever the number of chunks ``ceil(S / chunk_size)``:
    the per-chunk statistics are reduced locally first and communicated once
    (MAX, then one stacked SUM). None in backward. ``num_tokens`` is ``B * S``.
    """
    check_chunk_size(chunk_size)
    return (2, 0) if num_tokens > 0 else (0, 0)


# --------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------


def _check_shard_inputs(
    logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, vocab_end: int
) -> None:
    """Shape and range checks that need no communication.

    The local range check can only reject negative ids; an id past the global
    vocabulary is caught after the forward all_reduce (no rank owns it).
    """
    check_logprob_shapes(logits, targets, vocab_name="V_local")
    local_vocab = logits.shape[-1]
    if vocab_start < 0 or vocab_end - vocab_start != local_vocab:
        raise ValueError(
            f"vocabulary range [{vocab_start}, {vocab_end}) does not match the shard's "
            f"{local_vocab} columns"
        )
    if targets.numel() and carries_values(targets) and int(targets.min()) < 0:
        raise ValueError(f"targets must be non-negative token ids, found {int(targets.min())}")


def _local_index(
    targets: torch.Tensor, vocab_start: int, vocab_end: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(index into this shard, owned)``; unowned tokens point at column 0.

    Both are ``[B, n]`` (per token, never per vocabulary entry).
    """
    owned = (targets >= vocab_start) & (targets < vocab_end)
    index = (targets.long() - vocab_start).masked_fill_(~owned, 0)
    return index, owned


def _all_reduce(buffer: torch.Tensor, op: Any, group: Any) -> None:
    """``dist.all_reduce``, returning once the backend has let go of ``buffer`` too.

    gloo's worker thread drops its reference to the buffer it reduced just after the call
    returns: a buffer the kernel frees soon after was then freed by that thread, before or
    after the kernel's next allocation, so a real CPU run's peak read one ``[B, S]`` float32
    block more in some runs (1,024 B apart at 256 tokens). Waiting makes each free its own.
    """
    held = _holders(buffer)
    dist.all_reduce(buffer, op=op, group=group)
    if not _communicates_values(group, buffer):
        return
    deadline = time.monotonic() + 5.0  # a backend that keeps it longer keeps it
    while _holders(buffer) > held and time.monotonic() < deadline:
        time.sleep(0)


def _holders(tensor: torch.Tensor) -> int:
    """How many references hold ``tensor``'s C++ object (this process's own and a backend's)."""
    return int(tensor._use_count())  # type: ignore[attr-defined]  # not in torch's stubs


def _communicates_values(group: Any, tensor: torch.Tensor) -> bool:
    """False when reduced values are meaningless: meta tensors or the fake backend."""
    if tensor.device.type == "meta":
        return False
    return dist.get_backend(group) != "fake"


def _check_owned_once(owner_count: torch.Tensor) -> None:
    """After the SUM all_reduce every token must be owned by exactly one rank.

    Every rank sees the same reduced counts, so every rank raises together
    instead of one rank raising while the others wait in a collective.
    """
    if owner_count.numel() and not bool((owner_count == 1).all()):
        raise ValueError(
            "some target ids are owned by no rank (id past the global vocabulary) "
            "or by several (overlapping vocabulary ranges)"
        )


def _resolve_chunk(chunk_size: int | None) -> int:
    check_chunk_size(chunk_size)
    return DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE if chunk_size is None else int(chunk_size)


# --------------------------------------------------------------------------
# The reference: whole shard in float32, softmax saved
# --------------------------------------------------------------------------


class DistributedLogprob(torch.autograd.Function):
    """Vocabulary-parallel target log-probs, unchunked: the memory-hungry reference.

    ``DistributedLogprob.apply(vocab_parallel_logits, targets, vocab_start,
    vocab_end, group, inference_only=False)`` → float32 ``[B, S]``.

    Forward casts the whole shard to float32 and, unless ``inference_only``
    or no gradient is needed, saves the float32 softmax ``[B, S, V_local]``
    plus a per-token shard index and ownership mask. Collectives: 3 all_reduces
    in forward, none in backward. The gradient has the logits' dtype.
    """

    @staticmethod
    def forward(
        ctx: Any,
        vocab_parallel_logits: torch.Tensor,
        targets: torch.Tensor,
        vocab_start: int,
        vocab_end: int,
        group: Any,
        inference_only: bool = False,
    ) -> torch.Tensor:
        logits = vocab_parallel_logits
        _check_shard_inputs(logits, targets, vocab_start, vocab_end)
        ctx.logits_dtype = logits.dtype
        ctx.saved_nothing = inference_only or not ctx.needs_input_grad[0]
        batch, seq, _ = logits.shape
        index, owned = _local_index(targets, vocab_start, vocab_end)
        if batch * seq == 0:
            # Every rank has the same [B, S], so every rank skips the collectives.
            if not ctx.saved_nothing:
                ctx.save_for_backward(torch.empty_like(logits, dtype=torch.float32), index, owned)
            return logits.new_zeros((batch, seq), dtype=torch.float32)

        # ``.float()`` may return the input itself (float32 logits): nothing
        # below writes into ``x``.
        x = logits.float()
        row_max = x.amax(dim=-1, keepdim=True)
        _all_reduce(row_max, dist.ReduceOp.MAX, group)
        shifted = x - row_max
        del x
        # Target logit (shifted) and ownership, reduced together: one SUM.
        picked = torch.stack(
            [
                shifted.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(~owned, 0.0),
                owned.to(torch.float32),
            ]
        )
        softmax = shifted.exp_()
        sum_exp = softmax.sum(dim=-1, keepdim=True)
        _all_reduce(sum_exp, dist.ReduceOp.SUM, group)
        _all_reduce(picked, dist.ReduceOp.SUM, group)
        if _communicates_values(group, logits):
            _check_owned_once(picked[1])
        out = picked[0] - sum_exp.squeeze(-1).log()
        if not ctx.saved_nothing:
            softmax.div_(sum_exp)
            ctx.save_for_backward(softmax, index, owned)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        if ctx.saved_nothing:
            raise RuntimeError(
                "DistributedLogprob ran with inference_only=True (or without grad) "
                "and saved nothing: run it again with gradients enabled"
            )
        softmax, index, owned = ctx.saved_tensors
        g = grad_output.float()
        # Out of place so the saved softmax survives a retain_graph backward.
        grad = softmax.mul(g.neg().unsqueeze(-1))
        grad.scatter_add_(-1, index.unsqueeze(-1), (g * owned).unsqueeze(-1))
        return grad.to(ctx.logits_dtype), None, None, None, None, None


# --------------------------------------------------------------------------
# The chunked kernel: inputs saved, recomputed per chunk
# --------------------------------------------------------------------------


def _chunk_float32(logits: torch.Tensor, start: int, end: int) -> torch.Tensor:
    # copy=True: ``.float()`` on float32 logits would alias the input, and the
    # chunk is updated in place below.
    return logits[:, start:end].to(dtype=torch.float32, copy=True)


def _row_shift(row_max: torch.Tensor) -> torch.Tensor:
    """The row max, clamped in place to the lowest finite float32.

    A row whose shard is all -inf has max -inf; shifting by it would give
    -inf - (-inf) = nan, while the lowest finite shift keeps its exps at 0.
    In place and deterministic: backward recomputes the forward's shift
    exactly, without allocating more than the max itself.
    """
    return row_max.clamp_(min=torch.finfo(torch.float32).min)


def _chunked_distributed_forward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    vocab_start: int,
    vocab_end: int,
    chunk: int,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (target log-probs, local log-sum), both float32 ``[B, S]``.

    The local log-sum is the global logsumexp minus this rank's own row
    shift (its finite row max, recomputed exactly in backward):
    ``log Σ_global exp(x - global_shift) + (global_shift - local_shift)``.
    Every term stays at the scale of the log-sum, never at the scale of the
    logits: adding the max back (``lse = max + log Σ``) and subtracting it
    again would round at an ulp of the logits (1e-3 at 1e4 in float32).
    """
    batch, seq, _ = logits.shape
    local_max = logits.new_empty((batch, seq), dtype=torch.float32)
    # Rows: sum of exp(x - local shift), target logit minus local shift (0 if
    # not owned), owned.
    stats = logits.new_empty((3, batch, seq), dtype=torch.float32)
    # On meta only the blocks that shape the peak (see block_starts): exact, and a
    # simulation at 2^31 tokens costs what one at 2^12 does.
    for start in block_starts(seq, chunk, logits):
        end = min(start + chunk, seq)
        index, owned = _local_index(targets[:, start:end], vocab_start, vocab_end)
        work = _chunk_float32(logits, start, end)
        row_max = _row_shift(work.amax(dim=-1))
        local_max[:, start:end] = row_max
        # Local sum of exps, in place: torch.logsumexp would allocate two more
        # float32 chunks (x - max and its exp).
        work.sub_(row_max.unsqueeze(-1))
        picked = work.gather(-1, index.unsqueeze(-1)).squeeze(-1)
        stats[1, :, start:end] = picked.masked_fill_(~owned, 0.0)
        stats[2, :, start:end] = owned
        stats[0, :, start:end] = work.exp_().sum(dim=-1)
        del work

    global_max = local_max.clone()
    _all_reduce(global_max, dist.ReduceOp.MAX, group)
    # local shift - global shift (<= 0): moves this rank's sum of exps and
    # its shifted target logit onto the global shift before they are summed.
    # Written over the reduced buffer (the same floats as local_max - global_max):
    # gloo's worker thread lets go of a buffer it reduced a moment after the call
    # returns, so a reduced buffer freed at once was sometimes still live for the
    # tracker, and a real CPU peak read one [B, S] float32 block more.
    to_global = global_max.neg_().add_(local_max)
    del local_max, global_max
    stats[0].mul_(to_global.exp())
    stats[1].addcmul_(to_global, stats[2])
    _all_reduce(stats, dist.ReduceOp.SUM, group)
    if _communicates_values(group, logits):
        _check_owned_once(stats[2])
    global_logsum = stats[0].log_()
    out = stats[1] - global_logsum
    local_logsum = global_logsum.sub_(to_global)
    return out, local_logsum


def _chunked_distributed_backward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    local_logsum: torch.Tensor,
    grad_output: torch.Tensor,
    vocab_start: int,
    vocab_end: int,
    chunk: int,
) -> torch.Tensor:
    """``(onehot_local - softmax) * grad_output`` in the logits' dtype, chunk by chunk."""
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    seq = logits.shape[1]
    grad_output = grad_output.float()
    # On meta only the blocks that shape the peak (see block_starts): exact, and a
    # simulation at 2^31 tokens costs what one at 2^12 does.
    for start in block_starts(seq, chunk, logits):
        end = min(start + chunk, seq)
        index, owned = _local_index(targets[:, start:end], vocab_start, vocab_end)
        g = grad_output[:, start:end]
        work = _chunk_float32(logits, start, end)
        # softmax = exp((x - local shift) - local log-sum): the local shift is
        # recomputed from this shard, so no communication is needed.
        work.sub_(_row_shift(work.amax(dim=-1, keepdim=True)))
        work.sub_(local_logsum[:, start:end].unsqueeze(-1))
        work.exp_().mul_(g.neg().unsqueeze(-1))
        work.scatter_add_(-1, index.unsqueeze(-1), (g * owned).unsqueeze(-1))
        grad[:, start:end].copy_(work)
        del work
    return grad


class ChunkedDistributedLogprob(torch.autograd.Function):
    """Vocabulary-parallel target log-probs, chunked over S and recomputed in backward.

    ``ChunkedDistributedLogprob.apply(vocab_parallel_logits, targets, vocab_start,
    vocab_end, chunk_size, group, inference_only=False)`` → float32 ``[B, S]``;
    ``chunk_size=None`` means 1024.

    Saved for backward: the logits shard (its own dtype, no copy), the targets,
    and a float32 per-token log-sum ``[B, S]`` (4·B·S bytes), the global
    logsumexp relative to this rank's row max, which backward recomputes. Nothing is
    saved when ``inference_only`` is true or no gradient is needed.

    Working set, forward and backward, per chunk ``c``: ONE float32
    ``[B, c, V_local]`` buffer updated in place, plus per-token tensors
    (``[B, c]`` shard index int64, ownership bool, row statistics float32).
    No int64 or bool tensor is ever ``[B, c, V_local]``-sized. Forward also
    holds five float32 ``[B, S]`` statistics (local and global row max, sum of
    exps, target logit, ownership), 20·B·S bytes. The backward peak is
    therefore logits + gradient (logits' dtype) + one float32 chunk.

    Collectives: 2 all_reduces in forward (independent of the number of
    chunks), none in backward; see :func:`chunked_distributed_collectives`.
    """

    @staticmethod
    def forward(
        ctx: Any,
        vocab_parallel_logits: torch.Tensor,
        targets: torch.Tensor,
        vocab_start: int,
        vocab_end: int,
        chunk_size: int | None,
        group: Any,
        inference_only: bool = False,
    ) -> torch.Tensor:
        logits = vocab_parallel_logits
        _check_shard_inputs(logits, targets, vocab_start, vocab_end)
        chunk = _resolve_chunk(chunk_size)
        ctx.chunk = chunk
        ctx.vocab_range = (vocab_start, vocab_end)
        ctx.saved_nothing = inference_only or not ctx.needs_input_grad[0]
        batch, seq, _ = logits.shape
        if batch * seq == 0:
            # Same [B, S] on every rank, so every rank skips the collectives.
            out = logits.new_zeros((batch, seq), dtype=torch.float32)
            local_logsum = out
        else:
            out, local_logsum = _chunked_distributed_forward(
                logits, targets, vocab_start, vocab_end, chunk, group
            )
        if not ctx.saved_nothing:
            ctx.save_for_backward(logits, targets, local_logsum)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        if ctx.saved_nothing:
            raise RuntimeError(
                "ChunkedDistributedLogprob ran with inference_only=True (or without grad) "
                "and saved nothing: run it again with gradients enabled"
            )
        logits, targets, local_logsum = ctx.saved_tensors
        vocab_start, vocab_end = ctx.vocab_range
        grad = _chunked_distributed_backward(
            logits, targets, local_logsum, grad_output, vocab_start, vocab_end, ctx.chunk
        )
        return grad, None, None, None, None, None, None


# --------------------------------------------------------------------------
# Plain functions with the registry's kernel signature
# --------------------------------------------------------------------------


def _resolve_group(
    logits: torch.Tensor, group: Any, vocab_start: int | None, vocab_end: int | None
) -> tuple[Any, int, int]:
    """The process group and this rank's vocabulary range.

    With no explicit range the vocabulary is split evenly in rank order:
    ``vocab_start = rank * V_local``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "distributed kernels need an initialised torch.distributed process group "
            "(run under torchrun, pass group=, or simulate with "
            "memprobe.measure.parallel.fake_process_group)"
        )
    if group is None:
        group = dist.group.WORLD
    local_vocab = logits.shape[-1] if isinstance(logits, torch.Tensor) and logits.dim() else 0
    if vocab_start is None and vocab_end is None:
        vocab_start = dist.get_rank(group) * local_vocab
    if vocab_start is None:
        assert vocab_end is not None
        vocab_start = vocab_end - local_vocab
    if vocab_end is None:
        vocab_end = vocab_start + local_vocab
    return group, int(vocab_start), int(vocab_end)


def _wants_grad(logits: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and isinstance(logits, torch.Tensor) and logits.requires_grad


def distributed_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    group: Any = None,
    vocab_start: int | None = None,
    vocab_end: int | None = None,
) -> torch.Tensor:
    """:class:`DistributedLogprob` on this rank's shard; ``chunk_size`` is ignored.

    ``group=None`` means the default process group; with no vocabulary range
    this rank holds ids ``[rank * V_local, (rank + 1) * V_local)``.
    """
    check_chunk_size(chunk_size)
    group, start, end = _resolve_group(logits, group, vocab_start, vocab_end)
    return DistributedLogprob.apply(logits, targets, start, end, group, not _wants_grad(logits))


def chunked_distributed_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    group: Any = None,
    vocab_start: int | None = None,
    vocab_end: int | None = None,
) -> torch.Tensor:
    """:class:`ChunkedDistributedLogprob` on this rank's shard; ``chunk_size=None`` means 1024.

    ``group=None`` means the default process group; with no vocabulary range
    this rank holds ids ``[rank * V_local, (rank + 1) * V_local)``.
    """
    check_chunk_size(chunk_size)
    group, start, end = _resolve_group(logits, group, vocab_start, vocab_end)
    return ChunkedDistributedLogprob.apply(
        logits, targets, start, end, chunk_size, group, not _wants_grad(logits)
    )
