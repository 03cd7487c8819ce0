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
from dataclasses import replace

from memprobe.attribute.shape_records import (
    ITEMSIZES,
    MAX_CANDIDATE_SIZES,
    MAX_PROJECTION_WIDTH,
    MAX_SHARDS,
    MAX_SHIFT_BATCH,
    MIN_LOSS_BLOCK,
    MIN_VOCAB,
    NO_LOGITS_PATH,
    NO_STACKS,
    SHARD_MARGIN,
    Direct,
    Hints,
    Reading,
    ShapeInference,
)
from memprobe.attribute.shape_scoring import (
    score_reading,
    shifted_candidates,
    split_batch,
    token_candidates,
    token_set,
    vocab_argued,
    vocab_ok,
)
from memprobe.errors import UserError


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
    label_sizes: Iterable[tuple[int, tuple[int, ...]]] = (),
) -> ShapeInference:
    """``sizes``: how many blocks of each byte count the trace holds; ``loss_sizes``:
    byte counts of blocks made by a softmax/loss over V (or their backward);
    ``labelled``: shapes memprobe's own labels record for such blocks (exact);
    ``matmul_sizes``: byte counts of forward matmul outputs (the lm_head is one);
    ``collective``: what names a collective on the logits path (``all_reduce``);
    ``direct``: sizes made by ops that name a shape (positions, masks, attention);
    ``matmul_labelled``: shapes memprobe's labels record for forward matmul outputs;
    ``label_sizes``: (bytes, shape) of loss-made blocks and forward matmul outputs
    memprobe labelled."""
    matmuls = frozenset(matmul_sizes)
    candidates = sorted({s for s in loss_sizes if s >= MIN_LOSS_BLOCK}, reverse=True)
    labelled = tuple(labelled)
    label_splits: dict[int, set[tuple[int, int]]] = {}
    for size, shape in label_sizes:
        if len(shape) >= 2:
            label_splits.setdefault(size, set()).add((math.prod(shape[:-1]), shape[-1]))
    for forward_only, sources in ((False, candidates), (True, sorted(matmuls, reverse=True))):
        sources = [s for s in sources if s >= MIN_LOSS_BLOCK]
        if not sources:
            continue
        found = _infer_from(
            sources,
            sizes,
            hints,
            labelled,
            matmuls,
            forward_only,
            direct,
            matmul_labelled,
            label_splits,
        )
        if hints.vocab is not None:
            found = _sharded(sources, sizes, hints, matmuls, forward_only, found, direct) or found
        if found is not None:
            return _with_collective(_as_given(found[0], hints), collective, hints)
    big_matmuls = any(s >= MIN_LOSS_BLOCK for s in matmuls)
    return _without_logits_path(
        hints, found_loss=bool(candidates), matmuls=big_matmuls, stacks=direct.stacks
    )


def _as_given(found: ShapeInference, hints: Hints) -> ShapeInference:
    """``--tokens`` and ``--batch`` fix N = B·S whatever the loss blocks' rows are: a
    chunked kernel makes its loss blocks one chunk of tokens at a time."""
    if hints.tokens is None or hints.batch is None or found.loss_tokens:
        return found
    n = hints.tokens * hints.batch
    if found.tokens == n:
        return found
    if found.tokens and found.tokens > n:
        # A loss block cannot hold more tokens' rows than the step has: the sizes given
        # are not this snapshot's. Believed, they printed "[B=5, S=3, V=128]; confidence
        # given" beside the label's own [1, 64, 128], took the logits out of the
        # logits-family, and --what-if blamed the loss ("no loss step ... found").
        raise UserError(
            f"B·S = {hints.batch:,} x {hints.tokens:,} = {n:,} tokens (--batch and --tokens, "
            f"or the memprobe run's record), but the snapshot's loss blocks are [N, V] = "
            f"[{found.tokens:,}, {found.vocab:,}]: {found.tokens:,} tokens' rows, more than "
            "the step has",
            "give the step's own batch and sequence length, or drop --tokens/--batch to "
            "read them from the snapshot",
        )
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


def _shift_of_flat(n: int, v: int, heads: dict[tuple[int, int], tuple[int, ...]]) -> int:
    """B for a 2-D loss label ``[n, v]`` beside an lm_head labelled with B more rows:
    ``F.cross_entropy(shift_logits.view(-1, V), ...)`` (Hugging Face's loss) labels only the
    flattened ``[B·(S − 1), V]``, and read unshifted it called N = B·S one row short per
    sequence and left the lm_head's logits and their gradient out of the logits family
    (so ``--what-if`` found no logits for their gradient). 0 when no head says so."""
    for (hn, hv), _ in heads.items():
        b = hn - n
        if hv == v and 0 < b <= MAX_SHIFT_BATCH and n % b == 0:
            return b
    return 0


def _infer_from(
    sources: list[int],
    sizes: Counter[int],
    hints: Hints,
    labelled: tuple[tuple[int, ...], ...],
    matmuls: frozenset[int],
    forward_only: bool,
    direct: Direct = Direct(),
    matmul_labelled: Iterable[tuple[int, ...]] = (),
    label_splits: dict[int, set[tuple[int, int]]] | None = None,
) -> tuple[ShapeInference, float] | None:
    """The best reading of ``sources`` (loss-made sizes, or forward matmul outputs when
    ``forward_only``) as ``[N, V]``, with its score; None when none is a reading at all."""
    readings: dict[tuple[int, int, int | None], Reading] = {}
    recorded: dict[tuple[int, int], tuple[int, ...]] = {}
    for shape in () if forward_only else labelled:
        if len(shape) >= 2 and math.prod(shape[:-1]) > 0 and vocab_ok(shape[-1], hints):
            recorded[(math.prod(shape[:-1]), shape[-1])] = shape
    for (n, v), shape in recorded.items():
        reading = score_reading(n, v, sizes, sources, matmuls, direct=direct)
        reading.score += 10
        reading.reasons.insert(0, f"memprobe's label records {list(shape)}")
        readings[(n, v, None)] = reading
    heads = {(math.prod(shape[:-1]), shape[-1]): shape for shape in matmul_labelled if shape}
    for (n, v), shape in list(recorded.items()):
        # Labels that record the lm_head's [B·S, V] beside the loss's [B, S − 1, V]: the
        # loss on logits[:, :-1] (Hugging Face's shift), read as such.
        b = shape[0] if len(shape) == 3 else _shift_of_flat(n, v, heads)
        head = heads.get((n + b, v)) if b and b <= MAX_SHIFT_BATCH else None
        if head is not None and not forward_only:
            reading = score_reading(n, v, sizes, sources, matmuls, shift=b, direct=direct)
            reading.score += 11
            reading.reasons.insert(
                0,
                f"memprobe's labels record the loss's {list(shape)} and the lm_head's {list(head)}",
            )
            readings[(n, v, b)] = reading
    small_sizes = [s for s in sizes if s % 4 == 0]
    tokens = token_set(small_sizes, hints)
    for x in sources[:MAX_CANDIDATE_SIZES]:
        for itemsize, _ in ITEMSIZES:
            if x % itemsize:
                continue
            elements = x // itemsize
            for n in token_candidates(elements, small_sizes, hints):
                v = elements // n
                if (n, v, None) in readings or not vocab_ok(v, hints):
                    continue
                readings[(n, v, None)] = score_reading(
                    n, v, sizes, sources, matmuls, None, forward_only, direct
                )
            if forward_only:
                continue  # the lm_head's output has all the rows; only a loss shifts
            for n, b in shifted_candidates(elements, tokens, hints):
                v = elements // n
                if (n, v, b) in readings or not vocab_ok(v, hints):
                    continue
                shifted = score_reading(n, v, sizes, sources, matmuls, shift=b, direct=direct)
                if shifted.hidden is not None:  # a shift is only argued by activations
                    readings[(n, v, b)] = shifted
    if forward_only:
        # With --vocab, --tokens and --batch given (only readings of that N and V are
        # left), a forward matmul's [N, V] is the lm_head's on the user's word: a one-layer
        # step has too few [N, H] activations to argue H, and its reading said "no forward
        # matmul made [N, V]" beside the very block, all three given. (--vocab alone is
        # not enough: float32 [N/2, V] and bfloat16 [N, V] are the same bytes.)
        all_given = None not in (hints.vocab, hints.tokens, hints.batch)
        readings = {k: r for k, r in readings.items() if all_given or _lm_head_ok(r)}
    if hints.vocab is None:
        # A label's reading is weighed like any other here: a retrieval loss's label
        # records its [N, N] similarity too (vocab_argued keeps a square one only with a
        # [V, H] parameter and token ids beside it).
        readings = {k: r for k, r in readings.items() if vocab_argued(r)}
    if hints == Hints(hidden=hints.hidden) and label_splits:
        # memprobe's label records how a loss block's bytes split: another reading of
        # the same bytes is wrong. Read at N = V = 32,768 (the label's [32768, 32768]
        # rejected), "[N=1,024, V=1,048,576]" won and the logits went uncounted; a
        # retrieval step's labelled [2048, 2048] similarity read as [N=128, V=65,536].
        readings = {k: r for k, r in readings.items() if _label_agrees(r, label_splits)}
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
        batch, seq, split_reasons = split_batch(best.n, hints, direct, best.hidden)
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


def _label_agrees(r: Reading, label_splits: dict[int, set[tuple[int, int]]]) -> bool:
    """Whether memprobe's labels leave the reading standing: none of its sizes is
    labelled, or one labelled size splits as it says ([rows, V] for the loss's rows or
    the activations': a shifted loss). One agreeing size is enough: an MLP's [N, 4H] may
    have the bytes of the logits in the other dtype."""
    labelled = [label_splits[size] for size, _ in r.family if size in label_splits]
    return not labelled or any(
        (rows, r.v) in splits for splits in labelled for rows in (r.n, r.tokens)
    )


def _lm_head_ok(r: Reading) -> bool:
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


def _without_logits_path(
    hints: Hints, *, found_loss: bool = False, matmuls: bool = False, stacks: bool = True
) -> ShapeInference:
    if hints.hidden is not None:
        why = (
            "memprobe's run records a fused step (hidden states [N, H] and the lm_head "
            f"weight [V, H] in, H = {hints.hidden:,}) whose kernel never makes an [N, V] block"
        )
    elif not stacks:
        # History recorded without stacks (_record_memory_history(context=None)): every
        # op is unknown, and the line said no softmax or loss "made a block in the trace"
        # of a step that has one (and --what-if: "needs a step whose loss materializes").
        why = NO_STACKS
    elif found_loss:
        why = (
            "loss/softmax blocks are there, but none fits [N, V] with V >= "
            f"{MIN_VOCAB} (a classifier, not a language model's head?)"
        )
    elif matmuls and None in (hints.vocab, hints.tokens, hints.batch):
        # Forward matmuls made blocks large enough for the lm_head's [N, V], but too few
        # [N, H] activations tie one to a [V, H] weight (a one-layer step): the line said
        # "no forward matmul made [N, V]" beside the lm_head's output.
        why = (
            "no softmax / log_softmax / cross_entropy / nll_loss (or their backward) "
            "made a block in the trace, and no forward matmul's output reads as the "
            "lm_head's [N, V]: too few [N, H] activations tie one to a [V, H] weight "
            "(pass --vocab, --tokens and --batch to read the lm_head's output)"
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
