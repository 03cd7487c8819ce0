"""The unfused hidden-state routes: the lm_head matmul, then a logits kernel.

Hidden-family kernels take ``hidden [B, S, H]``, the lm_head ``weight [V, H]``
and ``targets [B, S]``, return float32 ``[B, S]`` log-probs, and backpropagate
into both ``hidden`` and ``weight``. These two materialize the logits
``[B, S, V]`` in the hidden dtype (as ``hidden @ weight.T`` does in a model),
so they are what fusing saves against.
"""

from __future__ import annotations

import torch

from memprobe.kernels._checks import check_chunk_size, check_hidden_inputs
from memprobe.kernels.autograd_reference import unchunked_logprobs
from memprobe.kernels.local_chunked import local_chunked_logprobs


def _logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # One matmul in the inputs' dtype (float32 accumulation inside, rounded
    # once): the lm_head output a model hands to a logits kernel.
    return torch.matmul(hidden, weight.t())


def linear_unchunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``hidden @ weight.T``, then ``unchunked``.

    Memory: the logits ``[B, S, V]`` (hidden dtype) saved by the matmul's
    consumer, plus everything ``unchunked`` keeps (float32 copy, log_softmax
    output, the gather's full-size gradient), plus their gradient. ``chunk_size``
    is accepted for the uniform signature and ignored.
    """
    check_hidden_inputs(hidden, weight, targets)
    check_chunk_size(chunk_size)
    return unchunked_logprobs(_logits(hidden, weight), targets)


def linear_local_chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``hidden @ weight.T`` to logits in the hidden dtype, then ``local_chunked``.

    Memory: the logits ``[B, S, V]`` (saved by ``local_chunked``), their
    gradient in the same dtype, and one float32 ``[B, c, V]`` chunk, on top of
    the inputs and their gradients. ``chunk_size`` is ``local_chunked``'s.
    """
    check_hidden_inputs(hidden, weight, targets)
    return local_chunked_logprobs(_logits(hidden, weight), targets, chunk_size=chunk_size)
