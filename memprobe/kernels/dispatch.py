"""``next_token_logprobs``: shift, pick a kernel, and pre-cast only when it helps."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from memprobe.kernels.registry import get_spec

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def _dtensor_type() -> type[DTensor] | None:
    """``DTensor`` when this torch build has it, else None (import is lazy and optional)."""
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch builds without DTensor
        return None
    return DTensor


def _vocab_shard(logits: Any) -> tuple[torch.Tensor, Any, int, int]:
    """A DTensor sharded on the vocabulary → (local shard, its group, vocab range).

    The vocabulary must be ``Shard(2)`` on exactly one mesh dimension and the
    other mesh dimensions ``Replicate``. Shards follow DTensor's ``torch.chunk``
    rule: ``ceil(V / n)`` columns each, the last ones possibly shorter.
    """
    from torch.distributed.tensor import Replicate, Shard

    placements = tuple(logits.placements)
    vocab_dims = [i for i, p in enumerate(placements) if isinstance(p, Shard) and p.dim in (2, -1)]
    others_replicated = all(
        isinstance(p, Replicate) for i, p in enumerate(placements) if i not in vocab_dims
    )
    if len(vocab_dims) != 1 or not others_replicated:
        raise ValueError(
            "DTensor logits must be sharded on the vocabulary (Shard(2)) on one mesh "
            f"dimension and replicated on the others, got placements {placements}"
        )
    mesh_dim = vocab_dims[0]
    mesh = logits.device_mesh
    vocab = int(logits.shape[2])
    step = -(-vocab // mesh.size(mesh_dim))
    start = min(mesh.get_local_rank(mesh_dim) * step, vocab)
    end = min(start + step, vocab)
    # to_local is differentiable: the shard's gradient flows back to the DTensor.
    local = logits.to_local()
    if local.shape[-1] != end - start:
        raise ValueError(
            f"DTensor local shard has {local.shape[-1]} vocabulary columns, expected "
            f"{end - start} for ids [{start}, {end})"
        )
    return local, mesh.get_group(mesh_dim), start, end


def _replicated_local(ids: Any, dtensor: type[DTensor]) -> torch.Tensor:
    from torch.distributed.tensor import Replicate

    if not isinstance(ids, dtensor):
        return ids
    if not all(isinstance(p, Replicate) for p in ids.placements):
        raise ValueError(f"DTensor input_ids must be replicated, got {tuple(ids.placements)}")
    return ids.to_local()


def select_kernel(top_k: int | None = None, top_p: float | None = None) -> str:
    """Chunk locally; with filters, the chunked filtered kernel."""
    return "filtered_chunked" if top_k is not None or top_p is not None else "local_chunked"


def next_token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    chunk_size: int | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    kernel: str | None = None,
) -> torch.Tensor:
    """Log-prob of each next token: ``out[b, s] = log p(input_ids[b, s+1] | logits[b, s])``.

    Returns float32 ``[B, S-1]``. ``kernel`` overrides the choice (filters need
    ``filtered_chunked``, the default with filters, or ``filtered``). The whole
    tensor is cast to float32 first only when the chosen kernel does not cast
    chunk by chunk itself.

    ``logits`` may be a DTensor sharded on the vocabulary (``Shard(2)``): its
    local shard, mesh group and vocabulary range go to a distributed kernel
    (``chunked_distributed`` unless ``kernel`` names the other one), and the
    result is a plain, non-distributed ``[B, S-1]`` tensor, the same on every
    rank of the vocabulary group. Gradients flow back to the DTensor.
    ``input_ids`` may then be a plain tensor or a replicated DTensor.
    """
    dtensor = _dtensor_type()
    shard: dict[str, Any] = {}
    if dtensor is not None and isinstance(logits, dtensor):
        name = "chunked_distributed" if kernel is None else kernel
        if not get_spec(name).distributed:
            raise ValueError(f"DTensor logits need a distributed kernel, not {name!r}")
        if tuple(input_ids.shape) != tuple(logits.shape[:2]):
            raise ValueError(
                f"expected input_ids [B, S] = {tuple(logits.shape[:2])} for DTensor logits "
                f"{tuple(logits.shape)}, got {tuple(input_ids.shape)}"
            )
        input_ids = _replicated_local(input_ids, dtensor)
        logits, group, vocab_start, vocab_end = _vocab_shard(logits)
        shard = {"group": group, "vocab_start": vocab_start, "vocab_end": vocab_end}
    else:
        # None, not any falsy value, means "choose": kernel="" is an unknown name.
        name = select_kernel(top_k, top_p) if kernel is None else kernel
    spec = get_spec(name)
    if spec.inputs != "logits":
        raise ValueError(f"{name!r} takes hidden states and an lm_head weight, not logits")
    if (top_k is not None or top_p is not None) and not spec.filters:
        raise ValueError(
            f"top_k / top_p need a filtered kernel ('filtered_chunked' or 'filtered'), not {name!r}"
        )
    if (
        logits.dim() != 3
        or input_ids.dim() != 2
        or tuple(input_ids.shape) != tuple(logits.shape[:2])
    ):
        raise ValueError(
            f"expected logits [B, S, V] and input_ids [B, S], got {tuple(logits.shape)} "
            f"and {tuple(input_ids.shape)}"
        )
    # Shift by padding the targets rather than slicing the logits: slicing
    # logits[:, :-1] would make autograd build a full-size zero gradient for
    # the slice. The padded last position is dropped from the output, so it
    # gets a zero gradient.
    targets = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)
    if not spec.casts_per_chunk:
        logits = logits.float()
    filters = {"top_k": top_k, "top_p": top_p} if spec.filters else {}
    # The filters and the shard's keywords are the chosen kernel's own, beyond the protocol.
    fn: Callable[..., torch.Tensor] = spec.fn
    out = fn(logits, targets, chunk_size=chunk_size, **filters, **shard)
    return out[:, :-1]
