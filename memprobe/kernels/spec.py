"""What the rest of memprobe needs to know about a kernel: :class:`KernelSpec`.

Kept apart from the registry so that a user's kernel (:mod:`memprobe.kernels.user`)
can be described without importing every bundled kernel, and without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

# The two input protocols (KernelSpec.inputs):
#   "logits": fn(logits [B,S,V], targets [B,S], *, chunk_size=None) -> [B,S];
#             backward yields the logits' gradient.
#   "hidden": fn(hidden [B,S,H], weight [V,H], targets [B,S], *, chunk_size=None)
#             -> [B,S]; the logits are hidden @ weight.T, and backward yields the
#             gradients of hidden and weight.
INPUT_PROTOCOLS = ("logits", "hidden")


class LogprobKernel(Protocol):
    def __call__(
        self, logits: torch.Tensor, targets: torch.Tensor, *, chunk_size: int | None = None
    ) -> torch.Tensor: ...


class HiddenLogprobKernel(Protocol):
    def __call__(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        *,
        chunk_size: int | None = None,
    ) -> torch.Tensor: ...


def no_collectives(num_tokens: int, chunk_size: int | None = None) -> tuple[int, int]:
    """Single-device kernels communicate nothing."""
    return (0, 0)


@dataclass(frozen=True)
class KernelSpec:
    """A kernel and the facts the rest of memprobe needs about it."""

    name: str
    # A LogprobKernel, or a HiddenLogprobKernel when inputs == "hidden".
    fn: LogprobKernel | HiddenLogprobKernel
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
    # What fn takes (INPUT_PROTOCOLS): "logits" or "hidden" (hidden states and
    # the lm_head weight; the floor is then hidden + weight + both gradients).
    inputs: str = "logits"
    # True when fn takes top_k= and top_p= (the filtered distribution's log-probs).
    filters: bool = False
