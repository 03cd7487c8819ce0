"""Plain-autograd kernels: the reference and the chunk loops that bound nothing.

These exist to be measured against. Autograd saves every chunk's float32
log-softmax output and builds a full-size gradient for every slice, so
chunking them does not bound memory.
"""

from __future__ import annotations

import torch

from memprobe.kernels._checks import check_chunk_size, check_logprob_inputs


def unchunked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """``log_softmax(logits.float(), -1)`` then gather: the reference.

    ``chunk_size`` is accepted for a uniform kernel signature and ignored.
    """
    check_logprob_inputs(logits, targets)
    check_chunk_size(chunk_size)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def naive_chunked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """Slice, cast each chunk to float32, log_softmax, gather, concatenate.

    ``chunk_size=None`` means one chunk holding the whole sequence.
    """
    check_logprob_inputs(logits, targets)
    check_chunk_size(chunk_size)
    seq = logits.shape[1]
    step = seq if chunk_size is None else int(chunk_size)
    if seq == 0:
        # Keep the result attached to the graph so backward yields a zero gradient.
        return logits.float().sum(-1)
    index = targets.long().unsqueeze(-1)
    pieces = []
    for start in range(0, seq, step):
        chunk = logits[:, start : start + step].float()
        chunk_logprobs = torch.log_softmax(chunk, dim=-1)
        pieces.append(chunk_logprobs.gather(-1, index[:, start : start + step]).squeeze(-1))
    return torch.cat(pieces, dim=1)


def precast_chunked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """The old dispatcher rule: cast the whole tensor to float32, then the naive loop."""
    check_logprob_inputs(logits, targets)
    return naive_chunked_logprobs(logits.float(), targets, chunk_size=chunk_size)
