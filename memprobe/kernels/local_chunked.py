"""Chunked log-probabilities that save only their inputs and recompute in backward.

Memory contract, for logits ``[B, S, V]`` and chunk ``c``:

* forward saves the logits (their own dtype, no copy), the targets, and one
  float32 log-sum per token (``[B, S]``, 4·B·S bytes): ``log Σ exp(x - max)``,
  kept apart from the row max, which backward recomputes exactly from the
  logits;
* each chunk, forward and backward, works in a single float32 ``[B, c, V]``
  buffer, updated in place, and uses no int64 ``[B, c, V]`` one-hot;
* backward writes ``(onehot - softmax) * grad_output`` chunk by chunk into a
  gradient of the logits' dtype: a new buffer, or the logits' own storage for
  the in-place variant.

So the backward peak is logits + gradient + one float32 chunk, and the
in-place variant reaches the floor of logits + one float32 chunk.

Precision: the max and the log-sum are never added. Forward returns
``(x_t - max) - logsum`` and backward exponentiates ``(x - max) - logsum``;
``x - (max + logsum)`` would round ``max + logsum`` at the magnitude of the
logits (an ulp of 1e4 in float32 is 1e-3) and lose the low bits of the log-sum.
"""

from __future__ import annotations

from typing import Any

import torch

from memprobe.kernels._checks import check_chunk_size, check_logprob_inputs, no_grad_wanted
from memprobe.kernels._steps import block_starts

DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE = 1024


def _resolve_chunk(chunk_size: int | None) -> int:
    check_chunk_size(chunk_size)
    return DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE if chunk_size is None else int(chunk_size)


def _chunk_float32(logits: torch.Tensor, start: int, end: int) -> torch.Tensor:
    # copy=True matters: ``.float()`` on float32 logits returns the same
    # storage, and the in-place math below would then corrupt the input.
    return logits[:, start:end].to(dtype=torch.float32, copy=True)


def _chunked_forward(
    logits: torch.Tensor, targets: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (target log-probs, log-sum ``log Σ exp(x - max)``), both float32 ``[B, S]``."""
    batch, seq, _ = logits.shape
    out = logits.new_empty((batch, seq), dtype=torch.float32)
    logsum = logits.new_empty((batch, seq), dtype=torch.float32)
    index = targets.long().unsqueeze(-1)
    for start in block_starts(seq, chunk, logits):
        end = min(start + chunk, seq)
        work = _chunk_float32(logits, start, end)
        # logsumexp by hand, in place: torch.logsumexp would allocate two
        # more float32 chunks (x - max and its exp).
        work.sub_(_row_max(work))
        # The target logit is read after the shift: x_t - max is exact-ish
        # and small, so subtracting the log-sum loses nothing.
        shifted_target = work.gather(-1, index[:, start:end]).squeeze(-1)
        chunk_logsum = work.exp_().sum(dim=-1).log_()
        logsum[:, start:end] = chunk_logsum
        out[:, start:end] = shifted_target - chunk_logsum
        del work
    return out, logsum


def _row_max(work: torch.Tensor) -> torch.Tensor:
    """Row max of a float32 chunk, ``[B, c, 1]``, never -inf.

    Deterministic, so backward recomputes exactly the shift forward used. A
    row of -inf would shift by -inf and give nan; clamping (in place, no
    allocation) to the lowest finite float keeps its exps at 0.
    """
    return work.amax(dim=-1, keepdim=True).clamp_(min=torch.finfo(torch.float32).min)


def _chunked_backward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logsum: torch.Tensor,
    grad_output: torch.Tensor,
    chunk: int,
    grad: torch.Tensor,
) -> torch.Tensor:
    """Write d(logprob)/d(logits) · grad_output into ``grad`` chunk by chunk."""
    seq = logits.shape[1]
    index = targets.long().unsqueeze(-1)
    grad_output = grad_output.float()
    for start in block_starts(seq, chunk, logits):
        end = min(start + chunk, seq)
        work = _chunk_float32(logits, start, end)
        g = grad_output[:, start:end].unsqueeze(-1)
        # softmax = exp((x - max) - logsum), the two shifts applied one after
        # the other (see the module docstring); gradient = (onehot - softmax) * g.
        work.sub_(_row_max(work)).sub_(logsum[:, start:end].unsqueeze(-1))
        work.exp_().mul_(g.neg())
        work.scatter_add_(-1, index[:, start:end], g)
        grad[:, start:end].copy_(work)
        del work
    return grad


class LocalChunkedLogprob(torch.autograd.Function):
    """Target log-probs of ``[B, S, V]`` logits, chunked over S, recomputed in backward.

    ``LocalChunkedLogprob.apply(logits, targets, chunk_size, inference_only)``.
    Saves the logits, the targets and the float32 per-token log-sum, or
    nothing when ``inference_only`` is true or no gradient is needed. The
    gradient has the logits' dtype.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        chunk_size: int | None = None,
        inference_only: bool = False,
    ) -> torch.Tensor:
        check_logprob_inputs(logits, targets)
        chunk = _resolve_chunk(chunk_size)
        out, logsum = _chunked_forward(logits, targets, chunk)
        ctx.chunk = chunk
        if inference_only or not ctx.needs_input_grad[0]:
            ctx.saved_nothing = True
        else:
            ctx.saved_nothing = False
            ctx.save_for_backward(logits, targets, logsum)
        return out

    @classmethod
    def _grad_buffer(cls, logits: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(logits, memory_format=torch.contiguous_format)

    @classmethod
    def backward(cls, ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        if ctx.saved_nothing:
            raise RuntimeError(
                "LocalChunkedLogprob ran with inference_only=True (or without grad) "
                "and saved nothing: run it again with gradients enabled"
            )
        logits, targets, logsum = ctx.saved_tensors
        grad = cls._grad_buffer(logits)
        _chunked_backward(logits, targets, logsum, grad_output, ctx.chunk, grad)
        return grad, None, None, None


class LocalChunkedInplaceLogprob(LocalChunkedLogprob):
    """As :class:`LocalChunkedLogprob`, but backward CONSUMES the logits.

    The gradient is written into the logits' own storage, so after backward
    the logits tensor holds the gradient, not the logits. Use it only when
    nothing reads the logits after the backward pass (the usual case when
    they come straight from an lm_head). Peak: logits + one float32 chunk.
    """

    @classmethod
    def _grad_buffer(cls, logits: torch.Tensor) -> torch.Tensor:
        # Every chunk is read (recomputed) before its slice is overwritten,
        # and chunks do not overlap, so writing in place is exact.
        return logits


def _apply(
    fn: type[LocalChunkedLogprob],
    logits: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int | None,
) -> torch.Tensor:
    return fn.apply(logits, targets, chunk_size, no_grad_wanted(logits, targets))


def local_chunked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """:class:`LocalChunkedLogprob`; ``chunk_size=None`` means 1024."""
    return _apply(LocalChunkedLogprob, logits, targets, chunk_size)


def local_chunked_inplace_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """:class:`LocalChunkedInplaceLogprob`: backward overwrites the logits with the gradient."""
    return _apply(LocalChunkedInplaceLogprob, logits, targets, chunk_size)
