"""Top-k / top-p filtered log-probabilities, chunked over S and recomputed in backward.

The same distribution as :mod:`memprobe.kernels.filtered` (renormalised over
the kept set, -inf for a target outside it, top-k then top-p), in the memory
of :mod:`memprobe.kernels.local_chunked`. Forward saves the logits, the targets
and three numbers per token, which describe the kept set exactly:

* ``tau``: the smallest kept logit. Every logit above it is kept, every logit
  below it dropped;
* ``cut``: of the logits equal to ``tau``, those at vocabulary index
  ``<= cut`` are kept (``V - 1`` when all are). Top-p can stop inside a run of
  equal logits; ``filtered`` sorts stably, so it keeps such ties in vocabulary
  order, and so does this kernel. Where p is crossed is decided on the exact
  integer masses both kernels share (:func:`~memprobe.kernels.filtered.top_p_masses`),
  so no summation order can move it;
* ``logsum``: ``log Σ_kept exp(x - max)``, the row max recomputed in backward.

Work per chunk of ``c`` positions. Backward: one float32 ``[B, c, V]`` copy of
the logits and no selection at all: the kept set is ``x > tau`` or ``x == tau``
at index ``<= cut``. The gradient, in the logits' dtype, is that of
``filtered``: ``(onehot_t · kept_t - softmax_kept) · grad_output``, zero on
every dropped logit. For 16-bit logits it takes cheap vectorised passes over
``x - tau`` (:func:`_kept_softmax_16bit`: no mask, no -inf into exp, whose cpu
path is 8x slower on it); float32 logits keep filtered's exact shifts and a
bool ``[B, c, V]`` mask. Forward: the selection of
:mod:`~memprobe.kernels.filtered_select`, on the chunk's float32 copy: with
``top_k``, one ``topk`` of ``k + 32`` logits (top-p then runs on the list);
top-p alone, in blocks of 64 rows or more (the float32 copy too, whatever
the chunk) on one thread, a histogram of the integer masses and a stable sort of
the one bucket's logits where they cross p (picked out by a mask, gathered in
numpy), 21 bytes per element of the block in buffers reused by every block.
The forward has no gradient beside it, so its peak stays under the backward's
at the headline shape (20,000 × 131,072 bf16, chunk 1024).

Ties at the cut are rare in float32 logits and common in bf16 ones (at top-p
0.9 over a bf16 vocabulary nearly every row splits a run). ``cut`` is ``V - 1``
unless the run is split. Both selections read the cut from their lists'
indices; backward drops a split row's later ties with one threshold (or,
float32, one comparison) of that row's tail. Rows a list cannot settle are
redone alone, and a meta simulation, which has no values, skips them: top-k's
whose run of logits equal to the k-th goes past the list, by a count over the
row (a bool row, under the chunk's float32 list when ``4 · c · (k + 32) >= V``)
and a look-up of its ties in a preallocated bool row; the histogram's (a bucket
over the list's 512, or no mass), by a sort of the row, after the block's lists
are freed: a block's lists hold at least V logits, and their ~40 bytes each
cover the sort's per vocabulary entry.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from memprobe.kernels._checks import check_chunk_size, check_logprob_inputs, no_grad_wanted
from memprobe.kernels._steps import block_starts
from memprobe.kernels.filtered import check_filters
from memprobe.kernels.filtered_select import (
    TopPBuffers,
    one_thread,
    select_rows,
    select_top_k,
    select_top_p,
)
from memprobe.kernels.local_chunked import _row_max

DEFAULT_FILTERED_CHUNK_SIZE = 1024


def _active(top_k: int | None, top_p: float | None, vocab: int) -> tuple[int | None, float | None]:
    """The filters that remove something: top_k >= V and top_p == 1 keep every token."""
    k = int(top_k) if top_k is not None and int(top_k) < vocab else None
    p = float(top_p) if top_p is not None and float(top_p) < 1.0 else None
    return k, p


def _resolve_chunk(chunk_size: int | None) -> int:
    check_chunk_size(chunk_size)
    return DEFAULT_FILTERED_CHUNK_SIZE if chunk_size is None else int(chunk_size)


def _kept_target(
    x_t: torch.Tensor, tau: torch.Tensor, cut: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    return (x_t > tau) | ((x_t == tau) & (index <= cut))


def _forward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    top_k: int | None,
    top_p: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target log-probs, tau, cut, logsum), each ``[B, S]``."""
    batch, seq, vocab = logits.shape
    out = logits.new_empty((batch, seq), dtype=torch.float32)
    tau = logits.new_empty((batch, seq), dtype=torch.float32)
    cut = logits.new_empty((batch, seq), dtype=torch.long)
    logsum = logits.new_empty((batch, seq), dtype=torch.float32)
    index = targets.long()
    # One bool row for the tie look-ups, allocated on every device alike.
    scratch = torch.empty(vocab, dtype=torch.bool, device=logits.device)
    bufs = None
    threads: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if top_k is None and top_p is not None:
        # Top-p alone works in the selection's blocks of rows, on one thread, the
        # float32 copy too (fewer fresh pages; see filtered_select.one_thread).
        chunk = select_rows(min(chunk, seq), vocab)
        bufs = TopPBuffers(batch, chunk, vocab, logits.device)
        threads = one_thread(logits.device)
    work = logits.new_empty((batch, min(chunk, seq), vocab), dtype=torch.float32)
    with threads:
        for start in block_starts(seq, chunk, logits):
            end = min(start + chunk, seq)
            x = work[:, : end - start]
            x.copy_(logits[:, start:end])
            m = _row_max(x)
            x_t = x.gather(-1, index[:, start:end].unsqueeze(-1)).squeeze(-1)
            if bufs is not None:
                assert top_p is not None
                chunk_tau, chunk_logsum, chunk_cut = select_top_p(x, m, top_p, bufs)
            elif top_k is not None:
                chunk_tau, chunk_logsum, chunk_cut = select_top_k(x, m, top_k, top_p, scratch)
            else:
                chunk_tau = x.new_full(m.shape[:-1], float("-inf"))
                chunk_cut = torch.full(m.shape[:-1], vocab - 1, dtype=torch.long, device=x.device)
                # logsumexp by hand, in place, as local_chunked does.
                chunk_logsum = x.sub_(m).exp_().sum(dim=-1).log_()
            kept = _kept_target(x_t, chunk_tau, chunk_cut, index[:, start:end])
            shifted = x_t - m.squeeze(-1)
            # A dropped target's -inf, except in a row holding NaN or +inf (max not below
            # inf): NaN there, as filtered and local_chunked answer, not a plausible -inf.
            dropped = torch.where(m.squeeze(-1) < float("inf"), float("-inf"), float("nan"))
            out[:, start:end] = torch.where(kept, shifted - chunk_logsum, dropped)
            tau[:, start:end] = chunk_tau
            cut[:, start:end] = chunk_cut
            logsum[:, start:end] = chunk_logsum
    return out, tau, cut, logsum


def _backward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    tau: torch.Tensor,
    cut: torch.Tensor,
    logsum: torch.Tensor,
    grad_output: torch.Tensor,
    chunk: int,
    filtered: bool,
) -> torch.Tensor:
    """d(logprob)/d(logits) · grad_output, chunk by chunk, in the logits' dtype;
    ``filtered`` false when no filter removes anything (tau is -inf)."""
    seq, vocab = logits.shape[1], logits.shape[2]
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    index = targets.long()
    grad_output = grad_output.float()
    # One float32 chunk for every chunk (see TopPBuffers: page faults cost more than
    # a pass), and one bool row for the tie fix-ups, allocated on every device alike.
    buffer = logits.new_empty((logits.shape[0], min(chunk, seq), vocab), dtype=torch.float32)
    scratch = torch.empty(vocab, dtype=torch.bool, device=logits.device)
    for start in block_starts(seq, chunk, logits):
        end = min(start + chunk, seq)
        work = buffer[:, : end - start]
        work.copy_(logits[:, start:end])
        t = tau[:, start:end]
        c = cut[:, start:end]
        idx = index[:, start:end].unsqueeze(-1)
        x_t = work.gather(-1, idx).squeeze(-1)
        g = grad_output[:, start:end] * _kept_target(x_t, t, c, index[:, start:end])
        m = _row_max(work)
        if not filtered:
            work.sub_(m).sub_(logsum[:, start:end].unsqueeze(-1)).exp_()
        elif logits.element_size() == 2:
            _kept_softmax_16bit(work, m, t, c, logsum[:, start:end])
        else:
            _kept_softmax_exact(work, m, t, c, logsum[:, start:end], scratch)
        work.mul_(grad_output[:, start:end].unsqueeze(-1).neg())
        work.scatter_add_(-1, idx, g.unsqueeze(-1))
        grad[:, start:end].copy_(work)
    return grad


def _kept_softmax_exact(
    work: torch.Tensor,
    m: torch.Tensor,
    tau: torch.Tensor,
    cut: torch.Tensor,
    logsum: torch.Tensor,
    scratch: torch.Tensor,
) -> None:
    """``exp((x - max) - logsum)`` on the kept logits, 0 on the dropped, in place:
    the shifts of filtered's float32 log_softmax, the dropped masked to -inf."""
    _drop_split_ties(work, tau, cut, scratch)
    drop = work < tau.unsqueeze(-1)
    work.sub_(m).sub_(logsum.unsqueeze(-1))
    work.masked_fill_(drop, float("-inf"))
    del drop
    work.exp_()


# The 16-bit path's arguments of exp are clamped here: exp's vectorised cpu path
# takes a slow scalar one on -inf or an underflowing argument (8x on a bf16 chunk
# with top-p's 40% dropped). exp(-87) is a normal float32; anything at most a hair
# above it is then zeroed (a kept softmax that small has a gradient below 2e-38).
_LOWEST_ARG = -87.0
_ZERO_AT_OR_BELOW = math.exp(_LOWEST_ARG) * 1.001
# y > -FLT_MIN iff y >= 0, but for a y in (-FLT_MIN, 0), which needs distinct logits
# within 1.2e-38 of each other (so both below ~1e-31). A normal float, not the
# nearest subnormal: with torch.set_flush_denormal(True) that one reads as -0.
_BELOW_ZERO = -torch.finfo(torch.float32).tiny


def _kept_softmax_16bit(
    work: torch.Tensor, m: torch.Tensor, tau: torch.Tensor, cut: torch.Tensor, logsum: torch.Tensor
) -> None:
    """As :func:`_kept_softmax_exact`, in cheap vectorised passes (no bool mask, no
    masked_fill, no -inf into exp) for 16-bit logits: ``y = x - tau`` has the
    exact sign of ``x - tau`` (0 on a tie), a scalar threshold drops ``y < 0``, and
    ``y + ((tau - max) - logsum)`` differs from ``(x - max) - logsum`` by float32
    roundings far below the 16-bit rounding of the gradient (both shifts are
    exact for 16-bit values less than 2^16 apart)."""
    # A row of -inf logits has tau -inf: the lowest finite float keeps it nan-free.
    tau = tau.clamp(min=torch.finfo(torch.float32).min)
    work.sub_(tau.unsqueeze(-1))
    torch.nn.functional.threshold(work, _BELOW_ZERO, float("-inf"), inplace=True)
    _drop_split_tail_ties(work, cut)
    work.add_(((tau - m.squeeze(-1)) - logsum).unsqueeze(-1))
    work.clamp_(min=_LOWEST_ARG).exp_()
    torch.nn.functional.threshold(work, _ZERO_AT_OR_BELOW, 0.0, inplace=True)


def _drop_split_tail_ties(shifted: torch.Tensor, cut: torch.Tensor) -> None:
    """In ``x - tau`` after the scalar threshold, lower the ties (0) after ``cut``
    to -inf in the rows where top-p split their run: one threshold of each such
    row's tail (a meta simulation, which has no values, skips this)."""
    if shifted.device.type == "meta":
        return
    # On the host, in numpy: no torch allocation, so a real run's peak is meta's.
    cuts = cut.cpu().numpy()
    for b, s in zip(*(cuts < shifted.shape[-1] - 1).nonzero(), strict=True):
        tail = shifted[b, s, int(cuts[b, s]) + 1 :]
        torch.nn.functional.threshold(tail, 0.0, float("-inf"), inplace=True)


def _drop_split_ties(
    work: torch.Tensor, tau: torch.Tensor, cut: torch.Tensor, scratch: torch.Tensor
) -> None:
    """Lower the logits equal to tau after ``cut`` to -inf (they are dropped, and
    the row max, taken before, is unchanged) in the rows where top-p split their
    run: row by row in the preallocated ``scratch``, reading only each row's tail,
    so the memory is the same whatever the values (a meta simulation skips this)."""
    vocab = work.shape[-1]
    if work.device.type == "meta":
        return
    # Indexed per (b, s): a reshape of the last chunk's (strided) view would copy it.
    split = (cut < vocab - 1).nonzero()
    firsts = (cut[split[:, 0], split[:, 1]] + 1).tolist()
    values = tau[split[:, 0], split[:, 1]].tolist()
    for (b, s), first, value in zip(split.tolist(), firsts, values, strict=True):
        tail = scratch[: vocab - first]
        torch.eq(work[b, s, first:], value, out=tail)
        work[b, s, first:].masked_fill_(tail, float("-inf"))


class FilteredChunkedLogprob(torch.autograd.Function):
    """Top-k / top-p filtered target log-probs, chunked over S, recomputed in backward.

    ``FilteredChunkedLogprob.apply(logits, targets, chunk_size, top_k, top_p,
    inference_only)``. Saves the logits, the targets and tau, cut and logsum per
    token (see the module), or nothing when no gradient is needed.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        chunk_size: int | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        inference_only: bool = False,
    ) -> torch.Tensor:
        check_logprob_inputs(logits, targets)
        check_filters(top_k, top_p)
        chunk = _resolve_chunk(chunk_size)
        k, p = _active(top_k, top_p, logits.shape[-1])
        out, tau, cut, logsum = _forward(logits, targets, chunk, k, p)
        ctx.chunk = chunk
        ctx.filtered = k is not None or p is not None
        ctx.saved_nothing = inference_only or not ctx.needs_input_grad[0]
        if not ctx.saved_nothing:
            ctx.save_for_backward(logits, targets, tau, cut, logsum)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        if ctx.saved_nothing:
            raise RuntimeError(
                "FilteredChunkedLogprob ran with inference_only=True (or without grad) "
                "and saved nothing: run it again with gradients enabled"
            )
        logits, targets, tau, cut, logsum = ctx.saved_tensors
        grad = _backward(logits, targets, tau, cut, logsum, grad_output, ctx.chunk, ctx.filtered)
        return grad, None, None, None, None, None


def filtered_chunked_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """:class:`FilteredChunkedLogprob`: ``filtered``'s log-probs in ``local_chunked``'s memory.

    ``chunk_size=None`` means 1024.
    """
    return FilteredChunkedLogprob.apply(
        logits, targets, chunk_size, top_k, top_p, no_grad_wanted(logits, targets)
    )
