"""torch's fused route: ``torch.nn.functional.linear_cross_entropy``, chunked.

torch 2.13 ships a chunked linear + cross-entropy that never materializes the
logits. With ``reduction='none'`` it returns the per-token loss, the negated
target log-prob. Its ``LinearCrossEntropyOptions.acc_policy`` defaults to
``'auto'``, which resolves differently per device (``'compact'`` on CUDA,
``'accurate'`` with float32 accumulators on CPU), so memprobe sets the policy
explicitly and leaves ``acc_dtype`` unset: for an explicit policy torch then
accumulates in the inputs' dtype (bf16 for bf16 inputs) on every device, and a
meta simulation shows what a GPU run allocates.

* ``compact``: no weight-gradient scratch; per-chunk weight gradients are added
  straight into the bf16 gradient.
* ``accurate``: a ``[V, H]`` scratch in the accumulation dtype for the weight
  gradient (1 GiB at V = 131,072, H = 4096, bf16).

Both return the loss in the inputs' dtype: the log-probs are bf16-rounded for
bf16 inputs (memprobe casts them to float32 after the fact).
"""

from __future__ import annotations

from typing import Any

import torch

from memprobe.kernels._checks import check_chunk_size, check_hidden_inputs
from memprobe.kernels.unavailable import KernelUnavailable


def _options_class() -> Any:
    options = getattr(torch.nn, "LinearCrossEntropyOptions", None)
    fn = getattr(torch.nn.functional, "linear_cross_entropy", None)
    if options is None or fn is None:
        raise KernelUnavailable(
            f"torch {torch.__version__} has no torch.nn.functional.linear_cross_entropy "
            "with LinearCrossEntropyOptions (torch 2.13 has both)"
        )
    return options


def _torch_linear_ce(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int | None,
    acc_policy: str,
) -> torch.Tensor:
    options_class = _options_class()
    check_hidden_inputs(hidden, weight, targets)
    check_chunk_size(chunk_size)
    batch, seq, size = hidden.shape
    # chunk_size is torch's batch_chunk_size (rows per chunk); None keeps its
    # own heuristic (chunking_method='auto').
    options = options_class(acc_policy=acc_policy, batch_chunk_size=chunk_size)
    loss = torch.nn.functional.linear_cross_entropy(
        hidden.reshape(batch * seq, size),
        weight,
        targets.reshape(batch * seq).long(),
        reduction="none",
        options=options,
    )
    return loss.neg().float().view(batch, seq)


def torch_linear_ce_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``-linear_cross_entropy(..., reduction='none')`` with ``acc_policy='compact'``.

    Memory (torch's contract, measured by memprobe): the inputs, both gradients,
    and per chunk a logits-sized ``[c, V]`` buffer in the inputs' dtype; no
    ``[V, H]`` scratch. Raises :class:`KernelUnavailable` on a torch without it.
    """
    return _torch_linear_ce(hidden, weight, targets, chunk_size, "compact")


def torch_linear_ce_accurate_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """As :func:`torch_linear_ce_logprobs` with ``acc_policy='accurate'``.

    Adds a ``[V, H]`` weight-gradient scratch in the accumulation dtype (the
    inputs' dtype, as the policy is explicit). Raises :class:`KernelUnavailable`
    on a torch without the API.
    """
    return _torch_linear_ce(hidden, weight, targets, chunk_size, "accurate")
