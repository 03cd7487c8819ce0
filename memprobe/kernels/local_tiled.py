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
* forward and backward each allocate one float32 ``[B, c, t]`` tile buffer,
  reused for every tile, plus per-token ``[B, c]`` vectors; nothing is ever
  ``[B, c, V]``-sized;
* backward writes ``-softmax * grad_output`` tile by tile into a gradient of
  the logits' dtype (a new buffer, or the logits' own storage for the in-place
  variant), then the target column of each chunk as ``-expm1(logprob) *
  grad_output``, computed per token in float32 and rounded once.

So the backward peak is logits + gradient + one float32 tile (the floor plus
``4·B·c·t`` bytes, 4 MiB at the default 1024 × 1024), and the in-place variant
reaches logits + one tile.
"""

from __future__ import annotations

from typing import Any

import torch

from memprobe.kernels._checks import (
    check_chunk_size,
    check_logprob_inputs,
    check_size_parameter,
    no_grad_wanted,
)
from memprobe.kernels._steps import block_starts

# Tokens per chunk and vocabulary columns per tile. 1024 x 1024 float32 is a
# 4 MiB tile: 1.6 % of the smallest floor the sweep targets even for the
# in-place variant (1,024 tokens x 131,072 bf16 logits, 256 MiB), where a
# 2048-column tile would be 3.1 %. Every pass streams each tile once either
# way, and a 4 MiB tile stays in a CPU's L3 (and a GPU's L2 class of cache)
# while the in-place passes run over it; benchmarks/tiled_speed.py compares it
# with local_chunked's 1024-token chunk. The chunk matches local_chunked's so
# --chunk-size means the same thing for both.
DEFAULT_TILED_CHUNK_SIZE = 1024
DEFAULT_TILE_SIZE = 1024

_LOWEST = torch.finfo(torch.float32).min


def _resolve(chunk_size: int | None, tile_size: int | None) -> tuple[int, int]:
    check_chunk_size(chunk_size)
    check_size_parameter("tile_size", tile_size)
    chunk = DEFAULT_TILED_CHUNK_SIZE if chunk_size is None else int(chunk_size)
    tile = DEFAULT_TILE_SIZE if tile_size is None else int(tile_size)
    return chunk, tile


class _TileBuffer:
    """One float32 ``[B, c, t]`` buffer, reused for every tile of a pass.

    Allocating each tile afresh costs more than the math on CPU: a multi-MiB
    block comes from a fresh mmap, so every tile would page-fault its memory
    in again (about 5x slower at 4 MiB tiles). Edge tiles use a view of it.
    """

    def __init__(self, logits: torch.Tensor, chunk: int, tile: int) -> None:
        batch, seq, vocab = logits.shape
        shape = (batch, min(chunk, seq), min(tile, vocab))
        self.buffer = logits.new_empty(shape, dtype=torch.float32)

    def load(self, logits: torch.Tensor, start: int, end: int, v0: int, v1: int) -> torch.Tensor:
        """The float32 copy of ``logits[:, start:end, v0:v1]`` (never aliases the logits)."""
        work = self.buffer[:, : end - start, : v1 - v0]
        return work.copy_(logits[:, start:end, v0:v1])


def _tiled_forward(
    logits: torch.Tensor, targets: torch.Tensor, chunk: int, tile: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (target log-probs, row max, log-sum), all float32 ``[B, S]``."""
    batch, seq, vocab = logits.shape
    out = logits.new_empty((batch, seq), dtype=torch.float32)
    row_max = logits.new_empty((batch, seq), dtype=torch.float32)
    logsum = logits.new_empty((batch, seq), dtype=torch.float32)
    index = targets.long().unsqueeze(-1)
    tiles = _TileBuffer(logits, chunk, tile)
    for start in block_starts(seq, chunk, logits):
        end = min(start + chunk, seq)
        # Running max (never -inf, so a row of -inf never shifts by -inf) and
        # running sum of exp(x - running max).
        m = logits.new_full((batch, end - start), _LOWEST, dtype=torch.float32)
        total = logits.new_zeros((batch, end - start), dtype=torch.float32)
        for v0 in block_starts(vocab, tile, logits):
            work = tiles.load(logits, start, end, v0, min(v0 + tile, vocab))
            new_m = torch.maximum(m, work.amax(dim=-1))
            # Rescale the sum so far to the new max (a factor <= 1).
            total.mul_(m.sub_(new_m).exp_())
            total.add_(work.sub_(new_m.unsqueeze(-1)).exp_().sum(dim=-1))
            m = new_m
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
    tiles = _TileBuffer(logits, chunk, tile)
    for start in block_starts(seq, chunk, logits):
        end = min(start + chunk, seq)
        m = row_max[:, start:end].unsqueeze(-1)
        ls = logsum[:, start:end].unsqueeze(-1)
        g = grad_output[:, start:end].unsqueeze(-1)
        idx = index[:, start:end]
        # Read before any tile is written: the in-place variant overwrites
        # the logits' storage as it goes.
        target_logprob = logits[:, start:end].gather(-1, idx).float().sub_(m).sub_(ls)
        neg_g = g.neg()
        for v0 in block_starts(vocab, tile, logits):
            v1 = min(v0 + tile, vocab)
            work = tiles.load(logits, start, end, v0, v1)
            # -softmax * g, with softmax = exp((x - max) - logsum).
            work.sub_(m).sub_(ls).exp_().mul_(neg_g)
            grad[:, start:end, v0:v1].copy_(work)
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

    @staticmethod
    def forward(
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
    def backward(cls, ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        if ctx.saved_nothing:
            raise RuntimeError(
                f"{cls.__name__} ran with inference_only=True (or without grad) "
                "and saved nothing: run it again with gradients enabled"
            )
        logits, targets, row_max, logsum = ctx.saved_tensors
        grad = cls._grad_buffer(logits)
        chunk, tile = ctx.sizes
        _tiled_backward(logits, targets, row_max, logsum, grad_output, chunk, tile, grad)
        return grad, None, None, None, None


class LocalTiledInplaceLogprob(LocalTiledLogprob):
    """As :class:`LocalTiledLogprob`, but backward CONSUMES the logits.

    The gradient is written into the logits' own storage (each tile is read
    before it is overwritten, and tiles do not overlap). Use it only when
    nothing reads the logits after backward. Peak: logits + one float32 tile.
    """

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
    return fn.apply(logits, targets, chunk_size, tile_size, no_grad_wanted(logits, targets))


def local_tiled_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    tile_size: int | None = None,
) -> torch.Tensor:
    """:class:`LocalTiledLogprob`; ``None`` means 1024 tokens × 1024 vocabulary columns."""
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
