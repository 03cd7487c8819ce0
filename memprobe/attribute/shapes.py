"""Infer the step's shapes from the trace: tokens N = B·S, vocabulary V, hidden H, dtype.

Byte counts alone fit almost any ``[B, S, V]`` (power-of-two vocabularies divide
everything), so inference starts from provenance: the sizes of blocks made by a
softmax / loss over the vocabulary (or their backward nodes) are the candidates for
``N·V·itemsize``. Each reading (N, V) is then scored by what else the trace holds:

- an int64 ``[N]`` block (targets, input ids: 8·N bytes) and float32 ``[N]`` blocks
  (per-token losses, logsumexp: 4·N bytes);
- activations ``[N, H]`` / ``[N, 4H]`` and weight-shaped ``[V, H]`` blocks (embedding,
  lm_head weight, their gradients and Adam state) for one hidden size H;
- the other loss-made sizes the same (N, V) explains (a bf16 and a float32 copy);
- weak priors: float32 for the loss's own blocks, a known tokenizer size.

Evidence before claims. B and S are split only on blocks whose *op* names S (an
``arange`` of S int64, a ``triu``/``tril`` mask ``[S, S]``), backed by attention scores
``[B, h, S, S]`` or rotary tables; otherwise the answer is ``[N=B·S, V]``. V needs a
``[V, H]`` weight (either dtype; autocast's copies count) or a loss over V whose rows
int64 token ids confirm; a square ``[N, N]`` (a similarity matrix) is never a
vocabulary. With stacks that name ops, only matmul outputs count as ``[N, H]``
activations, so a rotary half or a mask of the same bytes argues nothing. "high"
needs a weight and activations that agree with the reading.
The user's ``--vocab/--tokens/--batch`` override whatever they fix.

Three shapes real jobs have besides the plain ``[N, V]`` loss:

- *Shifted loss* (Hugging Face): the loss runs on ``logits[:, :-1]`` against
  ``labels[:, 1:]``, so its blocks are ``[B·(S−1), V]`` while activations, the
  lm_head output and the token ids are ``[B·S, …]``. A reading ``N' = N − B`` is
  scored on the activations of ``N`` and, when it wins, B and S follow from it.
- *Forward only*: no loss in the trace, but the lm_head's forward matmul made
  ``[N, V]`` from a ``[V, H]`` weight, with ``[N, H]`` activations beside it.
  A per-layer weight (dozens of blocks of one size) is never read as the head's.
- *Vocabulary-parallel*: each rank holds ``[N, V/k]``. With ``--vocab V`` and no
  block fitting V, the readings ``V/k`` are tried; frames of collectives on the
  loss path (all_reduce, vocab-parallel) say a read V is likely per rank.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

MIN_VOCAB = 256  # a classifier over fewer classes is not a language model's head
MAX_VOCAB = 1 << 20
MIN_LOSS_BLOCK = 1024  # smaller loss-made blocks are scalars and per-row statistics
MAX_PROJECTION_WIDTH = 8  # [N, rH] with r up to this is a projection's output, not logits
MIN_LOSS_TOKENS = 16  # without a [V, H] weight, a loss over fewer rows is no LM's
MIN_HIDDEN, MAX_HIDDEN, HIDDEN_STEP = 64, 65536, 64
MAX_HEADS = 256
PLAUSIBLE_HIDDEN = 256
# bytes / (N·H) of activations: [N, H], [N, 3H] (qkv), [N, 4H] (MLP) in 16/32-bit
_ACTIVATION_RATIOS = frozenset(
    {2, 4, 6, 8, 12, 16}
)  # language models' hidden sizes are at least this
_WIDTHS = frozenset({1, 2, 3, 4, 8})  # [N, rH] outputs of attention / MLP projections
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
class _Reading:
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

    @property
    def tokens(self) -> int:
        """B·S: the activations' rows."""
        return self.n + (self.shift or 0)

    def text(self) -> str:
        if self.shift:
            return f"[N={self.tokens:,} (loss on {self.n:,}), V={self.v:,}]"
        return f"[N={self.n:,}, V={self.v:,}]"


@dataclass(frozen=True)
class _Hidden:
    size: int | None
    score: float
    reasons: list[str]
    weight_itemsizes: tuple[int, ...]
    itemsize: int | None  # the activations' dtype
    weight_blocks: int = 0  # [V, H]-sized blocks held (weights, grads, optimizer state)


def _divisors(n: int) -> list[int]:
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def infer_shapes(
    sizes: Counter[int],
    loss_sizes: Iterable[int],
    hints: Hints = Hints(),
    labelled: Iterable[tuple[int, ...]] = (),
    matmul_sizes: Iterable[int] = (),
    *,
    collective: str | None = None,
    direct: Direct = Direct(),
    matmul_labelled: Iterable[tuple[int, ...]] = (),
) -> ShapeInference:
    """``sizes``: how many blocks of each byte count the trace holds; ``loss_sizes``:
    byte counts of blocks made by a softmax/loss over V (or their backward);
    ``labelled``: shapes memprobe's own labels record for such blocks (exact);
    ``matmul_sizes``: byte counts of forward matmul outputs (the lm_head is one);
    ``collective``: what names a collective on the logits path (``all_reduce``);
    ``direct``: sizes made by ops that name a shape (positions, masks, attention);
    ``matmul_labelled``: shapes memprobe's labels record for forward matmul outputs."""
    matmuls = frozenset(matmul_sizes)
    candidates = sorted({s for s in loss_sizes if s >= MIN_LOSS_BLOCK}, reverse=True)
    labelled = tuple(labelled)
    for forward_only, sources in ((False, candidates), (True, sorted(matmuls, reverse=True))):
        sources = [s for s in sources if s >= MIN_LOSS_BLOCK]
        if not sources:
            continue
        found = _infer_from(
            sources, sizes, hints, labelled, matmuls, forward_only, direct, matmul_labelled
        )
        if hints.vocab is not None:
            found = _sharded(sources, sizes, hints, matmuls, forward_only, found, direct) or found
        if found is not None:
            return _with_collective(_as_given(found[0], hints), collective, hints)
    return _without_logits_path(hints, found_loss=bool(candidates))


def _as_given(found: ShapeInference, hints: Hints) -> ShapeInference:
    """``--tokens`` and ``--batch`` fix N = B·S whatever the loss blocks' rows are: a
    chunked kernel makes its loss blocks one chunk of tokens at a time."""
    if hints.tokens is None or hints.batch is None or found.loss_tokens:
        return found
    n = hints.tokens * hints.batch
    if found.tokens == n:
        return found
    chunk = (
        [f"the loss blocks cover {found.tokens:,} of the {n:,} tokens at a time (a chunked loop)"]
        if found.tokens and found.tokens < n
        else []
    )
    return replace(
        found,
        tokens=n,
        batch=hints.batch,
        seq=hints.tokens,
        evidence=(
            f"N = B·S = {n:,} as given (by --tokens/--batch, or the memprobe run's record)",
            *chunk,
            *found.evidence,
        ),
    )


def _infer_from(
    sources: list[int],
    sizes: Counter[int],
    hints: Hints,
    labelled: tuple[tuple[int, ...], ...],
    matmuls: frozenset[int],
    forward_only: bool,
    direct: Direct = Direct(),
    matmul_labelled: Iterable[tuple[int, ...]] = (),
) -> tuple[ShapeInference, float] | None:
    """The best reading of ``sources`` (loss-made sizes, or forward matmul outputs when
    ``forward_only``) as ``[N, V]``, with its score; None when none is a reading at all."""
    readings: dict[tuple[int, int, int | None], _Reading] = {}
    recorded: dict[tuple[int, int], tuple[int, ...]] = {}
    for shape in () if forward_only else labelled:
        if len(shape) >= 2 and _vocab_ok(shape[-1], hints):
            n = 1
            for d in shape[:-1]:
                n *= d
            recorded[(n, shape[-1])] = shape
    for (n, v), shape in recorded.items():
        reading = _score(n, v, sizes, sources, matmuls, direct=direct)
        reading.score += 10
        reading.reasons.insert(0, f"memprobe's label records {list(shape)}")
        readings[(n, v, None)] = reading
    heads = {(_elements(shape[:-1]), shape[-1]): shape for shape in matmul_labelled if shape}
    for (n, v), shape in list(recorded.items()):
        # Labels that record the lm_head's [B·S, V] beside the loss's [B, S − 1, V]: the
        # loss on logits[:, :-1] (Hugging Face's shift), read as such.
        b = shape[0] if len(shape) == 3 else 0
        head = heads.get((n + b, v)) if b and b <= MAX_SHIFT_BATCH else None
        if head is not None and not forward_only:
            reading = _score(n, v, sizes, sources, matmuls, shift=b, direct=direct)
            reading.score += 11
            reading.reasons.insert(
                0,
                f"memprobe's labels record the loss's {list(shape)} and the lm_head's {list(head)}",
            )
            readings[(n, v, b)] = reading
    small_sizes = [s for s in sizes if s % 4 == 0]
    tokens = _token_set(small_sizes, hints)
    for x in sources[:MAX_CANDIDATE_SIZES]:
        for itemsize, _ in ITEMSIZES:
            if x % itemsize:
                continue
            elements = x // itemsize
            for n in _token_candidates(elements, small_sizes, hints):
                v = elements // n
                if (n, v, None) in readings or not _vocab_ok(v, hints):
                    continue
                readings[(n, v, None)] = _score(
                    n, v, sizes, sources, matmuls, None, forward_only, direct
                )
            if forward_only:
                continue  # the lm_head's output has all the rows; only a loss shifts
            for n, b in _shifted_candidates(elements, tokens, hints):
                v = elements // n
                if (n, v, b) in readings or not _vocab_ok(v, hints):
                    continue
                shifted = _score(n, v, sizes, sources, matmuls, shift=b, direct=direct)
                if shifted.hidden is not None:  # a shift is only argued by activations
                    readings[(n, v, b)] = shifted
    if forward_only:
        readings = {k: r for k, r in readings.items() if _lm_head_ok(r)}
    if hints.vocab is None:
        readings = {k: r for k, r in readings.items() if k in recorded or _vocab_argued(r)}
    if not readings:
        return None
    ranked = sorted(readings.values(), key=lambda r: (-r.score, -r.v, r.shift or 0))
    best = ranked[0]
    margin = best.score - ranked[1].score if len(ranked) > 1 else best.score
    given = hints.vocab is not None and hints.tokens is not None and hints.batch is not None
    if given:
        confidence = "given"
    elif (
        margin >= 3
        and best.weight_itemsizes
        and best.hidden is not None
        and (best.weight_agrees or best.ids)
    ):
        # High only when a [V, H] weight and [N, H] activations agree with the reading
        # (bytes alone fit a float32 [N, V] and a bfloat16 [N, 2V] alike), and the rows
        # are tied to it: the lm_head's matmul in the weight's dtype, or token ids [N].
        confidence = "high"
    elif margin >= 1:
        confidence = "medium"
    else:
        confidence = "low"
    if forward_only and confidence in ("high", "given"):
        confidence = "medium"  # no loss confirms that the matmul's output is over V
    logits_shape = recorded.get((best.n, best.v)) if best.shift is None else None
    batch: int | None
    seq: int | None
    if best.shift:
        batch, seq = best.shift, best.tokens // best.shift
        split_reasons = [
            f"B = {batch:,}, S = {seq:,}: the loss's rows are B·(S−1) = {best.n:,} and the "
            f"activations' B·S = {best.tokens:,} (the loss on logits[:, :-1], labels[:, 1:])"
        ]
    elif (
        logits_shape is not None
        and len(logits_shape) == 3
        and hints.batch is None
        and hints.tokens is None
    ):
        batch, seq, split_reasons = logits_shape[0], logits_shape[1], []
    else:
        batch, seq, split_reasons = _split(best.n, hints, direct, best.hidden)
    family = sorted(best.family, key=lambda f: f[0])
    found = ShapeInference(
        tokens=best.tokens,
        vocab=best.v,
        hidden=best.hidden,
        batch=batch,
        seq=seq,
        family=tuple(family),
        logits_dtype=family[0][1] if family else None,
        logits_path=True,
        confidence=confidence,
        evidence=tuple(best.reasons + split_reasons),
        alternatives=tuple(f"{r.text()} (score {r.score:g})" for r in ranked[1:4]),
        loss_tokens=best.n if best.shift else None,
        forward_only=forward_only,
    )
    return found, best.score


def _lm_head_ok(r: _Reading) -> bool:
    """A forward matmul's [N, V] is the lm_head's only with [N, H] activations of its
    dtype and a [V, H] weight that is not a per-layer weight; V a small multiple of H
    is an attention or MLP projection's width (qkv is [N, 3H]), not a vocabulary."""
    if r.hidden is None or not r.weight_agrees or not r.head_agrees:
        return False
    return not (r.v % r.hidden == 0 and r.v // r.hidden <= MAX_PROJECTION_WIDTH)


def _sharded(
    sources: list[int],
    sizes: Counter[int],
    hints: Hints,
    matmuls: frozenset[int],
    forward_only: bool,
    whole: tuple[ShapeInference, float] | None,
    direct: Direct = Direct(),
) -> tuple[ShapeInference, float] | None:
    """The best reading of V/k, one rank's vocabulary shard, when V fits nothing or V/k
    reads clearly better (bytes of float32 [N, V/2] are bfloat16 [N, V] too: the dtypes
    of activations, weights and the loss decide)."""
    full = hints.vocab
    assert full is not None
    best: tuple[float, int, ShapeInference] | None = None
    for k in range(2, MAX_SHARDS + 1):
        if full % k or full // k < MIN_VOCAB:
            continue
        local = Hints(full // k, hints.tokens, hints.batch)
        reading = _infer_from(sources, sizes, local, (), matmuls, forward_only, direct)
        if reading is not None and (best is None or reading[1] > best[0]):
            best = (reading[1], k, reading[0])
    if best is None or (whole is not None and best[0] < whole[1] + SHARD_MARGIN):
        return None
    score, k, found = best
    fits = "nothing fits it" if whole is None else "it reads worse"
    why = (
        f"V = {full:,} as given, but {fits}; V/{k} = {full // k:,} fits: one rank's shard "
        f"of a vocabulary-parallel lm_head and loss ({k} ranks)"
    )
    return replace(found, shards=k, full_vocab=full, evidence=(why, *found.evidence)), score


def _with_collective(found: ShapeInference, collective: str | None, hints: Hints) -> ShapeInference:
    if collective is None or found.shards or hints.vocab is not None:
        return found
    why = (
        f"{collective} on the logits path: V = {found.vocab:,} is likely this rank's shard "
        "of a vocabulary-parallel head (pass --vocab with the full vocabulary to settle it)"
    )
    return replace(found, per_rank=True, evidence=(*found.evidence, why))


def _without_logits_path(hints: Hints, *, found_loss: bool = False) -> ShapeInference:
    if hints.hidden is not None:
        why = (
            "memprobe's run records a fused step (hidden states [N, H] and the lm_head "
            f"weight [V, H] in, H = {hints.hidden:,}) whose kernel never makes an [N, V] block"
        )
    elif found_loss:
        why = (
            "loss/softmax blocks are there, but none fits [N, V] with V >= "
            f"{MIN_VOCAB} (a classifier, not a language model's head?)"
        )
    else:
        why = (
            "no softmax / log_softmax / cross_entropy / nll_loss (or their backward) "
            "made a block in the trace, and no forward matmul made [N, V] from a [V, H] weight"
        )
    n = hints.batch * hints.tokens if hints.batch and hints.tokens else None
    return ShapeInference(
        tokens=n,
        vocab=hints.vocab,
        hidden=hints.hidden,
        batch=hints.batch,
        seq=hints.tokens,
        family=(),
        logits_dtype=None,
        logits_path=False,
        confidence="none",
        evidence=(f"{NO_LOGITS_PATH}: {why}",),
        alternatives=(),
    )


def _vocab_ok(v: int, hints: Hints) -> bool:
    if hints.vocab is not None:
        return v == hints.vocab
    return MIN_VOCAB <= v <= MAX_VOCAB


def _token_set(sizes: list[int], hints: Hints) -> set[int]:
    """Token counts the trace names: int64 / float32 [N] blocks (ids, per-token loss)."""
    if hints.batch is not None and hints.tokens is not None:
        return {hints.batch * hints.tokens}
    return {s // w for s in sizes for w in (8, 4) if s % w == 0 and s // w > 1}


def _token_candidates(elements: int, sizes: list[int], hints: Hints) -> list[int]:
    """N values worth scoring: given by the hints, or the token count of an int64 /
    float32 [N] block in the trace that divides the [N, V] element count."""
    if hints.batch is not None and hints.tokens is not None:
        n = hints.batch * hints.tokens
        return [n] if elements % n == 0 else []
    if hints.vocab is not None:
        if elements % hints.vocab:
            return []
        n = elements // hints.vocab
        return [n] if _n_ok(n, hints) else []
    out = {n for n in _token_set(sizes, hints) if elements % n == 0 and _n_ok(n, hints)}
    if not out:
        # No [N]-sized block: every split of the element count with a plausible V.
        out = {
            n
            for n in _divisors(elements)
            if MIN_VOCAB <= elements // n <= MAX_VOCAB and _n_ok(n, hints)
        }
    return sorted(out)


def _shifted_candidates(elements: int, tokens: set[int], hints: Hints) -> list[tuple[int, int]]:
    """(N' = B·(S−1), B) pairs whose N' divides the element count: from the given B and
    S, from N' = elements / V for a given V, or from a token count N = B·S the trace
    names (token ids [B, S] stay unshifted) and each B dividing it."""
    if hints.batch is not None and hints.tokens is not None:
        n = hints.batch * (hints.tokens - 1)
        return [(n, hints.batch)] if n > 0 and elements % n == 0 else []
    out: set[tuple[int, int]] = set()
    if hints.vocab is not None:
        if elements % hints.vocab:
            return []
        n = elements // hints.vocab
        batches = [hints.batch] if hints.batch else _divisors(n)
        for b in batches:
            if b <= MAX_SHIFT_BATCH and n % b == 0 and n // b + 1 >= MIN_SHIFT_SEQ:
                out.add((n, b))
        return sorted(out)
    # N' = N − B must leave V = elements / N' in range: only those N are tried.
    low, high = elements // MAX_VOCAB, elements // MIN_VOCAB + MAX_SHIFT_BATCH
    for total in tokens:
        if not low <= total <= high:
            continue
        for b in range(1, min(MAX_SHIFT_BATCH, total // MIN_SHIFT_SEQ) + 1):
            if total % b or elements % (total - b):
                continue
            if (hints.batch is None or b == hints.batch) and (
                hints.tokens is None or total // b == hints.tokens
            ):
                out.add((total - b, b))
    return sorted(out)


def _n_ok(n: int, hints: Hints) -> bool:
    return all(h is None or n % h == 0 for h in (hints.tokens, hints.batch))


def _score(
    n: int,
    v: int,
    sizes: Counter[int],
    loss_sizes: list[int],
    matmuls: frozenset[int] = frozenset(),
    shift: int | None = None,
    forward_only: bool = False,
    direct: Direct = Direct(),
) -> _Reading:
    """Score the reading "the blocks are [n, V]"; with ``shift`` = B, the loss's rows are
    B·(S−1) = n and everything else (activations, lm_head output, ids) has n + B."""
    score = 0.0
    reasons: list[str] = []
    tokens = n + (shift or 0)
    made = set(loss_sizes)
    rows = (n, tokens) if shift else (n,)
    # The lm_head's output belongs to the family too: under autocast it is the bfloat16
    # one, the loss's copies the float32 ones.
    made |= {r * v * k for r in rows for k, _ in ITEMSIZES if r * v * k in matmuls}
    family = [(r * v * k, name) for r in rows for k, name in ITEMSIZES if r * v * k in made]
    names = " and ".join(f"{name} ({b:,} B)" for b, name in family)
    if forward_only:
        reasons.append(
            f"a forward matmul made [N, V] = {n:,}·{v:,} elements in {names} (the lm_head; "
            "forward only: no softmax / loss over V in the trace)"
        )
    else:
        reasons.append(f"loss/softmax blocks of N·V = {n:,}·{v:,} elements in {names}")
    if len({name for _, name in family}) > 1:
        score += 2
        reasons.append("the same [N, V] in two dtypes (logits and a float32 copy)")
    # Positions (an arange of S) are not token ids: their count is S, not N (id_sizes
    # leaves sizes only arange made out).
    ids = [r for r in rows if 8 * r in sizes and direct.ids_ok(8 * r)]
    if ids:
        r = ids[-1]
        # Ids, targets, masks: a few per step; hundreds of such blocks are per-layer
        # float32 statistics of twice the rows, which say less.
        score += 3 if sizes[8 * r] <= MAX_ID_BLOCKS * direct.steps else 1.5
        reasons.append(f"{sizes[8 * r]} int64 [N] block(s) of {8 * r:,} B (targets / token ids)")
    if 4 * n in sizes:
        score += 1.5
        what = "per-token values" if forward_only else "per-token loss"
        reasons.append(f"{sizes[4 * n]} float32 [N] block(s) of {4 * n:,} B ({what})")
    # The lm_head's output has the activations' rows (a shifted loss slices it after).
    lm_head = [r * v * k for r in reversed(rows) for k, _ in ITEMSIZES if r * v * k in matmuls]
    if lm_head and not forward_only:  # forward only: every reading is a matmul's
        score += 2
        reasons.append(f"a forward matmul made a [N, V] block of {lm_head[0]:,} B (the lm_head)")
    head_itemsizes = frozenset(k for r in rows for k, _ in ITEMSIZES if r * v * k in lm_head)
    h = _hidden(
        tokens,
        v,
        sizes,
        {b for b, _ in family} | {r * v * k for r in rows for k, _ in ITEMSIZES},
        head_itemsizes,
        direct.matmul_counts(),
        Counter(dict(direct.persistent)) if direct.persistent else None,
        direct.casts,
        direct.steps,
    )
    score += h.score
    reasons += h.reasons
    # A matmul's output has its weight's dtype: the lm_head's [N, V] and the [V, H]
    # weight agree in a consistent reading (fp32 [N, V] from a bf16 weight does not).
    # Autocast keeps a bfloat16 copy of a float32 weight: either dtype agrees.
    weight_agrees = bool(
        lm_head and lm_head[0] in {r * v * k for r in rows for k in h.weight_itemsizes}
    )
    if weight_agrees:
        score += 2
        reasons.append("the lm_head output and the [V, H] weight have the same dtype")
    head_agrees = bool(lm_head and h.itemsize and lm_head[0] in {r * v * h.itemsize for r in rows})
    if head_agrees:
        score += 1
        reasons.append("the lm_head output has the activations' dtype")
    if family and family[-1][1] == "float32" and not forward_only:
        score += 1
        reasons.append("the loss's largest block read as float32 (loss math runs in float32)")
    if v in COMMON_VOCABS:
        score += 1
        reasons.append(f"V = {v:,} is a common tokenizer size")
    if tokens % 64 == 0:
        score += 0.5
    if forward_only and h.size and v % h.size == 0 and v // h.size in _WIDTHS:
        # An MLP's up-projection is a forward matmul from an [rH, H] weight too.
        score -= 2
        reasons.append(f"V = {v // h.size}·H, an MLP's width as much as a vocabulary")
    if shift:
        score -= SHIFT_PENALTY
        reasons.insert(
            1,
            f"the loss's rows N' = {n:,} are B·(S−1) for B = {shift:,}: activations and the "
            f"lm_head output have N = B·S = {tokens:,} rows (a loss on shifted logits)",
        )
    return _Reading(
        n, v, score, reasons, h.size, family, shift, h.weight_itemsizes, bool(ids), head_agrees,
        weight_agrees, h.weight_blocks,
    )  # fmt: skip


def _hidden(
    n: int,
    v: int,
    sizes: Counter[int],
    family: set[int],
    head_itemsizes: frozenset[int] = frozenset(),
    made_by_matmul: Counter[int] | None = None,
    persistent: Counter[int] | None = None,
    casts: frozenset[int] = frozenset(),
    steps: int = 1,
) -> _Hidden:
    """The hidden size H best supported by [N, H] / [N, 4H] activations and [V, H] weights.
    Bytes read as float32 [N, H] also read as bfloat16 [N, 2H]: where they tie, the
    dtype of the lm_head's output (``head_itemsizes``) decides. With stacks that name
    ops, only blocks a forward matmul made count as activations (``made_by_matmul``)."""
    activations: Counter[tuple[int, int]] = Counter()  # (H, itemsize) -> blocks
    for s, count in (made_by_matmul if made_by_matmul is not None else sizes).items():
        if s in family:
            continue
        for itemsize, _ in ITEMSIZES:
            if s % (n * itemsize) == 0:
                h = s // (n * itemsize)
                if MIN_HIDDEN <= h <= MAX_HIDDEN and h % HIDDEN_STEP == 0:
                    activations[(h, itemsize)] += count
    best: _Hidden | None = None
    for (h, itemsize), count in activations.items():
        if count < 2:
            continue
        # Each layer makes its own activations: many blocks are worth more than a few.
        per_step = max(1.0, count / steps)
        score = min(math.log2(per_step), 12) / 2 + (1 if h >= PLAUSIBLE_HIDDEN else 0)
        reasons = [f"{count} activation block(s) of [N, H={h:,}] ({n * h * itemsize:,} B)"]
        wide = 4 * h * n * itemsize
        if wide in sizes and wide not in family:
            score += 1
            reasons.append(f"{sizes[wide]} MLP block(s) of [N, 4H] ({wide:,} B)")
        other = 2 if itemsize == 4 else 4
        mixed = n * h * other
        if activations[(h, other)] >= 2 and mixed not in family:
            # Mixed precision keeps float32 copies beside bfloat16 ones at the same H.
            score += 1
            reasons.append(f"activations of [N, H] in both dtypes ({mixed:,} B too)")
        # A per-layer weight (dozens of blocks of one size) is not the vocabulary's.
        held = persistent if persistent else sizes
        weights = [
            (k, name)
            for k, name in ITEMSIZES
            if 0 < held[v * h * k] <= MAX_VOCAB_WEIGHTS and v * h * k not in family
        ]
        if weights and weights[0][0] == 4 and v * h * 2 in casts:
            weights.append((2, "bfloat16"))  # autocast's copy of the float32 weight
        if weights:
            k, name = weights[0]
            count = held[v * h * k]
            if len(weights) > 1 and weights[1][0] == 2 and v * h * 2 in casts:
                reasons.append(f"autocast bfloat16 copies of the [V, H] weight ({v * h * 2:,} B)")
            # Embedding and lm_head weight, grads, Adam state: several; one is a coincidence.
            same = any(k2 == itemsize for k2, _ in weights)  # autocast's copy counts
            score += (3 if count >= 2 else 1) + (1 if same else 0)
            reasons.append(
                f"{count} {name} [V, H] block(s) of {v * h * k:,} B "
                "(embedding / lm_head weight, its gradient, optimizer state)"
            )
        tie_break = 0.25 if itemsize in head_itemsizes else 0.0
        score += tie_break
        if best is None or score > best.score:
            best = _Hidden(
                h, score, reasons, tuple(k for k, _ in weights), itemsize,
                held[v * h * weights[0][0]] if weights else 0,
            )  # fmt: skip
    if best is None:
        return _Hidden(None, 0.0, [], (), None)
    return replace(best, score=min(best.score, 10.0))


def _heads_ok(per_batch: int, hidden: int | None) -> bool:
    """Whether B·h·S²·itemsize / (B·S²) = h·itemsize reads as a head count that fits H."""
    for itemsize in (4, 2):
        if per_batch % itemsize:
            continue
        heads = per_batch // itemsize
        if not 1 <= heads <= MAX_HEADS:
            continue
        if hidden is None or (hidden % heads == 0 and 32 <= hidden // heads <= 256):
            return True
    return False


def _split(
    n: int, hints: Hints, direct: Direct, hidden: int | None = None
) -> tuple[int | None, int | None, list[str]]:
    """(B, S, reasons): given, or read off blocks whose op names S directly: positions
    (``arange`` of S int64) or a mask ``[S, S]`` (``triu``/``tril``/``ones``), backed by
    attention scores ``[B, h, S, S]`` (a head count that fits H) or rotary tables;
    (None, None) when no S is singled out. Sizes alone never split N."""
    if hints.tokens is not None and n % hints.tokens == 0:
        return n // hints.tokens, hints.tokens, [f"S = {hints.tokens:,} as given"]
    if hints.batch is not None and n % hints.batch == 0:
        return hints.batch, n // hints.batch, [f"B = {hints.batch:,} as given"]
    candidates = {a // 8 for a in direct.arange if a % 8 == 0}
    for m in direct.masks:
        for itemsize in (1, 2, 4):
            root = math.isqrt(m // itemsize)
            if m % itemsize == 0 and root * root == m // itemsize:
                candidates.add(root)
    scored: list[tuple[int, int, int, list[str]]] = []  # (direct, support, S, reasons)
    for s in sorted(candidates):
        if s < 2 or n % s or n // s < 1:
            continue
        b = n // s
        reasons = []
        if 8 * s in direct.arange:
            reasons.append(f"an arange of {s:,} int64 ({8 * s:,} B: position ids)")
        masks = [m for m in direct.masks if m in (s * s, 2 * s * s, 4 * s * s)]
        if masks:
            reasons.append(f"a mask [S, S] = [{s:,}, {s:,}] ({masks[0]:,} B)")
        primary = len(reasons)
        scores = [
            (size, count)
            for size, count in direct.attention
            if size % (s * s) == 0
            and (size // (s * s)) % b == 0
            and _heads_ok(size // (s * s) // b, hidden)
        ]
        if scores:
            size, count = max(scores, key=lambda sc: sc[1])
            reasons.append(
                f"{count} attention score block(s) [B, h, S, S] of {size:,} B with B = {b:,}"
            )
        if any(r % s == 0 and r // s <= 4 * (hidden or MAX_HIDDEN) for r in direct.rotary):
            reasons.append("rotary tables (cos / sin) with S rows")
        if primary:
            scored.append((primary, len(reasons) - primary, s, reasons))
    scored.sort(key=lambda t: (t[0], t[1]), reverse=True)
    if not scored or (len(scored) > 1 and scored[0][:2] == scored[1][:2]):
        return (
            None,
            None,
            [
                "B and S not split: no position ids (arange), [S, S] mask or attention scores "
                "single out S; N = B·S"
            ],
        )
    _, support, s, reasons = scored[0]
    if support == 0 and len(reasons) < 2:
        return None, None, [f"B and S not split: only {reasons[0]} names S = {s:,}; N = B·S"]
    return n // s, s, [f"B = {n // s:,}, S = {s:,}: " + "; ".join(reasons)]


def _vocab_argued(r: _Reading) -> bool:
    """Whether the trace argues V itself: a [V, H] weight (in either dtype), or a loss
    over V whose rows the token ids [N] confirm. A square [N, N] is a similarity or an
    attention matrix (retrieval's in-batch negatives), never a vocabulary; and a
    language model's vocabulary is larger than its hidden size. One block of [V, H]'s
    bytes is a coincidence (a graph's node features [nodes, H] under a softmax over the
    nodes): a weight argues V when there are several (embedding, lm_head, gradients,
    optimizer state) or when a forward matmul made the [N, V] in its dtype (the lm_head).
    Fewer than MIN_LOSS_TOKENS rows (blocks of a few KiB: a softmax over a graph's
    scores, a classifier on a handful of items) argue nothing about a vocabulary."""
    if r.v in (r.n, r.tokens) or (r.hidden is not None and r.v <= r.hidden):
        return False
    if r.tokens < MIN_LOSS_TOKENS:
        return False
    weight = bool(r.weight_itemsizes) and (r.weight_blocks >= 2 or r.weight_agrees)
    return weight or (r.ids and r.tokens >= MIN_LOSS_TOKENS)


def _elements(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n
