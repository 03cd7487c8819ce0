"""The records of shape inference (:mod:`memprobe.attribute.shapes`): the answer, the
trace's direct evidence, the user's hints, a candidate reading and its thresholds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

MIN_VOCAB = 256  # a classifier over fewer classes is not a language model's head
MAX_VOCAB = 1 << 20
MIN_LOSS_BLOCK = 1024  # smaller loss-made blocks are scalars and per-row statistics
MAX_PROJECTION_WIDTH = 8  # [N, rH] with r up to this is a projection's output, not logits
MIN_LOSS_TOKENS = 16  # without a [V, H] weight, a loss over fewer rows is no LM's
MIN_HIDDEN, MAX_HIDDEN, HIDDEN_STEP = 64, 65536, 64
MAX_HEADS = 256
PLAUSIBLE_HIDDEN = 256  # language models' hidden sizes are at least this
PROJECTION_WIDTHS = frozenset({1, 2, 3, 4, 8})  # [N, rH] outputs of attention / MLP projections
MAX_CANDIDATE_SIZES = 8  # loss-made sizes tried as N·V·itemsize (largest first)
MAX_SHIFT_BATCH = 1024  # B of a shifted reading N' = B·(S−1): micro-batches are small
MIN_SHIFT_SEQ = 16  # a shifted reading's S: shorter "sequences" are coincidences
SHIFT_PENALTY = 1.0  # a shifted reading must out-argue the plain one
# Embedding + lm_head weights, their gradients, two Adam states, float32 master copies
# and autocast's bfloat16 casts: a [V, H] size with more blocks than this is a
# per-layer weight (an MLP's [4H, H] in every layer), not the vocabulary's.
MAX_VOCAB_WEIGHTS = 12
MAX_ID_BLOCKS = 16  # int64 [N] blocks a step makes (ids, targets, labels, positions)
MAX_SHARDS = 64  # vocabulary-parallel ranks tried for a given --vocab
SHARD_MARGIN = 2.0  # how much better V/k must read than the given V
ITEMSIZES = ((4, "float32"), (2, "bfloat16"))
COMMON_VOCABS = frozenset(
    {32000, 32064, 32768, 50257, 50304, 65536, 100352, 128000, 128256, 131072, 151936,
     152064, 256000, 262144}
)  # fmt: skip
NO_LOGITS_PATH = "no LM logits path found"
# Why, for a trace whose stacks name no op at all.
NO_STACKS = (
    "no block records a stack frame, so no op is known (a snapshot without a trace, or "
    "history recorded with context=None): record the step with "
    "torch.cuda.memory._record_memory_history(context='all', stacks='all') to read its "
    "loss, lm_head and phases"
)


@dataclass(frozen=True)
class ShapeInference:
    """What the trace says about the step's shapes, and how sure that is."""

    tokens: int | None  # N = B·S
    vocab: int | None
    hidden: int | None
    batch: int | None  # only when the split is supported (or given)
    seq: int | None
    family: tuple[tuple[int, str], ...]  # (bytes, dtype) of each [N, V] size seen
    logits_dtype: str | None
    logits_path: bool
    confidence: str  # "given" | "high" | "medium" | "low" | "none"
    evidence: tuple[str, ...]
    alternatives: tuple[str, ...]
    # Rows of the loss's blocks when they differ from ``tokens``: B·(S−1) for a loss
    # on shifted logits (Hugging Face), the lm_head's output staying [B·S, V].
    loss_tokens: int | None = None
    forward_only: bool = False  # the lm_head's output only: no loss in the trace
    shards: int | None = None  # vocabulary-parallel ranks: ``vocab`` is full_vocab / shards
    full_vocab: int | None = None
    per_rank: bool = False  # collectives on the logits path: ``vocab`` is likely a shard

    @property
    def known(self) -> bool:
        return self.tokens is not None and self.vocab is not None

    def rows(self) -> tuple[int, ...]:
        """Row counts of the logits family: B·S, and B·(S−1) for a shifted loss."""
        if self.tokens is None:
            return ()
        return (self.tokens,) + ((self.loss_tokens,) if self.loss_tokens else ())

    def family_sizes(self) -> frozenset[int]:
        v = self.vocab or 0
        return frozenset(n * v * k for n in self.rows() for k, _ in ITEMSIZES)

    def fit(self, size: int) -> tuple[str, int] | None:
        """(dtype, rows) of an ``[rows, V]`` block of ``size`` bytes, or None."""
        if not self.known:
            return None
        v = self.vocab or 0
        for n in self.rows():
            for itemsize, name in ITEMSIZES:
                if size == n * v * itemsize:
                    return name, n
        return None

    def shape_text(self) -> str:
        if not self.known:
            return "[B, S, V] unknown"
        vocab = f"V={self.vocab:,}"
        if self.shards:
            vocab += f" per rank (V={self.full_vocab:,} / {self.shards} ranks)"
        elif self.per_rank:
            vocab += " per rank?"
        shifted = f" (loss on {self.loss_tokens:,})" if self.loss_tokens else ""
        if self.batch is not None and self.seq is not None:
            return f"[B={self.batch:,}, S={self.seq:,}{shifted}, {vocab}]"
        return f"[N=B·S={self.tokens:,}{shifted}, {vocab}]"


@dataclass(frozen=True)
class Direct:
    """Sizes of blocks made by ops that name a shape themselves, read from their stacks.

    These are what B and S may be split on (sizes alone never are), and what keeps
    coincidences out of the activations' count: a rotary half ``[B, h, S, d/2]`` or a
    ``[S, S]`` bool mask has the bytes of an ``[N, H]`` block, but no matmul made it.
    """

    arange: frozenset[int] = frozenset()  # arange: positions [S] int64 (8·S bytes)
    masks: frozenset[int] = frozenset()  # triu / tril / ones / full: a causal mask [S, S]
    rotary: frozenset[int] = frozenset()  # cos / sin: rotary tables
    attention: tuple[tuple[int, int], ...] = ()  # (bytes, blocks) made inside attention
    matmuls: tuple[tuple[int, int], ...] = ()  # (bytes, blocks) of forward matmul outputs
    stacks: bool = False  # whether the trace's stacks name ops at all
    # Sizes some block of which an op that can make integers made (arange, randint, a
    # copy from the host, an empty buffer): where token ids [N] int64 may come from.
    id_sizes: frozenset[int] = frozenset()
    # Blocks alive before the trace or to its end, by bytes: weights and their state,
    # counted once however many iterations the trace holds.
    persistent: tuple[tuple[int, int], ...] = ()
    # Sizes a forward ``_to_copy`` made at half a persistent block's bytes: autocast's
    # bfloat16 copies of float32 weights (and biases).
    casts: frozenset[int] = frozenset()
    # Iterations the trace holds (its backward passes; 1 without any): counts of what a
    # step makes (ids, activations) are weighed per step, so two steps read as one.
    steps: int = 1
    # Blocks made before the forward (setup), alive before the trace or to its end, by
    # bytes: where a [V, H] weight is told from [N, H] activations of the same bytes
    # (N = V: a step with as many tokens as vocabulary entries).
    params: tuple[tuple[int, int], ...] = ()

    def ids_ok(self, size: int) -> bool:
        return not self.stacks or (size in self.id_sizes and size not in self.casts)

    def matmul_counts(self) -> Counter[int] | None:
        """Forward matmul outputs by bytes, or None when the stacks name no ops."""
        if not self.stacks or not self.matmuls:
            return None
        return Counter(dict(self.matmuls))


@dataclass(frozen=True)
class Hints:
    vocab: int | None = None
    tokens: int | None = None  # S, as the CLI's --tokens
    batch: int | None = None
    hidden: int | None = None  # H of a memprobe hidden-family run (its record says so)


@dataclass
class Reading:
    n: int  # rows of the candidate block: N, or N' = N − B for a shifted loss
    v: int
    score: float
    reasons: list[str]
    hidden: int | None
    family: list[tuple[int, str]]
    shift: int | None = None  # B when the rows are B·(S−1) and activations B·S
    weight_itemsizes: tuple[int, ...] = ()  # dtypes of the [V, H] weight found
    ids: bool = False  # int64 [N] blocks (token ids, targets) confirm the rows
    head_agrees: bool = False  # the lm_head's output has the activations' dtype
    weight_agrees: bool = False  # ... and the [V, H] weight's (or its autocast copy's)
    weight_blocks: int = 0  # [V, H]-sized blocks held
    held_weight: bool = False  # a [V, H] block made before the forward (a parameter)

    @property
    def tokens(self) -> int:
        """B·S: the activations' rows."""
        return self.n + (self.shift or 0)

    def text(self) -> str:
        if self.shift:
            return f"[N={self.tokens:,} (loss on {self.n:,}), V={self.v:,}]"
        return f"[N={self.n:,}, V={self.v:,}]"


@dataclass(frozen=True)
class HiddenReading:
    size: int | None
    score: float
    reasons: list[str]
    weight_itemsizes: tuple[int, ...]
    itemsize: int | None  # the activations' dtype
    weight_blocks: int = 0  # [V, H]-sized blocks held (weights, grads, optimizer state)
