"""Which logits top-k / top-p keep, per chunk: the forward's selection for
:mod:`memprobe.kernels.filtered_chunked`.

Each entry point takes a float32 chunk ``x`` ``[B, c, V]`` and its row max ``m``
and returns, per row, ``tau`` (the smallest kept logit), ``logsum`` (``log
Σ_kept exp(x - max)``, from the exact integer masses of
:func:`~memprobe.kernels.filtered.top_p_masses`) and ``cut`` (the last kept
index among the logits equal to tau, ``V - 1`` when all are kept): with top-k,
:func:`select_top_k`; top-p alone, :func:`select_top_p`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import numpy
import torch

from memprobe.kernels._checks import carries_values
from memprobe.kernels.filtered import mass_bits, top_p_limit, top_p_masses


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
    :func:`select_top_k`'s list cannot settle (with :func:`_cut_indices`).

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


# torch hands an op over more elements than this to its thread pool. The work on
# top-k's lists (~100 elements a row) is cheaper than the hand-off, which on a busy
# cpu costs milliseconds an op, so it runs in blocks of rows below it.
_GRAIN = 32768


def _in_row_blocks(
    settle: Callable[..., tuple[torch.Tensor, ...]], *per_row: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """``settle`` over blocks of rows (dim 1) of ``[B, c, ...]`` tensors, each block
    of the first under ``_GRAIN`` elements; its ``[B, rows]`` results concatenated."""
    first = per_row[0]
    step = max(1, _GRAIN // (first.shape[0] * first.shape[-1]))
    parts = [
        settle(*(t[:, r0 : r0 + step] for t in per_row)) for r0 in range(0, first.shape[1], step)
    ]
    return tuple(torch.cat(results, dim=1) for results in zip(*parts, strict=True))


# Top-k's list holds this many more logits than k, so that a run of logits equal to
# the k-th (common in bf16) is listed whole in nearly every row.
TIE_ROOM = 32


def select_top_k(
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

    def settle(
        vals: torch.Tensor, idx: torch.Tensor, m: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        last = vals[..., top_k - 1]
        listed = vals.masked_fill(vals < last.unsqueeze(-1), float("-inf"))
        q = top_p_masses(listed - m, bits)
        total = q.sum(dim=-1)
        if top_p is None:
            # top_k alone keeps every logit equal to the k-th.
            return last, _log_mass(total, bits), torch.full_like(idx[..., 0], vocab - 1)
        n_in, kept_mass, tau, ties_kept = _crossing(listed, q, 0, top_p_limit(total, top_p))
        return tau, _log_mass(kept_mass, bits), _split_cut(listed, idx, tau, ties_kept, vocab)

    tau, logsum, cut = _in_row_blocks(settle, vals, idx, m)
    last = vals[..., top_k - 1]
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
# bucket where the cumulative mass crosses p; that bucket's logits alone (at most
# BUCKET_CAP of them), stably sorted as filtered orders ties, find the token and its
# index. One pass of scatter_add instead of a sort: the sort of a [B, c, V] chunk
# costs ~50 exps per element on cpu. Per block of rows, bf16 [1, 1024, 32768] on
# one thread: ~70% of the time in nine passes over the block (exp, the int64
# masses and bucket indices, scatter_add the largest), ~20% picking out the hit
# bucket's logits (a comparison, numpy's nonzero), the rest on the lists.
BUCKET_CAP = 512
# Rows the selection works on at once (its buffers' rows), at least: a smaller block
# touches fewer fresh pages (a first touch costs ~10x a pass over the page).
SELECT_ROWS = 64
_HALF_BITS = 126 << 23  # float32 0.5: masses below 1 (zero in int64) share bucket 0


def _bucket_shift(vocab: int) -> int:
    """Right shift of a mass's float32 bits to its bucket: 2^-6 of a binade at
    V = 32768, and one more mantissa bit per doubling of V."""
    return 23 - min(max(vocab.bit_length() - 10, 3), 11)


def _bucket_count(vocab: int) -> int:
    """Buckets a row's masses (below 2^(bits+1)) fall in, rounded up to whole groups
    of one binade each (see :func:`_hit_bucket`)."""
    per_binade = 1 << (23 - _bucket_shift(vocab))
    return (mass_bits(vocab) + 2) * per_binade


def _leading(buffer: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The first ``prod(shape)`` elements of a contiguous buffer, viewed as ``shape``:
    contiguous whatever the rows (a slice of the rows would not be, for B > 1)."""
    return buffer.view(-1)[: math.prod(shape)].view(shape)


def select_rows(rows: int, vocab: int) -> int:
    """Rows of :class:`TopPBuffers` for a chunk of ``rows``: SELECT_ROWS, and no
    fewer than make the lists as long as a row (a row the lists cannot settle is
    sorted alone, after the lists are freed, in less than they held)."""
    return min(rows, max(SELECT_ROWS, -(-vocab // min(BUCKET_CAP, vocab))))


class TopPBuffers:
    """The forward's work buffers for top-p alone, ``[B, rows, V]``, allocated once
    and reused by every block of rows: a fresh buffer per block costs its page
    faults again (more than a pass over it on cpu), and the peak is the same.
    The histogram's bins too, and the hit bucket's list of logits."""

    def __init__(self, batch: int, rows: int, vocab: int, device: torch.device) -> None:
        shape = (batch, rows, vocab)
        self.f = torch.empty(shape, dtype=torch.float32, device=device)
        self.bucket = torch.empty(shape, dtype=torch.long, device=device)
        self.q = torch.empty(shape, dtype=torch.long, device=device)
        bins = (batch, rows, _bucket_count(vocab))
        self.bins = torch.empty(bins, dtype=torch.long, device=device)
        cap = min(BUCKET_CAP, vocab)
        self.cand = torch.empty((batch, rows, cap), dtype=torch.float32, device=device)
        self.cand_idx = torch.empty((batch, rows, cap), dtype=torch.long, device=device)

    def views(self, rows: int) -> tuple[torch.Tensor, ...]:
        batch, _, vocab = self.f.shape
        shape = (batch, rows, vocab)
        lists = (batch, rows, self.cand.shape[-1])
        return (
            _leading(self.f, shape),
            _leading(self.bucket, shape),
            _leading(self.q, shape),
            _leading(self.bins, (batch, rows, self.bins.shape[-1])),
            _leading(self.cand, lists),
            _leading(self.cand_idx, lists),
        )


def _hit_bucket(
    bins: torch.Tensor, per_binade: int, top_p: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hit bucket, exact mass above it, limit) per row of int64 ``bins``
    (ascending buckets): the hit is the highest bucket whose mass at or above it
    reaches the limit. Cumulative masses from the bottom up (a flip to sum from the
    top copies the bins, slowly), first over groups of a binade, then within the
    group hit: a cumsum of every bucket costs 5x the two."""
    groups = bins.view(*bins.shape[:-1], -1, per_binade)
    cum = groups.sum(dim=-1).cumsum_(-1)
    total = cum[..., -1]
    limit = top_p_limit(total, top_p)
    # The hit is the first bucket whose cum passes total - limit (below it, the mass
    # at or above reaches the limit; at it, the mass above does not).
    rest = (total - limit).unsqueeze(-1)
    group = torch.searchsorted(cum, rest, right=True).clamp_(max=cum.shape[-1] - 1)
    below = torch.where(group > 0, cum.gather(-1, (group - 1).clamp(min=0)), 0)
    index = group.unsqueeze(-1).expand(*group.shape, per_binade)
    fine = groups.gather(-2, index).squeeze(-2).cumsum_(-1).add_(below)
    within = torch.searchsorted(fine, rest, right=True).clamp_(max=per_binade - 1)
    above = total - fine.gather(-1, within).squeeze(-1)
    return (group * per_binade + within).squeeze(-1), above, limit


@contextlib.contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """Torch's cpu ops on one thread inside (restored after). The selection's
    dozens of ops a block each hand their work to the thread pool and wait for its
    second thread: on a cpu other processes keep busy, that wait costs more than
    the op (measured: the top-p forward 3.5x local_chunked's on two threads, 2x on
    one, at load 3 on 2 cores). On an idle cpu the passes over the block lose the
    second thread's share. torch's thread count is the process's: while this runs,
    other threads of the process run torch's cpu ops on one thread too."""
    if device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def select_top_p(
    x: torch.Tensor, m: torch.Tensor, top_p: float, bufs: TopPBuffers
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tau, logsum, cut) per row of a float32 chunk, top-p alone, in blocks of
    the buffers' rows."""
    step = bufs.f.shape[1]
    with one_thread(x.device):
        parts = [
            _select_top_p_block(x[:, r0 : r0 + step], m[:, r0 : r0 + step], top_p, bufs)
            for r0 in range(0, x.shape[1], step)
        ]
    if len(parts) == 1:
        return parts[0]
    tau, logsum, cut = (torch.cat(results, dim=1) for results in zip(*parts, strict=True))
    return tau, logsum, cut


def _select_top_p_block(
    x: torch.Tensor, m: torch.Tensor, top_p: float, bufs: TopPBuffers
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`select_top_p` on at most the buffers' rows."""
    vocab = x.shape[-1]
    bits, shift, buckets = mass_bits(vocab), _bucket_shift(vocab), _bucket_count(vocab)
    f, bucket, q, bins, cand, cand_idx = bufs.views(x.shape[1])
    torch.sub(x, m, out=f)
    q.copy_(f.exp_().mul_(2.0**bits))  # top_p_masses, in the reused buffers
    # The bucket: the mass's float bits, which grow with it (so with x), less 0.5's.
    # In place in int32 (a shift into int64 takes a slow casting path), then widened
    # for scatter_add; the int32 copy in f's storage serves the bucket look-up below.
    ids = f.clamp_(min=0.5).view(torch.int32).sub_(_HALF_BITS).bitwise_right_shift_(shift)
    # A row holding NaN or +inf (its max not below inf) has NaN masses, whose float bits
    # index outside the histogram; its answer is NaN anyway (as filtered's). One flag per
    # chunk spares every finite chunk the extra pass (fmax instead of clamp cost 5x).
    finite = m.squeeze(-1) < float("inf")
    if carries_values(m) and not bool(finite.all()):
        ids.clamp_(0, buckets - 1)
    bucket.copy_(ids)
    bins.zero_().scatter_add_(-1, bucket, q)
    hit, above, limit = _hit_bucket(bins, 1 << (23 - shift), top_p)
    # The hit bucket's logits, in vocabulary order, into a list per row (the bool
    # mask of its members in q's storage, free after the scatter).
    members = _leading(q.view(torch.bool), f.shape)
    torch.eq(ids, hit.to(torch.int32).unsqueeze(-1), out=members)
    count = _gather_members(members, x, cand, cand_idx)
    # Descending, stably: equal logits stay in vocabulary order, as filtered keeps them.
    vals, order = torch.sort(cand, dim=-1, descending=True, stable=True)
    idx = cand_idx.gather(-1, order)
    del order
    tau, kept_mass, cut = _sorted_crossing(vals, idx, m, above, limit, count, vocab)
    logsum = _log_mass(kept_mass, bits)
    del vals, idx
    # A bucket over the list's length, a row of NaN or +inf, or one with no mass (all
    # -inf: no members) is redone with a sort.
    unsettled = (count > cand.shape[-1]) | (count == 0) | ~finite
    if carries_values(x):
        for r in unsettled.cpu().numpy().reshape(-1).nonzero()[0]:
            b, s = divmod(int(r), x.shape[1])
            row = _sorted_select(x[b : b + 1, s : s + 1], m[b : b + 1, s : s + 1], top_p)
            tau[b, s], logsum[b, s], cut[b, s] = (t[0, 0] for t in row)
    return tau, logsum, cut


def _sorted_crossing(
    vals: torch.Tensor,
    idx: torch.Tensor,
    m: torch.Tensor,
    above: torch.Tensor,
    limit: torch.Tensor,
    count: torch.Tensor,
    vocab: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tau, kept mass, cut) from a descending list of the hit bucket's logits (ties
    in vocabulary order, -inf past its ``count``) and the exact mass ``above`` it:
    as :func:`_crossing` and :func:`_split_cut`, with searches of the sorted list
    where they count over it. The last kept is the last kept tie, and top-p split
    their run where the next one listed is a tie."""
    width = vals.shape[-1]
    q = top_p_masses(vals - m, mass_bits(vocab))
    before = q.cumsum(dim=-1).sub_(q).add_(above.unsqueeze(-1))
    # Kept while the mass before is below the limit (before never decreases), at
    # least one and none past the bucket's logits.
    n_in = torch.searchsorted(before, limit.unsqueeze(-1))
    n_in = torch.minimum(n_in, count.clamp(max=width).unsqueeze(-1)).clamp_(min=1)
    last = n_in - 1
    kept_mass = (before.gather(-1, last) + q.gather(-1, last)).squeeze(-1)
    tau = vals.gather(-1, last)
    split = (vals.gather(-1, n_in.clamp(max=width - 1)) == tau) & (n_in < width)
    cut = torch.where(split, idx.gather(-1, last), vocab - 1)
    return tau.squeeze(-1), kept_mass, cut.squeeze(-1)


def _gather_members(
    members: torch.Tensor, x: torch.Tensor, cand: torch.Tensor, cand_idx: torch.Tensor
) -> torch.Tensor:
    """Fill ``cand`` (-inf past a row's members) and ``cand_idx`` with the logits
    ``members`` marks, each row's in vocabulary order, the first ``cap`` of them;
    return each row's member count, ``[B, c]``. On cpu in numpy, with no torch
    allocation of the data's size, so a real run's peak is meta's (which skips it)."""
    count = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
    if carries_values(x) and x.device.type == "cpu":
        cand.numpy().fill(-numpy.inf)
        cand_idx.numpy().fill(x.shape[-1])
        count.numpy()[...] = _members_on_host(members.numpy(), x.numpy(), cand, cand_idx)
        return count
    cand.fill_(float("-inf"))
    cand_idx.fill_(x.shape[-1])
    if carries_values(x):
        count.copy_(_members_on_device(members, x, cand, cand_idx))
    return count


def _members_on_host(
    members: numpy.ndarray, x: numpy.ndarray, cand: torch.Tensor, cand_idx: torch.Tensor
) -> numpy.ndarray:
    """:func:`_gather_members` in numpy; the member counts, ``[B, c]``."""
    batch, rows, vocab = x.shape
    flat = members.reshape(-1).nonzero()[0]
    row, col = numpy.divmod(flat, vocab)
    per_row = numpy.bincount(row, minlength=batch * rows)
    slot = numpy.arange(len(flat)) - (numpy.cumsum(per_row) - per_row)[row]
    fits = slot < cand.shape[-1]
    row, col, slot = row[fits], col[fits], slot[fits]
    b, s = numpy.divmod(row, rows)
    cand.numpy()[b, s, slot] = x[b, s, col]
    cand_idx.numpy()[b, s, slot] = col
    return per_row.reshape(batch, rows)


def _members_on_device(
    members: torch.Tensor, x: torch.Tensor, cand: torch.Tensor, cand_idx: torch.Tensor
) -> torch.Tensor:
    """:func:`_gather_members` in torch ops; the member counts, ``[B, c]``."""
    batch, rows, vocab = x.shape
    flat = members.reshape(-1).nonzero().squeeze(-1)
    row, col = flat.div(vocab, rounding_mode="floor"), flat.remainder(vocab)
    per_row = torch.bincount(row, minlength=batch * rows)
    slot = torch.arange(len(flat), device=x.device) - (per_row.cumsum(0) - per_row)[row]
    fits = slot < cand.shape[-1]
    row, col, slot = row[fits], col[fits], slot[fits]
    b, s = row.div(rows, rounding_mode="floor"), row.remainder(rows)
    cand[b, s, slot] = x[b, s, col]
    cand_idx[b, s, slot] = col
    return per_row.view(batch, rows)


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
