"""The named kernels memprobe measures. Names are part of the CLI and CI contract."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from memprobe.kernels.autograd_reference import (
    naive_chunked_logprobs,
    precast_chunked_logprobs,
    unchunked_logprobs,
)
from memprobe.kernels.distributed import (
    chunked_distributed_collectives,
    chunked_distributed_logprobs,
    distributed_collectives,
    distributed_logprobs,
)
from memprobe.kernels.filtered import filtered_logprobs
from memprobe.kernels.local_chunked import (
    local_chunked_inplace_logprobs,
    local_chunked_logprobs,
)


class LogprobKernel(Protocol):
    def __call__(
        self, logits: torch.Tensor, targets: torch.Tensor, *, chunk_size: int | None = None
    ) -> torch.Tensor: ...


def no_collectives(num_tokens: int, chunk_size: int | None = None) -> tuple[int, int]:
    """Single-device kernels communicate nothing."""
    return (0, 0)


@dataclass(frozen=True)
class KernelSpec:
    """A kernel and the facts the rest of memprobe needs about it."""

    name: str
    fn: LogprobKernel
    summary: str
    # True when the kernel casts chunk by chunk itself, so a caller must not
    # pre-cast the whole tensor to float32 (that alone costs a float32 [B,S,V]).
    casts_per_chunk: bool
    # True when backward writes the gradient into the logits' storage.
    consumes_logits: bool = False
    # True when the kernel needs a torch.distributed process group (vocab shards).
    distributed: bool = False
    # (forward, backward) collectives of one pass, from (B*S tokens, chunk_size).
    collectives: Callable[[int, int | None], tuple[int, int]] = no_collectives
    # False when chunk_size changes nothing: a sweep then runs one chunk size, not each.
    uses_chunk_size: bool = True


KERNELS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (
        KernelSpec(
            "unchunked",
            unchunked_logprobs,
            "log_softmax(logits.float()) + gather under autograd: the reference",
            casts_per_chunk=False,
            uses_chunk_size=False,
        ),
        KernelSpec(
            "naive_chunked",
            naive_chunked_logprobs,
            "per-chunk cast + log_softmax + gather under plain autograd: bounds nothing",
            casts_per_chunk=True,
        ),
        KernelSpec(
            "precast_chunked",
            precast_chunked_logprobs,
            "whole tensor cast to float32 first, then the naive chunk loop (old dispatcher rule)",
            casts_per_chunk=False,
        ),
        KernelSpec(
            "local_chunked",
            local_chunked_logprobs,
            "LocalChunkedLogprob: saves only inputs, recomputes per chunk, grad in logits dtype",
            casts_per_chunk=True,
        ),
        KernelSpec(
            "local_chunked_inplace",
            local_chunked_inplace_logprobs,
            "as local_chunked, but backward writes the gradient into the logits (consumes them)",
            casts_per_chunk=True,
            consumes_logits=True,
        ),
        KernelSpec(
            "filtered",
            filtered_logprobs,
            "top-k / top-p filtering, then log_softmax + gather under plain autograd",
            casts_per_chunk=False,
            uses_chunk_size=False,
        ),
        KernelSpec(
            "distributed",
            distributed_logprobs,
            "DistributedLogprob: vocab-parallel, whole shard in float32, softmax saved",
            casts_per_chunk=False,
            uses_chunk_size=False,
            distributed=True,
            collectives=distributed_collectives,
        ),
        KernelSpec(
            "chunked_distributed",
            chunked_distributed_logprobs,
            "ChunkedDistributedLogprob: vocab-parallel, recomputes per chunk, 2 all_reduces",
            casts_per_chunk=True,
            distributed=True,
            collectives=chunked_distributed_collectives,
        ),
    )
}


def kernel_names(*, distributed: bool | None = None) -> list[str]:
    """Registered names, optionally only the (non-)distributed ones."""
    return [n for n, s in KERNELS.items() if distributed is None or s.distributed == distributed]


def get_spec(name: str) -> KernelSpec:
    try:
        return KERNELS[name]
    except KeyError:
        known = ", ".join(KERNELS)
        raise ValueError(f"unknown kernel {name!r}; known kernels: {known}") from None


def get_kernel(name: str) -> LogprobKernel:
    """The callable ``fn(logits, targets, *, chunk_size=None) -> Tensor[B, S]``."""
    return get_spec(name).fn
