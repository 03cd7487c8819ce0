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
bool ``[B, c, V]`` mask. Forward: with ``top_k``, one ``topk`` of ``k + 32``
logits (:func:`_select_top_k`; top-p then runs on the list); top-p alone, a
histogram of the chunk's integer masses and a ``topk`` of the one bucket where
they cross p (:func:`_select_top_p`), 25 bytes per element in buffers reused by
every chunk. The forward has no gradient beside it, so its peak stays under the
backward's at the headline shape (20,000 × 131,072 bf16, chunk 1024).

Ties at the cut are rare in float32 logits and common in bf16 ones (at top-p
0.9 over a bf16 vocabulary nearly every row splits a run). ``cut`` is ``V - 1``
unless the run is split. Top-p alone and top-k read the cut from their lists'
indices (:func:`_split_cut`); backward drops a split row's later ties with one
threshold (or, float32, one comparison) of that row's tail. Rows a list cannot
settle are redone alone, and a meta simulation, which has no values, skips
them: top-k's whose run of logits equal to the k-th goes past the list, by a
count over the row (:func:`_select_counting`: a bool row, under the chunk's
float32 list when ``4 · c · (k + 32) >= V``) and a look-up of its ties in a
preallocated bool row; the histogram's, by a sort of the row, whose ~40 bytes
per vocabulary entry stay under the chunk's bool mask, freed before it, for a
chunk of 40 positions or more.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from memprobe.kernels._checks import check_chunk_size, check_logprob_inputs, no_grad_wanted
from memprobe.kernels._steps import block_starts
from memprobe.kernels.filtered import check_filters, mass_bits, top_p_limit, top_p_masses
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


def _count_ties(values: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    # An int32 sum: summing a bool row into int64 takes twice as long on cpu.
    return (values == tau.unsqueeze(-1)).sum(dim=-1, dtype=torch.int32).long()


def _crossing(
    vals: torch.Tensor, q: torch.Tensor, above: torch.Tensor | int, limit: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-p on a descending list of candidates with int64 masses ``q`` (see
    :func:`~memprobe.kernels.filtered.top_p_masses`) and exact mass ``above`` before
    them: keep a candidate while the mass before it is below ``limit``. Returns
    (count kept, kept mass including ``above``, tau, how many of the kept equal
    tau), ``[B, c]`` each. At least one finite candidate is kept."""
    before = q.cumsum(dim=-1).sub_(q)
    if torch.is_tensor(above):
        before.add_(above.unsqueeze(-1))
    finite = (vals > float("-inf")).sum(dim=-1, keepdim=True)
    n_in = (before < limit.unsqueeze(-1)).sum(dim=-1, keepdim=True)
    n_in = torch.minimum(n_in, finite).clamp_(min=1)
    kept_mass = (before.gather(-1, n_in - 1) + q.gather(-1, n_in - 1)).squeeze(-1)
    tau = vals.gather(-1, n_in - 1).squeeze(-1)
    n_in = n_in.squeeze(-1)
    return n_in, kept_mass, tau, n_in - (vals > tau.unsqueeze(-1)).sum(dim=-1)


def _log_mass(mass: torch.Tensor, bits: int) -> torch.Tensor:
    """``log Σ exp(x - max)`` of an int64 mass in units of 2^-bits, float32."""
    return (mass.double().log_() - bits * math.log(2.0)).float()


Selection = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _select_counting(
    x: torch.Tensor, m: torch.Tensor, top_k: int, top_p: float | None
) -> Selection:
    """Per row of a float32 chunk: (tau, logsum, ties kept, ties in all), ``[B, c]``
    each; the tie counts are None when every logit equal to tau is kept. The rows
    :func:`_select_top_k`'s list cannot settle (with :func:`_cut_indices`).

    With top_k the candidates are the kept-by-k set in descending order: ``topk``'s
    k values, then ``extra`` more logits equal to the k-th that ``topk`` left out.
    Top-p keeps a candidate while the mass before it is below ``p`` of the kept-by-k
    total, in ``filtered``'s exact integer masses. Without top_k: :func:`_select_top_p`.
    """
    assert top_k is not None
    bits = mass_bits(x.shape[-1])
    vals = torch.topk(x, top_k, dim=-1, sorted=True).values
    last = vals[..., -1]
    extra = _count_ties(x, last) - _count_ties(vals, last)
    q = top_p_masses(vals - m, bits)
    q_last = q[..., -1]
    listed = q.sum(dim=-1)
    total = listed + extra * q_last
    if top_p is None:
        # top_k alone keeps every logit equal to the k-th.
        return last, _log_mass(total, bits), None, None
    limit = top_p_limit(total, top_p)
    n_in, kept_mass, tau, ties_kept = _crossing(vals, q, 0, limit)
    # The extra ties follow the list: the i-th is kept while listed + i·q_last < limit,
    # for i < ceil((limit - listed) / q_last), in exact integers.
    room = torch.where(
        q_last > 0,
        torch.div(limit - listed + q_last - 1, q_last.clamp(min=1), rounding_mode="floor"),
        torch.where(listed < limit, extra, 0),
    )
    whole_list = n_in == vals.shape[-1]
    extra_kept = torch.where(whole_list, room.clamp(min=0).minimum(extra), 0)
    kept_mass = kept_mass + extra_kept * q_last
    ties_kept = ties_kept + extra_kept
    ties_all = _count_ties(vals, tau) + torch.where(tau == last, extra, 0)
    return tau, _log_mass(kept_mass, bits), ties_kept, ties_all


# Top-k's list holds this many more logits than k, so that a run of logits equal to
# the k-th (common in bf16) is listed whole in nearly every row.
TIE_ROOM = 32


def _select_top_k(
    x: torch.Tensor, m: torch.Tensor, top_k: int, top_p: float | None, scratch: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tau, logsum, cut) per row of a float32 chunk, with top_k (then top_p).

    One ``topk`` of ``k + TIE_ROOM`` logits: where the list ends below the k-th
    value it holds every logit top-k keeps, so top-p's crossing, its ties and the
    cut are read from the list alone (no pass over the chunk to count ties, no
    look-up per row). A row whose k-th value runs to the list's end is redone by
    :func:`_select_counting` and :func:`_cut_indices` alone (a meta simulation,
    which has no values, skips it: a row's temporaries, under the chunk's lists).
    """
    vocab = x.shape[-1]
    bits = mass_bits(vocab)
    vals, idx = torch.topk(x, min(top_k + TIE_ROOM, vocab), dim=-1, sorted=True)
    last = vals[..., top_k - 1]
    listed = vals.masked_fill(vals < last.unsqueeze(-1), float("-inf"))
    q = top_p_masses(listed - m, bits)
    total = q.sum(dim=-1)
    if top_p is None:
        # top_k alone keeps every logit equal to the k-th.
        tau, logsum = last, _log_mass(total, bits)
        cut = torch.full_like(idx[..., 0], vocab - 1)
    else:
        n_in, kept_mass, tau, ties_kept = _crossing(listed, q, 0, top_p_limit(total, top_p))
        logsum = _log_mass(kept_mass, bits)
        cut = _split_cut(listed, idx, tau, ties_kept, vocab)
    unsettled = vals[..., -1] == last if vals.shape[-1] < vocab else None
    if unsettled is not None and x.device.type != "meta":
        for r in unsettled.cpu().numpy().reshape(-1).nonzero()[0]:
            b, s = divmod(int(r), x.shape[1])
            row, m_row = x[b : b + 1, s : s + 1], m[b : b + 1, s : s + 1]
            row_tau, row_logsum, kept, ties = _select_counting(row, m_row, top_k, top_p)
            tau[b, s], logsum[b, s] = row_tau[0, 0], row_logsum[0, 0]
            cut[b, s] = _cut_indices(row, row_tau, kept, ties, scratch)[0, 0]
    return tau, logsum, cut


# Top-p without top-k: a histogram of each row's integer mass over buckets of the
# mass's own float32 bits (exponent and the top mantissa bits: a fixed fraction of a
# nat, finer for a larger vocabulary, so a bucket holds ~V/150 logits) finds the
# bucket where the cumulative mass crosses p; a topk of that bucket alone (at most
# BUCKET_CAP logits), ordered as filtered orders ties, finds the token and its index.
# One pass of scatter_add instead of a sort: the sort of a [B, c, V] chunk costs
# ~50 exps per element on cpu.
BUCKET_CAP = 512
_HALF_BITS = 126 << 23  # float32 0.5: masses below 1 (zero in int64) share bucket 0


def _bucket_shift(vocab: int) -> int:
    """Right shift of a mass's float32 bits to its bucket: 2^-6 of a binade at
    V = 32768, and one more mantissa bit per doubling of V."""
    return 23 - min(max(vocab.bit_length() - 10, 3), 11)


class TopPBuffers:
    """The forward's chunk-sized work buffers for top-p alone, allocated once and
    reused by every chunk: a fresh [B, c, V] buffer per chunk costs its page
    faults again (more than a pass over it on cpu), and the peak is the same."""

    def __init__(self, batch: int, rows: int, vocab: int, device: torch.device) -> None:
        shape = (batch, rows, vocab)
        self.f = torch.empty(shape, dtype=torch.float32, device=device)
        self.bucket = torch.empty(shape, dtype=torch.long, device=device)
        self.q = torch.empty(shape, dtype=torch.long, device=device)

    def views(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.f[:, :rows], self.bucket[:, :rows], self.q[:, :rows]


def _select_top_p(
    x: torch.Tensor, m: torch.Tensor, top_p: float, bufs: TopPBuffers
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tau, logsum, cut) per row of a float32 chunk, top-p alone."""
    vocab = x.shape[-1]
    bits, shift = mass_bits(vocab), _bucket_shift(vocab)
    f, bucket, q = bufs.views(x.shape[1])
    torch.sub(x, m, out=f)
    q.copy_(f.exp_().mul_(2.0**bits))  # top_p_masses, in the reused buffers
    # The bucket: the mass's float bits, which grow with it (so with x), less 0.5's.
    # In place in int32 (a shift into int64 takes a slow casting path), then widened
    # for scatter_add; the int32 copy in f's storage serves the bucket look-up below.
    ids = f.clamp_(min=0.5).view(torch.int32).sub_(_HALF_BITS).bitwise_right_shift_(shift)
    bucket.copy_(ids)
    buckets = ((bits + 1) << (23 - shift)) + 1
    bins = q.new_zeros((*q.shape[:-1], buckets)).scatter_add_(-1, bucket, q)
    # Cumulative mass from the top bucket down; the first to reach the limit is hit.
    cum = bins.flip(-1).cumsum_(-1)
    del bins
    limit = top_p_limit(cum[..., -1], top_p)  # exact: the row's total mass
    down = torch.searchsorted(cum, limit.unsqueeze(-1)).clamp_(max=buckets - 1)
    above = torch.where(down > 0, cum.gather(-1, (down - 1).clamp(min=0)), 0).squeeze(-1)
    del cum
    lowest = x.new_full((), float("-inf"))
    torch.where(ids == (buckets - 1 - down).to(torch.int32), x, lowest, out=f)
    cap = min(BUCKET_CAP, vocab)
    # Descending values; equal ones in any order: n_in, tau, the kept mass and the
    # number of ties kept do not depend on it, and _split_cut puts ties in order.
    vals, idx = torch.topk(f, cap, dim=-1, sorted=True)
    n_in, kept_mass, tau, ties_kept = _crossing(vals, top_p_masses(vals - m, bits), above, limit)
    cut = _split_cut(vals, idx, tau, ties_kept, vocab)
    logsum = _log_mass(kept_mass, bits)
    # A full list may have left part of its bucket out: a row whose crossing is at
    # its end, or at a value that reaches its end, is redone with a sort of that row.
    full = vals[..., -1] > float("-inf")
    unsettled = full & ((n_in == cap) | (tau == vals[..., -1]))
    if x.device.type != "meta":
        for r in unsettled.cpu().numpy().reshape(-1).nonzero()[0]:
            b, s = divmod(int(r), x.shape[1])
            row = _sorted_select(x[b : b + 1, s : s + 1], m[b : b + 1, s : s + 1], top_p)
            tau[b, s], logsum[b, s], cut[b, s] = (t[0, 0] for t in row)
    return tau, logsum, cut


def _split_cut(
    vals: torch.Tensor,
    idx: torch.Tensor,
    tau: torch.Tensor,
    ties_kept: torch.Tensor,
    vocab: int,
) -> torch.Tensor:
    """``cut`` from a descending candidate list holding every logit equal to tau
    (ties in any order): where top-p splits the run of ties, the index of the last
    kept tie in vocabulary order (filtered's stable order), else ``V - 1`` (so
    backward has no ties to lower in that row)."""
    is_tie = vals == tau.unsqueeze(-1)
    split = ties_kept < is_tie.sum(dim=-1)
    tie_index = torch.where(is_tie, idx, vocab).sort(dim=-1).values
    last_kept = tie_index.gather(-1, (ties_kept - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(split, last_kept, vocab - 1)


def _sorted_select(
    x: torch.Tensor, m: torch.Tensor, top_p: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tau, logsum, cut) by a stable sort of whole rows: the fallback for rows the
    histogram cannot settle."""
    bits = mass_bits(x.shape[-1])
    vals, idx = torch.sort(x, dim=-1, descending=True, stable=True)
    q = top_p_masses(vals - m, bits)
    n_in, kept_mass, tau, ties_kept = _crossing(vals, q, 0, top_p_limit(q.sum(dim=-1), top_p))
    cut = _split_cut(vals, idx, tau, ties_kept, x.shape[-1])
    return tau, _log_mass(kept_mass, bits), cut


def _cut_indices(
    x: torch.Tensor,
    tau: torch.Tensor,
    ties_kept: torch.Tensor | None,
    ties_all: torch.Tensor | None,
    scratch: torch.Tensor,
) -> torch.Tensor:
    """``cut`` per row: ``V - 1``, or the index of the last kept tie where top-p
    splits a run of logits equal to tau. Found row by row (see the module)."""
    vocab = x.shape[-1]
    cut = torch.full(tau.shape, vocab - 1, dtype=torch.long, device=x.device)
    if ties_kept is None or ties_all is None:
        return cut
    split = ties_kept < ties_all
    if x.device.type == "meta":
        return cut
    for r in split.cpu().numpy().reshape(-1).nonzero()[0]:
        b, s = divmod(int(r), tau.shape[1])
        torch.eq(x[b, s], tau[b, s], out=scratch)
        where = scratch.cpu().numpy().nonzero()[0]
        if int(ties_kept[b, s]) < len(where):
            cut[b, s] = int(where[int(ties_kept[b, s]) - 1])
    return cut


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
    rows = min(chunk, seq)
    work = logits.new_empty((batch, rows, vocab), dtype=torch.float32)
    bufs = None
    if top_k is None and top_p is not None:
        bufs = TopPBuffers(batch, rows, vocab, logits.device)
    for start in block_starts(seq, chunk, logits.device):
        end = min(start + chunk, seq)
        x = work[:, : end - start]
        x.copy_(logits[:, start:end])
        m = _row_max(x)
        x_t = x.gather(-1, index[:, start:end].unsqueeze(-1)).squeeze(-1)
        if bufs is not None:
            assert top_p is not None
            chunk_tau, chunk_logsum, chunk_cut = _select_top_p(x, m, top_p, bufs)
        elif top_k is not None:
            chunk_tau, chunk_logsum, chunk_cut = _select_top_k(x, m, top_k, top_p, scratch)
        else:
            chunk_tau = x.new_full(m.shape[:-1], float("-inf"))
            chunk_cut = torch.full(m.shape[:-1], vocab - 1, dtype=torch.long, device=x.device)
            # logsumexp by hand, in place, as local_chunked does.
            chunk_logsum = x.sub_(m).exp_().sum(dim=-1).log_()
        kept = _kept_target(x_t, chunk_tau, chunk_cut, index[:, start:end])
        shifted = x_t - m.squeeze(-1)
        out[:, start:end] = torch.where(kept, shifted - chunk_logsum, float("-inf"))
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
    for start in block_starts(seq, chunk, logits.device):
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
_BELOW_ZERO = -(2.0**-149)  # the negative float32 nearest zero: y > it iff y >= 0


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
