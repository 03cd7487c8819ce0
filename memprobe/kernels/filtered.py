"""Top-k / top-p filtered log-probabilities on plain autograd.

Sampling with top-k or top-p draws from the renormalised filtered
distribution, so the log-probs a policy-gradient step needs are taken from
the same filtered distribution. A target outside the kept set gets -inf.
"""

from __future__ import annotations

import numbers

import torch

from memprobe.kernels._checks import check_chunk_size, check_logprob_inputs, check_size_parameter


def check_filters(top_k: int | None, top_p: float | None) -> None:
    check_size_parameter("top_k", top_k)
    # A real number, never coerced: float("0.5") or float(True) would accept a string or a
    # bool, and float() of a list or a huge int raises something other than this message.
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not (0.0 < top_p <= 1.0)
    ):
        raise ValueError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")


# Top-p's rule, shared with filtered_chunked so that both keep exactly the same
# tokens on any machine. Float sums of probabilities round differently with the
# summation order (a float32 softmax's vectorised denominator differs between
# AVX2 and AVX-512), and in a run of tied logits that moves the token where the
# cumulative mass crosses p. So the masses are integers: token i weighs
# q_i = trunc(exp(x_i - max) * 2^bits) (a float32 exp, exact scaling), sums of q
# are exact in int64 in any order, and a token is kept while the mass before it
# (in descending order, ties in vocabulary order) is below
# ceil(p * total), rounded once in float64.


def mass_bits(vocab: int) -> int:
    """Fraction bits of a token's mass: V masses of at most 2^bits sum below 2^62."""
    return 62 - max(vocab - 1, 0).bit_length()


def top_p_masses(shifted: torch.Tensor, bits: int) -> torch.Tensor:
    """int64 ``trunc(exp(shifted) * 2^bits)`` of float32 ``shifted = x - max``,
    computed in ``shifted``'s storage (which it consumes) before the int64 copy."""
    return shifted.exp_().mul_(2.0**bits).to(torch.int64)


def top_p_limit(total: torch.Tensor, top_p: float) -> torch.Tensor:
    """The mass before a kept token stays below this: ``ceil(p * total)``, int64."""
    return total.double().mul_(top_p).ceil_().to(torch.int64)


def filter_logits(
    logits: torch.Tensor, *, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Return float32 logits with every entry outside top-k / top-p set to -inf."""
    check_filters(top_k, top_p)
    filtered = logits.float()
    drop = filtered_out_mask(filtered, top_k=top_k, top_p=top_p)
    return filtered if drop is None else filtered.masked_fill(drop, float("-inf"))


@torch.no_grad()
def filtered_out_mask(
    logits: torch.Tensor, *, top_k: int | None, top_p: float | None
) -> torch.Tensor | None:
    """Boolean mask of the entries top-k / top-p removes, or None when it removes none.

    Built without autograd: the mask carries no gradient, and tracking the
    sort would save a float32 and an int64 ``[B, S, V]`` for nothing.
    """
    vocab = logits.shape[-1]
    drop: torch.Tensor | None = None
    if top_k is not None and int(top_k) < vocab:
        kth = torch.topk(logits, int(top_k), dim=-1).values[..., -1:]
        drop = logits < kth
    if top_p is not None and float(top_p) < 1.0:
        masked = logits if drop is None else logits.masked_fill(drop, float("-inf"))
        # Stable: where top-p stops inside a run of equal logits, the ties kept
        # are the first in vocabulary order, not whatever an unstable sort leaves.
        sorted_logits, order = torch.sort(masked, dim=-1, descending=True, stable=True)
        # Exact integer masses summed in place: the same 24 bytes per element at
        # the peak as the float32 softmax, cumsum and difference they replace
        # (the row max is a temporary, gone before the int64 copy).
        lowest = torch.finfo(torch.float32).min
        shifted = torch.sub(sorted_logits, sorted_logits[..., :1].clamp(min=lowest))
        cum = top_p_masses(shifted, mass_bits(vocab))
        del shifted
        cum.cumsum_(-1)
        # Drop a token once the mass before it reaches the limit; the most likely
        # token is therefore always kept.
        drop_sorted = torch.zeros_like(cum, dtype=torch.bool)
        torch.ge(cum[..., :-1], top_p_limit(cum[..., -1:], float(top_p)), out=drop_sorted[..., 1:])
        del cum
        by_p = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        drop = by_p if drop is None else drop | by_p
    return drop


def filtered_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """log_softmax of the top-k / top-p filtered logits, gathered at the targets.

    ``chunk_size`` is accepted for a uniform kernel signature and ignored.
    """
    check_logprob_inputs(logits, targets)
    check_chunk_size(chunk_size)
    check_filters(top_k, top_p)
    logprobs = torch.log_softmax(filter_logits(logits, top_k=top_k, top_p=top_p), dim=-1)
    return logprobs.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
