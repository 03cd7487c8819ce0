"""Log-probabilities tiled over tokens AND the vocabulary, with an online logsumexp.

:mod:`memprobe.kernels.local_chunked` works in one float32 ``[B, c, V]`` chunk:
0.5 GiB at c = 1024 and V = 131,072, whatever the sequence length, so at 1,024
tokens it doubles the floor. This kernel walks each token chunk in vocabulary
tiles of ``t`` columns and keeps a running max and a running sum of exps per
token (the online softmax of flash attention), so its float32 workspace is one
``[B, c, t]`` tile.

Memory contract, for logits ``[B, S, V]``, token chunk ``c`` and tile ``t``:

* forward saves the logits (their own dtype, no copy), the targets, and two
  float32 values per token (``[B, S]`` each, 8·B·S bytes in all): the row max
  and the log-sum ``log Σ exp(x - max)``, kept apart for precision (see
  :mod:`memprobe.kernels.local_chunked`);
* forward and backward work in one float32 ``[B, c, t]`` tile at a time, plus
  per-token ``[B, c]`` vectors; nothing is ever ``[B, c, V]``-sized;
* backward writes ``-softmax * grad_output`` tile by tile into a gradient of
  the logits' dtype (a new buffer, or the logits' own storage for the in-place
  variant), then the target column of each chunk as ``-expm1(logprob) *
  grad_output``, computed per token in float32 and rounded once.

So the backward peak is logits + gradient + one float32 tile (the floor plus
``4·B·c·t`` bytes, 8 MiB at the default 1024 × 2048), and the in-place variant
reaches logits + one tile.
"""

from __future__ import annotations

from typing import Any

import torch

from memprobe.kernels._checks import check_chunk_size, check_logprob_inputs

# Tokens per chunk and vocabulary columns per tile. 1024 × 2048 float32 is an
# 8 MiB tile: 1.6 % of the smallest floor the sweep targets (1,024 tokens ×
# 131,072 bf16 logits and their gradient, 512 MiB), and on CPU it runs as fast
# as local_chunked's 1024-token chunk (benchmarks/tiled_speed.py): each pass
# streams the chunk once either way, and a tile small enough to stay in cache
# makes the in-place passes over it cheaper.
DEFAULT_TILED_CHUNK_SIZE = 1024
DEFAULT_TILE_SIZE = 2048

_LOWEST = torch.finfo(torch.float32).min


def _resolve(chunk_size: int | None, tile_size: int | None) -> tuple[int, int]:
    check_chunk_size(chunk_size)
    if tile_size is not None and (isinstance(tile_size, bool) or int(tile_size) <= 0):
        raise ValueError(f"tile_size must be a positive integer or None, got {tile_size!r}")
    chunk = DEFAULT_TILED_CHUNK_SIZE if chunk_size is None else int(chunk_size)
    tile = DEFAULT_TILE_SIZE if tile_size is None else int(tile_size)
    return chunk, tile


def _tile_float32(logits: torch.Tensor, start: int, end: int, v0: int, v1: int) -> torch.Tensor:
    # copy=True: ``.to(float32)`` on float32 logits would alias the input, and
    # the tile is updated in place.
    return logits[:, start:end, v0:v1].to(dtype=torch.float32, copy=True)


def _tiled_forward(
    logits: torch.Tensor, targets: torch.Tensor, chunk: int, tile: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (target log-probs, row max, log-sum), all float32 ``[B, S]``."""
    batch, seq, vocab = logits.shape
    out = logits.new_empty((batch, seq), dtype=torch.float32)
    row_max = logits.new_empty((batch, seq), dtype=torch.float32)
    logsum = logits.new_empty((batch, seq), dtype=torch.float32)
    index = targets.long().unsqueeze(-1)
    for start in range(0, seq, chunk):
        end = min(start + chunk, seq)
        # Running max (never -inf, so a row of -inf never shifts by -inf) and
        # running sum of exp(x - running max).
        m = logits.new_full((batch, end - start), _LOWEST, dtype=torch.float32)
        total = logits.new_zeros((batch, end - start), dtype=torch.float32)
        for v0 in range(0, vocab, tile):
            work = _tile_float32(logits, start, end, v0, min(v0 + tile, vocab))
            new_m = torch.maximum(m, work.amax(dim=-1))
            # Rescale the sum so far to the new max (a factor <= 1).
            total.mul_(m.sub_(new_m).exp_())
            total.add_(work.sub_(new_m.unsqueeze(-1)).exp_().sum(dim=-1))
            m = new_m
            del work
        shifted_target = logits[:, start:end].gather(-1, index[:, start:end]).squeeze(-1)
        chunk_logsum = total.log_()
        out[:, start:end] = shifted_target.float().sub_(m).sub_(chunk_logsum)
        row_max[:, start:end] = m
        logsum[:, start:end] = chunk_logsum
    return out, row_max, logsum


def _tiled_backward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    row_max: torch.Tensor,
    logsum: torch.Tensor,
    grad_output: torch.Tensor,
    chunk: int,
    tile: int,
    grad: torch.Tensor,
) -> torch.Tensor:
    """Write d(logprob)/d(logits) · grad_output into ``grad``, tile by tile."""
    seq, vocab = logits.shape[1], logits.shape[2]
    index = targets.long().unsqueeze(-1)
    grad_output = grad_output.float()
    for start in range(0, seq, chunk):
        end = min(start + chunk, seq)
        m = row_max[:, start:end].unsqueeze(-1)
        ls = logsum[:, start:end].unsqueeze(-1)
        g = grad_output[:, start:end].unsqueeze(-1)
        idx = index[:, start:end]
        # Read before any tile is written: the in-place variant overwrites
        # the logits' storage as it goes.
        target_logprob = logits[:, start:end].gather(-1, idx).float().sub_(m).sub_(ls)
        neg_g = g.neg()
        for v0 in range(0, vocab, tile):
            v1 = min(v0 + tile, vocab)
            work = _tile_float32(logits, start, end, v0, v1)
            # -softmax * g, with softmax = exp((x - max) - logsum).
            work.sub_(m).sub_(ls).exp_().mul_(neg_g)
            grad[:, start:end, v0:v1].copy_(work)
            del work
        # The target column: (1 - p) * g = -expm1(logprob) * g, in float32 and
        # rounded once (adding g to an already rounded -p * g would round twice).
        target_grad = target_logprob.expm1_().mul_(neg_g)
        grad[:, start:end].scatter_(-1, idx, target_grad.to(grad.dtype))
    return grad


class LocalTiledLogprob(torch.autograd.Function):
    """Target log-probs of ``[B, S, V]`` logits, tiled over S and V, recomputed in backward.

    ``LocalTiledLogprob.apply(logits, targets, chunk_size, tile_size,
    inference_only)``. Saves the logits, the targets and two float32 values
    per token (row max and log-sum), or nothing when ``inference_only`` is
    true or no gradient is needed. The gradient has the logits' dtype.
    """

    writes_grad_into_logits = False

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        chunk_size: int | None = None,
        tile_size: int | None = None,
        inference_only: bool = False,
    ) -> torch.Tensor:
        check_logprob_inputs(logits, targets)
        chunk, tile = _resolve(chunk_size, tile_size)
        out, row_max, logsum = _tiled_forward(logits, targets, chunk, tile)
        ctx.sizes = (chunk, tile)
        ctx.saved_nothing = inference_only or not ctx.needs_input_grad[0]
        if not ctx.saved_nothing:
            ctx.save_for_backward(logits, targets, row_max, logsum)
        return out

    @classmethod
    def _grad_buffer(cls, logits: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(logits, memory_format=torch.contiguous_format)

    @classmethod
    def backward(cls, ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        if ctx.saved_nothing:
            raise RuntimeError(
                f"{cls.__name__} ran with inference_only=True (or without grad) "
                "and saved nothing: run it again with gradients enabled"
            )
        logits, targets, row_max, logsum = ctx.saved_tensors
        grad = cls._grad_buffer(logits)
        _tiled_backward(logits, targets, row_max, logsum, grad_output, *ctx.sizes, grad)
        return grad, None, None, None, None


class LocalTiledInplaceLogprob(LocalTiledLogprob):
    """As :class:`LocalTiledLogprob`, but backward CONSUMES the logits.

    The gradient is written into the logits' own storage (each tile is read
    before it is overwritten, and tiles do not overlap). Use it only when
    nothing reads the logits after backward. Peak: logits + one float32 tile.
    """

    writes_grad_into_logits = True

    @classmethod
    def _grad_buffer(cls, logits: torch.Tensor) -> torch.Tensor:
        return logits


def _apply(
    fn: type[LocalTiledLogprob],
    logits: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int | None,
    tile_size: int | None,
) -> torch.Tensor:
    inference_only = not (torch.is_grad_enabled() and logits.requires_grad)
    return fn.apply(logits, targets, chunk_size, tile_size, inference_only)


def local_tiled_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    tile_size: int | None = None,
) -> torch.Tensor:
    """:class:`LocalTiledLogprob`; ``None`` means 1024 tokens × 2048 vocabulary columns."""
    return _apply(LocalTiledLogprob, logits, targets, chunk_size, tile_size)


def local_tiled_inplace_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    tile_size: int | None = None,
) -> torch.Tensor:
    """:class:`LocalTiledInplaceLogprob`: backward overwrites the logits with the gradient."""
    return _apply(LocalTiledInplaceLogprob, logits, targets, chunk_size, tile_size)
