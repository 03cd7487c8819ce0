"""memprobe's fused lm_head + log-prob: the logits are never materialized.

``fused_linear_chunked_logprobs(hidden [B,S,H], weight [V,H], targets [B,S])``
returns float32 ``[B, S]`` target log-probs of ``softmax(hidden @ weight.T / T)``
and backpropagates into ``hidden`` and ``weight``. ``N = B·S`` tokens.

* forward: token chunks (``c`` rows of the flattened hidden states) against
  vocabulary tiles (``t`` rows of the weight), on float32 copies of both; the
  float32 logits ``[c, t]`` of each tile feed an online logsumexp (running max
  and running sum of exps) and pick the target logit and each row's argmax.
  Nothing is rounded to the inputs' dtype.
* backward recomputes the logits in the inputs' dtype, **centered on each
  token's max**: the matmul gets ``-T·max`` (rounded to that dtype, so exact)
  as its bias, accumulates in float32 and rounds once, so a logit's rounding
  error scales with its distance below the max, not with its size: the logits
  that carry the probability come back almost exact. The softmax (float32)
  turns them into ``dlogits = (onehot - softmax) · grad_output / T``, the input
  of one matmul per gradient, in the inputs' dtype:

  - pass 1 (hidden gradient): ``[c', V]`` blocks, all of the vocabulary for
    ``c'`` tokens; ``dlogits @ weight`` writes each gradient row once;
  - pass 2 (weight gradient): ``[N, t']`` blocks, all tokens for ``t'``
    vocabulary rows; ``dlogits.T @ hidden`` writes each gradient row once.

  Rounding ``dlogits`` to the inputs' dtype would add an error the size of
  the final rounding wherever one entry dominates a sum: each row's target
  and argmax entries. Those two are written from the forward's exact values
  and their rounding residuals go back in as the matmul's bias; the other
  entries are small and their roundings average out. Each gradient element is
  one float32 sum over the whole vocabulary (hidden) or all tokens (weight),
  rounded once: against float64, the worst errors match a float32 computation
  rounded once (``benchmarks/hidden_numerics.py``).

Memory contract:

* saved for backward: ``hidden`` and ``weight`` (no copy), the targets, and per
  token the row max and log-sum ``log Σ exp(x - max)`` (float32, kept apart
  for precision) and the argmax (int64): 16·N bytes;
* workspace, one phase at a time, each allocated once and reused: forward, a
  float32 hidden chunk ``[c, H]``, weight tile ``[t, H]`` and logits tile
  ``[c, t]``; backward, one block in the inputs' dtype (``[c', V]`` in pass 1,
  ``[N, t']`` in pass 2, each at most :data:`BACKWARD_BLOCK_BYTES`), a float32
  scratch of :data:`SCRATCH_ELEMENTS` for its softmax, and the bias's rows
  (``[c', H]`` in pass 1; in pass 2 the weight gradient itself holds the bias,
  built from ``[SCRATCH_ELEMENTS / H, H]`` slices). Logits never take more than
  that block: an ``[N, V]`` tensor only when it fits in
  :data:`BACKWARD_BLOCK_BYTES` (short sequences, small vocabularies), never a
  float32 one, and never a float32 ``[V, H]`` or ``[N, H]``;
* the gradients are new tensors in the inputs' dtype.

So the peak is the floor (hidden, weight, and their gradients) plus a few
tens of MiB: 1.008 × the floor at 20,000 tokens × 4096 × 131,072 bf16.

Cost: five ``N·V·H`` matmuls (one forward, two per backward pass) against
three for the unfused route. The forward's are float32: on CPU with bf16
inputs they run in oneDNN's bf16 math mode, exact here because the float32
blocks are copies of bf16 values (twice a bf16 matmul's time on a CPU with
bf16 units, against four or more for float32). The backward's run in the
inputs' dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memprobe.kernels._checks import check_chunk_size, check_hidden_inputs, check_size_parameter
from memprobe.kernels._steps import block_starts

# Each float32 [rows, H] block of the forward (hidden chunk, weight tile) holds
# at most this many elements by default: 8 MiB.
DEFAULT_BLOCK_ELEMENTS = 2**21
# The backward's block of recomputed logits ([c', V] or [N, t'], inputs' dtype)
# holds at most this many bytes: 16 MiB. Pass 1's matmul has c' rows, and CPU
# GEMMs lose speed below about 256 rows, which this allows up to V = 32,768 in bf16.
BACKWARD_BLOCK_BYTES = 2**24
# Float32 scratch for the softmax of a slice of that block: 4 MiB.
SCRATCH_ELEMENTS = 2**20
_MIN_ROWS, _MAX_ROWS = 64, 4096
_LOWEST = torch.finfo(torch.float32).min


def default_rows(hidden_size: int) -> int:
    """Rows of a default token chunk or vocabulary tile: a power of two holding
    at most :data:`DEFAULT_BLOCK_ELEMENTS` float32 values per ``[rows, H]`` block."""
    rows = _rows_within(4 * DEFAULT_BLOCK_ELEMENTS, 4 * max(1, hidden_size), _MAX_ROWS)
    return max(rows, _MIN_ROWS)


def _rows_within(budget: int, row_bytes: int, cap: int) -> int:
    """Rows of ``row_bytes`` each within ``budget``: a power of two in ``[1, cap]``."""
    rows = max(1, budget // max(1, row_bytes))
    return max(1, min(cap, 1 << (rows.bit_length() - 1)))


@contextlib.contextmanager
def _bf16_valued_matmuls(dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """Let CPU float32 matmuls of bf16-valued blocks run on bf16 units (oneDNN's
    bf16 math mode), restored on exit.

    The forward's float32 blocks are copies of bf16 tensors, so rounding them to
    bf16 loses nothing; the matmul still accumulates and returns float32, about
    twice as fast as a float32 GEMM. The setting is process-wide while the
    forward runs. Elsewhere (other dtypes or devices, a torch without the
    setting) this does nothing.
    """
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    if (
        matmul is None
        or dtype != torch.bfloat16
        or device.type != "cpu"
        or not hasattr(matmul, "fp32_precision")
    ):
        yield
        return
    before = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = before


def _resolve(
    chunk_size: int | None, tile_size: int | None, hidden_size: int, temperature: float
) -> tuple[int, int]:
    check_chunk_size(chunk_size)
    check_size_parameter("tile_size", tile_size)
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


def _in_tile(columns: torch.Tensor, v0: int, v1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(column in the tile, inside)`` for vocabulary columns; those outside point at 0."""
    inside = (columns >= v0) & (columns < v1)
    return (columns - v0).masked_fill_(~inside, 0), inside


def _forward(
    h2: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    tile: int,
    inv_t: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target log-probs, row max, log-sum), float32 ``[N]`` each, and each row's argmax."""
    tokens, vocab = h2.shape[0], weight.shape[0]
    out = h2.new_empty(tokens, dtype=torch.float32)
    row_max = h2.new_empty(tokens, dtype=torch.float32)
    logsum = h2.new_empty(tokens, dtype=torch.float32)
    argmax = h2.new_empty(tokens, dtype=torch.long)
    blocks = _Blocks(h2, weight, chunk, tile)
    for r0 in block_starts(tokens, chunk, h2):
        r1 = min(r0 + chunk, tokens)
        h_chunk = blocks.load_hidden(h2, r0, r1)
        tgt = targets[r0:r1].unsqueeze(-1)
        m = h2.new_full((r1 - r0,), _LOWEST, dtype=torch.float32)
        arg = h2.new_zeros((r1 - r0,), dtype=torch.long)
        total = h2.new_zeros((r1 - r0,), dtype=torch.float32)
        target_logit = h2.new_zeros((r1 - r0,), dtype=torch.float32)
        for v0 in block_starts(vocab, tile, h2):
            v1 = min(v0 + tile, vocab)
            logits = blocks.logits_of(h_chunk, blocks.load_weight(weight, v0, v1), inv_t)
            local, owned = _in_tile(tgt, v0, v1)
            # Each token's target sits in exactly one tile.
            target_logit.add_(logits.gather(-1, local).mul_(owned).squeeze(-1))
            tile_max, tile_arg = logits.max(dim=-1)
            arg = torch.where(tile_max > m, tile_arg + v0, arg)
            new_m = torch.maximum(m, tile_max)
            total.mul_(m.sub_(new_m).exp_())
            total.add_(logits.sub_(new_m.unsqueeze(-1)).exp_().sum(dim=-1))
            m = new_m
        chunk_logsum = total.log_()
        out[r0:r1] = target_logit.sub_(m).sub_(chunk_logsum)
        row_max[r0:r1] = m
        logsum[r0:r1] = chunk_logsum
        argmax[r0:r1] = arg
    return out, row_max, logsum, argmax


def _centering(
    row_max: torch.Tensor, logsum: torch.Tensor, inv_t: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token ``(bias [N, 1] in dtype, shift [N, 1] float32)`` for the recomputed logits.

    The bias is ``-T·max`` rounded to ``dtype``, exact as a matmul bias; the
    shift completes the log-softmax in raw-logit units:
    ``x/T - max - logsum = ((x - T·max') - T·shift) / T``.
    """
    ref = row_max.div(inv_t).to(dtype)
    shift = (row_max + logsum).div_(inv_t).sub_(ref.float())
    return ref.neg_().unsqueeze(-1), shift.unsqueeze(-1)


def _dominant_entries(
    argmax: torch.Tensor,
    targets: torch.Tensor,
    logsum: torch.Tensor,
    logprobs: torch.Tensor,
    g: torch.Tensor,
    inv_t: float,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's argmax and target entries of ``dlogits``, ``[N, 2]`` float32 each:
    their exact values (from the forward: p(argmax) = exp(-logsum),
    p(target) = exp(logprob)) and what rounding them to ``dtype`` loses.

    They dominate the gradient matmuls, so the passes add the loss back as the
    matmul's bias. A target that is also the argmax counts once, in the first
    column.
    """
    is_target = (argmax == targets).float()
    exact = torch.stack((is_target - logsum.neg().exp(), 1 - logprobs.exp()), -1)
    exact.mul_(g).mul_(inv_t)
    lost = exact - exact.to(dtype).float()
    lost[:, 1].mul_(1 - is_target)
    return exact, lost


@dataclass(frozen=True)
class _TokenRows:
    """What the backward knows per token (row i of each tensor), sliced as a whole."""

    bias: torch.Tensor  # [N, 1] inputs' dtype: -T·max, the recompute's matmul bias
    shift: torch.Tensor  # [N, 1] float32: the rest of the log-softmax (_centering)
    g: torch.Tensor  # [N, 1] float32: the upstream gradient
    largest: torch.Tensor  # [N, 2] int64: argmax and target columns
    exact: torch.Tensor  # [N, 2] float32: their dlogits, from the forward
    lost: torch.Tensor  # [N, 2] float32: what rounding those to the inputs' dtype loses
    inv_t: float

    def __getitem__(self, rows: slice) -> _TokenRows:
        return _TokenRows(
            bias=self.bias[rows],
            shift=self.shift[rows],
            g=self.g[rows],
            largest=self.largest[rows],
            exact=self.exact[rows],
            lost=self.lost[rows],
            inv_t=self.inv_t,
        )


def _dlogits_(x: torch.Tensor, scratch: torch.Tensor, tok: _TokenRows, v0: int) -> None:
    """Overwrite ``x`` (centered logits of vocabulary rows ``v0:`` for ``tok``'s
    tokens, inputs' dtype) with ``(onehot - softmax) · g / T``, computed in the
    float32 ``scratch``.

    The argmax and target entries take ``tok.exact``, the forward's values: the
    one-hot lands with them, and both passes round exactly the same numbers.
    """
    inv_t = tok.inv_t
    z = torch.sub(x, tok.shift, out=scratch)
    if inv_t != 1.0:
        z.mul_(inv_t)
    z.exp_().mul_(tok.g.neg())
    if inv_t != 1.0:
        z.mul_(inv_t)
    local, inside = _in_tile(tok.largest, v0, v0 + x.shape[1])
    # One column at a time: a target that is also the argmax is written twice
    # with the same value, and a column outside the tile gets its own value back.
    for j in range(tok.largest.shape[1]):
        at = local[:, j : j + 1]
        keep = inside[:, j : j + 1]
        z.scatter_(-1, at, torch.where(keep, tok.exact[:, j : j + 1], z.gather(-1, at)))
    x.copy_(z)


def _grad_hidden(
    h2: torch.Tensor, weight: torch.Tensor, tok: _TokenRows, rows: int
) -> torch.Tensor:
    """Pass 1: ``[rows, V]`` blocks; one matmul per block writes its rows of the gradient."""
    tokens, vocab = h2.shape[0], weight.shape[0]
    grad = torch.empty_like(h2, memory_format=torch.contiguous_format)
    rows = min(rows, tokens)
    block = h2.new_empty((rows, vocab))
    cols = max(1, min(vocab, SCRATCH_ELEMENTS // rows))
    scratch = h2.new_empty((rows, cols), dtype=torch.float32)
    for r0 in block_starts(tokens, rows, h2):
        r1 = min(r0 + rows, tokens)
        chunk = tok[r0:r1]
        x = torch.addmm(chunk.bias, h2[r0:r1], weight.t(), out=block[: r1 - r0])
        for v0 in block_starts(vocab, cols, h2):
            v1 = min(v0 + cols, vocab)
            _dlogits_(x[:, v0:v1], scratch[: r1 - r0, : v1 - v0], chunk, v0)
        # The matmul's bias: the residuals times their weight rows.
        out = grad[r0:r1]
        residual = chunk.lost.to(h2.dtype)
        torch.index_select(weight, 0, chunk.largest[:, 0], out=out).mul_(residual[:, :1])
        out.addcmul_(weight[chunk.largest[:, 1]], residual[:, 1:])
        out.addmm_(x, weight)
    return grad


def _grad_weight(
    h2: torch.Tensor, weight: torch.Tensor, tok: _TokenRows, cols: int
) -> torch.Tensor:
    """Pass 2: ``[N, cols]`` blocks; one matmul per block writes its rows of the gradient."""
    tokens, vocab = h2.shape[0], weight.shape[0]
    # The matmuls' bias first: each residual times its token's hidden state,
    # added into the row of its column.
    grad = torch.zeros_like(weight, memory_format=torch.contiguous_format)
    rows = max(1, min(tokens, SCRATCH_ELEMENTS // h2.shape[1]))
    for r0 in block_starts(tokens, rows, h2):
        r1 = min(r0 + rows, tokens)
        for j in range(tok.largest.shape[1]):
            residual = tok.lost[r0:r1, j : j + 1].to(h2.dtype)
            grad.index_add_(0, tok.largest[r0:r1, j], h2[r0:r1] * residual)
    cols = min(cols, vocab)
    # Flat storage, so the narrower last tile is a contiguous view too.
    storage = h2.new_empty(tokens * cols)
    rows = max(1, min(tokens, SCRATCH_ELEMENTS // cols))
    scratch = h2.new_empty((rows, cols), dtype=torch.float32)
    for v0 in block_starts(vocab, cols, h2):
        v1 = min(v0 + cols, vocab)
        x = storage[: tokens * (v1 - v0)].view(tokens, v1 - v0)
        torch.addmm(tok.bias, h2, weight[v0:v1].t(), out=x)
        for r0 in block_starts(tokens, rows, h2):
            r1 = min(r0 + rows, tokens)
            _dlogits_(x[r0:r1], scratch[: r1 - r0, : v1 - v0], tok[r0:r1], v0)
        grad[v0:v1].addmm_(x.t(), h2)
    return grad


class FusedLinearChunkedLogprob(torch.autograd.Function):
    """``FusedLinearChunkedLogprob.apply(hidden, weight, targets, chunk_size,
    tile_size, temperature, inference_only)`` → float32 ``[B, S]``.

    See the module docstring for the memory contract. Saves nothing when
    ``inference_only`` is true or neither input needs a gradient.
    """

    @staticmethod
    def forward(
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
        with _bf16_valued_matmuls(hidden.dtype, hidden.device):
            out, row_max, logsum, argmax = _forward(h2, weight, flat_targets, chunk, tile, inv_t)
        ctx.sizes = (chunk, tile, inv_t)
        ctx.saved_nothing = inference_only or not any(ctx.needs_input_grad[:2])
        if not ctx.saved_nothing:
            ctx.save_for_backward(hidden, weight, targets, row_max, logsum, argmax, out)
        return out.view(batch, seq)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        if ctx.saved_nothing:
            raise RuntimeError(
                "FusedLinearChunkedLogprob ran with inference_only=True (or without grad) "
                "and saved nothing: run it again with gradients enabled"
            )
        hidden, weight, targets, row_max, logsum, argmax, logprobs = ctx.saved_tensors
        chunk, tile, inv_t = ctx.sizes
        batch, seq, size = hidden.shape
        h2 = hidden.reshape(batch * seq, size)
        flat_targets = targets.reshape(batch * seq).long()
        g = grad_output.reshape(batch * seq, 1).float()
        tokens, vocab = h2.shape[0], weight.shape[0]
        bias, shift = _centering(row_max, logsum, inv_t, hidden.dtype)
        largest = torch.stack((argmax, flat_targets), dim=-1)
        exact, lost = _dominant_entries(argmax, flat_targets, logsum, logprobs, g, inv_t, h2.dtype)
        tok = _TokenRows(bias, shift, g, largest, exact, lost, inv_t)
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            rows = min(chunk, _rows_within(BACKWARD_BLOCK_BYTES, vocab * h2.element_size(), tokens))
            grad_hidden = _grad_hidden(h2, weight, tok, rows).view(batch, seq, size)
        if ctx.needs_input_grad[1]:
            cols = min(tile, _rows_within(BACKWARD_BLOCK_BYTES, tokens * h2.element_size(), vocab))
            grad_weight = _grad_weight(h2, weight, tok, cols)
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
