"""memprobe's fused lm_head + log-prob: the logits are never materialized.

``fused_linear_chunked_logprobs(hidden [B,S,H], weight [V,H], targets [B,S])``
returns float32 ``[B, S]`` target log-probs of ``softmax(hidden @ weight.T / T)``
and backpropagates into ``hidden`` and ``weight``.

Everything runs on float32 blocks of a token chunk (``c`` rows of the
flattened ``[N, H]`` hidden states, ``N = B·S``) and a vocabulary tile (``t``
rows of the weight):

* forward: for each token chunk, the float32 logits ``[c, t]`` of each tile
  (``hidden_c.float() @ weight_t.float().T``) feed an online logsumexp (running
  max and running sum of exps) and pick the target logit.
* backward, pass 1 (hidden gradient): for each token chunk, recompute each
  tile's logits, turn them into ``dlogits = (onehot - softmax) * grad_output``
  and accumulate ``dlogits @ weight_t`` in a float32 ``[c, H]`` block; cast it
  once into the hidden gradient.
* backward, pass 2 (weight gradient): for each vocabulary tile, recompute
  against every token chunk and accumulate ``dlogits.T @ hidden_c`` in a
  float32 ``[t, H]`` block; cast it once into the weight gradient.

Memory contract:

* saved for backward: ``hidden`` and ``weight`` (no copy), the targets, and two
  float32 values per token (row max and log-sum ``log Σ exp(x - max)``, kept
  apart for precision), 8·N bytes;
* workspace, per pass (allocated once, reused for every step): a float32
  hidden chunk ``[c, H]``, a float32 weight tile ``[t, H]``, a float32
  ``[c, t]`` logits tile, and in backward one float32 accumulator (``[c, H]``
  or ``[t, H]``), plus per-token vectors. Never a ``[N, V]`` tensor in any dtype,
  never a float32 ``[V, H]`` or ``[N, H]``;
* the gradients are new tensors in the inputs' dtype, each element written
  once from a float32 sum over the whole vocabulary (hidden) or all tokens
  (weight): the final rounding is the only low-precision step.

So the peak is the floor (hidden, weight, and their gradients) plus that
workspace. By default ``c`` and ``t`` make each float32 ``[., H]`` block 8 MiB
(``2**21 / H`` rows, 512 at H = 4096): about 25 MiB, 1.1 % of the floor at
20,000 tokens × 4096 × 131,072 bf16.

The matmuls run in float32 on upcast blocks (on every device, so the meta
simulation is exact for any of them): five ``N·V·H`` matmuls in all (one
forward, two per backward pass) against three for the unfused route.
"""

from __future__ import annotations

from typing import Any

import torch

from memprobe.kernels._checks import check_chunk_size, check_hidden_inputs

# Each float32 [rows, H] block (hidden chunk, weight tile, accumulator) holds
# at most this many elements by default: 8 MiB.
DEFAULT_BLOCK_ELEMENTS = 2**21
_MIN_ROWS, _MAX_ROWS = 64, 4096
_LOWEST = torch.finfo(torch.float32).min


def default_rows(hidden_size: int) -> int:
    """Rows of a default token chunk or vocabulary tile: a power of two holding
    at most :data:`DEFAULT_BLOCK_ELEMENTS` float32 values per ``[rows, H]`` block."""
    rows = max(1, DEFAULT_BLOCK_ELEMENTS // max(1, hidden_size))
    rows = 1 << (rows.bit_length() - 1)
    return min(max(rows, _MIN_ROWS), _MAX_ROWS)


def _resolve(
    chunk_size: int | None, tile_size: int | None, hidden_size: int, temperature: float
) -> tuple[int, int]:
    check_chunk_size(chunk_size)
    if tile_size is not None and (isinstance(tile_size, bool) or int(tile_size) <= 0):
        raise ValueError(f"tile_size must be a positive integer or None, got {tile_size!r}")
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    rows = default_rows(hidden_size)
    chunk = rows if chunk_size is None else int(chunk_size)
    tile = rows if tile_size is None else int(tile_size)
    return chunk, tile


class _Blocks:
    """The float32 blocks of one pass, allocated once and reused for every step.

    Allocating each block afresh costs more than the math on CPU: a multi-MiB
    block comes from a fresh mmap and page-faults its memory in again every
    time. Edge chunks and tiles use views of the full-size buffers.
    """

    def __init__(self, h2: torch.Tensor, weight: torch.Tensor, chunk: int, tile: int) -> None:
        chunk, tile = min(chunk, h2.shape[0]), min(tile, weight.shape[0])
        size = h2.shape[1]
        self.hidden = h2.new_empty((chunk, size), dtype=torch.float32)
        self.weight = h2.new_empty((tile, size), dtype=torch.float32)
        self.logits = h2.new_empty((chunk, tile), dtype=torch.float32)

    def load_hidden(self, h2: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        return self.hidden[: r1 - r0].copy_(h2[r0:r1])

    def load_weight(self, weight: torch.Tensor, v0: int, v1: int) -> torch.Tensor:
        return self.weight[: v1 - v0].copy_(weight[v0:v1])

    def logits_of(self, h_chunk: torch.Tensor, w_tile: torch.Tensor, inv_t: float) -> torch.Tensor:
        """Float32 ``[c, t]`` logits of two float32 blocks, divided by the temperature."""
        out = self.logits[: h_chunk.shape[0], : w_tile.shape[0]]
        torch.mm(h_chunk, w_tile.t(), out=out)
        return out if inv_t == 1.0 else out.mul_(inv_t)


def _dlogits_(
    logits: torch.Tensor,
    row_max: torch.Tensor,
    logsum: torch.Tensor,
    neg_g: torch.Tensor,
    local_target: torch.Tensor,
    owned_g: torch.Tensor,
    inv_t: float,
) -> torch.Tensor:
    """Turn a logits tile, in place, into d(logprob · g)/d(raw logits).

    ``(onehot - softmax) * g / T`` with softmax = ``exp((x - max) - logsum)``.
    """
    logits.sub_(row_max).sub_(logsum).exp_().mul_(neg_g)
    logits.scatter_add_(-1, local_target, owned_g)
    return logits if inv_t == 1.0 else logits.mul_(inv_t)


def _in_tile(targets: torch.Tensor, v0: int, v1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token ``(column in the tile, [c, 1]; owned, [c, 1] bool)``; others point at 0."""
    owned = (targets >= v0) & (targets < v1)
    local = (targets - v0).masked_fill_(~owned, 0)
    return local.unsqueeze(-1), owned.unsqueeze(-1)


def _forward(
    h2: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    tile: int,
    inv_t: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target log-probs, row max, log-sum), float32 ``[N]`` each."""
    tokens, vocab = h2.shape[0], weight.shape[0]
    out = h2.new_empty(tokens, dtype=torch.float32)
    row_max = h2.new_empty(tokens, dtype=torch.float32)
    logsum = h2.new_empty(tokens, dtype=torch.float32)
    blocks = _Blocks(h2, weight, chunk, tile)
    for r0 in range(0, tokens, chunk):
        r1 = min(r0 + chunk, tokens)
        h_chunk = blocks.load_hidden(h2, r0, r1)
        tgt = targets[r0:r1]
        m = h2.new_full((r1 - r0,), _LOWEST, dtype=torch.float32)
        total = h2.new_zeros((r1 - r0,), dtype=torch.float32)
        target_logit = h2.new_zeros((r1 - r0,), dtype=torch.float32)
        for v0 in range(0, vocab, tile):
            v1 = min(v0 + tile, vocab)
            logits = blocks.logits_of(h_chunk, blocks.load_weight(weight, v0, v1), inv_t)
            local, owned = _in_tile(tgt, v0, v1)
            # Each token's target sits in exactly one tile.
            target_logit.add_(logits.gather(-1, local).mul_(owned).squeeze(-1))
            new_m = torch.maximum(m, logits.amax(dim=-1))
            total.mul_(m.sub_(new_m).exp_())
            total.add_(logits.sub_(new_m.unsqueeze(-1)).exp_().sum(dim=-1))
            m = new_m
        chunk_logsum = total.log_()
        out[r0:r1] = target_logit.sub_(m).sub_(chunk_logsum)
        row_max[r0:r1] = m
        logsum[r0:r1] = chunk_logsum
    return out, row_max, logsum


def _grad_hidden(
    h2: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    row_max: torch.Tensor,
    logsum: torch.Tensor,
    g: torch.Tensor,
    chunk: int,
    tile: int,
    inv_t: float,
) -> torch.Tensor:
    """Pass 1: token chunks outside, vocabulary tiles inside, a float32 ``[c, H]`` sum."""
    tokens, vocab = h2.shape[0], weight.shape[0]
    grad = torch.empty_like(h2, memory_format=torch.contiguous_format)
    blocks = _Blocks(h2, weight, chunk, tile)
    accumulator = torch.empty_like(blocks.hidden)
    for r0 in range(0, tokens, chunk):
        r1 = min(r0 + chunk, tokens)
        h_chunk = blocks.load_hidden(h2, r0, r1)
        acc = accumulator[: r1 - r0].zero_()
        m, ls = row_max[r0:r1].unsqueeze(-1), logsum[r0:r1].unsqueeze(-1)
        gc = g[r0:r1].unsqueeze(-1)
        neg_g = gc.neg()
        for v0 in range(0, vocab, tile):
            v1 = min(v0 + tile, vocab)
            w_tile = blocks.load_weight(weight, v0, v1)
            local, owned = _in_tile(targets[r0:r1], v0, v1)
            logits = blocks.logits_of(h_chunk, w_tile, inv_t)
            acc.addmm_(_dlogits_(logits, m, ls, neg_g, local, gc * owned, inv_t), w_tile)
        grad[r0:r1].copy_(acc)
    return grad


def _grad_weight(
    h2: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    row_max: torch.Tensor,
    logsum: torch.Tensor,
    g: torch.Tensor,
    chunk: int,
    tile: int,
    inv_t: float,
) -> torch.Tensor:
    """Pass 2: vocabulary tiles outside, token chunks inside, a float32 ``[t, H]`` sum."""
    tokens, vocab = h2.shape[0], weight.shape[0]
    grad = torch.empty_like(weight, memory_format=torch.contiguous_format)
    neg_g = g.neg().unsqueeze(-1)
    blocks = _Blocks(h2, weight, chunk, tile)
    accumulator = torch.empty_like(blocks.weight)
    for v0 in range(0, vocab, tile):
        v1 = min(v0 + tile, vocab)
        w_tile = blocks.load_weight(weight, v0, v1)
        acc = accumulator[: v1 - v0].zero_()
        for r0 in range(0, tokens, chunk):
            r1 = min(r0 + chunk, tokens)
            h_chunk = blocks.load_hidden(h2, r0, r1)
            local, owned = _in_tile(targets[r0:r1], v0, v1)
            dlogits = _dlogits_(
                blocks.logits_of(h_chunk, w_tile, inv_t),
                row_max[r0:r1].unsqueeze(-1),
                logsum[r0:r1].unsqueeze(-1),
                neg_g[r0:r1],
                local,
                g[r0:r1].unsqueeze(-1) * owned,
                inv_t,
            )
            acc.addmm_(dlogits.t(), h_chunk)
        grad[v0:v1].copy_(acc)
    return grad


class FusedLinearChunkedLogprob(torch.autograd.Function):
    """``FusedLinearChunkedLogprob.apply(hidden, weight, targets, chunk_size,
    tile_size, temperature, inference_only)`` → float32 ``[B, S]``.

    See the module docstring for the memory contract. Saves nothing when
    ``inference_only`` is true or neither input needs a gradient.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk_size: int | None = None,
        tile_size: int | None = None,
        temperature: float = 1.0,
        inference_only: bool = False,
    ) -> torch.Tensor:
        check_hidden_inputs(hidden, weight, targets)
        chunk, tile = _resolve(chunk_size, tile_size, hidden.shape[-1], temperature)
        batch, seq, size = hidden.shape
        inv_t = 1.0 / float(temperature)
        # A view for contiguous hidden states (the usual case): no copy.
        h2 = hidden.reshape(batch * seq, size)
        flat_targets = targets.reshape(batch * seq).long()
        out, row_max, logsum = _forward(h2, weight, flat_targets, chunk, tile, inv_t)
        ctx.sizes = (chunk, tile, inv_t)
        ctx.saved_nothing = inference_only or not any(ctx.needs_input_grad[:2])
        if not ctx.saved_nothing:
            ctx.save_for_backward(hidden, weight, targets, row_max, logsum)
        return out.view(batch, seq)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        if ctx.saved_nothing:
            raise RuntimeError(
                "FusedLinearChunkedLogprob ran with inference_only=True (or without grad) "
                "and saved nothing: run it again with gradients enabled"
            )
        hidden, weight, targets, row_max, logsum = ctx.saved_tensors
        chunk, tile, inv_t = ctx.sizes
        batch, seq, size = hidden.shape
        h2 = hidden.reshape(batch * seq, size)
        flat_targets = targets.reshape(batch * seq).long()
        g = grad_output.reshape(batch * seq).float()
        args = (h2, weight, flat_targets, row_max, logsum, g, chunk, tile, inv_t)
        grad_hidden = (
            _grad_hidden(*args).view(batch, seq, size) if ctx.needs_input_grad[0] else None
        )
        grad_weight = _grad_weight(*args) if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None, None


def fused_linear_chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    tile_size: int | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """:class:`FusedLinearChunkedLogprob`: log-probs of ``softmax(hidden @ weight.T / T)``.

    ``chunk_size`` tokens per chunk and ``tile_size`` vocabulary rows per tile;
    ``None`` means :func:`default_rows` of the hidden size (512 at H = 4096).
    """
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return FusedLinearChunkedLogprob.apply(
        hidden, weight, targets, chunk_size, tile_size, temperature, not wants_grad
    )
