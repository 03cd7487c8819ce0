"""Candidate readings of a loss-made size as ``[N, V]`` and how the trace argues for
each: token ids, activations and weights for one hidden size H, and where B and S may
be split (:mod:`memprobe.attribute.shapes` ranks them)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

from memprobe.attribute.shape_records import (
    COMMON_VOCABS,
    HIDDEN_STEP,
    ITEMSIZES,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_ID_BLOCKS,
    MAX_SHIFT_BATCH,
    MAX_VOCAB,
    MAX_VOCAB_WEIGHTS,
    MIN_HIDDEN,
    MIN_LOSS_TOKENS,
    MIN_SHIFT_SEQ,
    MIN_VOCAB,
    PLAUSIBLE_HIDDEN,
    PROJECTION_WIDTHS,
    SHIFT_PENALTY,
    Direct,
    HiddenReading,
    Hints,
    Reading,
)
from memprobe.errors import UserError


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


def vocab_ok(v: int, hints: Hints) -> bool:
    if hints.vocab is not None:
        return v == hints.vocab
    return MIN_VOCAB <= v <= MAX_VOCAB


def token_set(sizes: list[int], hints: Hints) -> set[int]:
    """Token counts the trace names: int64 / float32 [N] blocks (ids, per-token loss)."""
    if hints.batch is not None and hints.tokens is not None:
        return {hints.batch * hints.tokens}
    return {s // w for s in sizes for w in (8, 4) if s % w == 0 and s // w > 1}


def token_candidates(elements: int, sizes: list[int], hints: Hints) -> list[int]:
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
    out = {n for n in token_set(sizes, hints) if elements % n == 0 and _n_ok(n, hints)}
    if not out:
        # No [N]-sized block: every split of the element count with a plausible V.
        out = {
            n
            for n in _divisors(elements)
            if MIN_VOCAB <= elements // n <= MAX_VOCAB and _n_ok(n, hints)
        }
    return sorted(out)


def shifted_candidates(elements: int, tokens: set[int], hints: Hints) -> list[tuple[int, int]]:
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


def score_reading(
    n: int,
    v: int,
    sizes: Counter[int],
    loss_sizes: list[int],
    matmuls: frozenset[int] = frozenset(),
    shift: int | None = None,
    forward_only: bool = False,
    direct: Direct = Direct(),
) -> Reading:
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
    held_weight = _held_weight(tokens, v, h.size, sizes, direct, made)
    if held_weight and v in (n, tokens):
        reasons.append(
            "a [V, H] block made before the forward (a parameter: an lm_head's or embedding's "
            "weight, where a similarity [N, N] has [N, H] activations)"
        )
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
    if forward_only and h.size and v % h.size == 0 and v // h.size in PROJECTION_WIDTHS:
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
    return Reading(
        n, v, score, reasons, h.size, family, shift, h.weight_itemsizes, bool(ids), head_agrees,
        weight_agrees, h.weight_blocks, held_weight,
    )  # fmt: skip


def _held_weight(
    n: int, v: int, hidden: int | None, sizes: Counter[int], direct: Direct, family: set[int]
) -> bool:
    """Whether a [V, H] block was made before the forward (or held across the trace): a
    parameter, which [N, H] activations of the same bytes (N = V) are not. H is the
    activations' hidden size, or (a step with one matmul per hidden size, too few to
    read H by) any H a forward matmul's [N, H] output has."""
    params = Counter(dict(direct.params))
    if not params:
        return False
    made = direct.matmul_counts() or sizes
    widths = (
        {hidden}
        if hidden is not None
        else {
            s // (n * k) for s in made if s not in family for k, _ in ITEMSIZES if s % (n * k) == 0
        }
    )
    return any(
        MIN_HIDDEN <= h <= MAX_HIDDEN and h % HIDDEN_STEP == 0 and h < v
        and 0 < params[v * h * k] <= MAX_VOCAB_WEIGHTS
        for h in widths
        for k, _ in ITEMSIZES
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
) -> HiddenReading:
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
    best: HiddenReading | None = None
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
            best = HiddenReading(
                h, score, reasons, tuple(k for k, _ in weights), itemsize,
                held[v * h * weights[0][0]] if weights else 0,
            )  # fmt: skip
    if best is None:
        return HiddenReading(None, 0.0, [], (), None)
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


def _refuse_a_size_that_does_not_divide(n: int, hints: Hints) -> None:
    """One of --tokens/--batch that does not divide the logits' N = B·S rows is not this
    snapshot's: it was dropped without a word, the shapes line read N alone and asked for
    the very flag given, and --what-if simulated the loss at the file's sizes. (Both
    given fix N whatever the rows: a chunked loss holds a chunk of the tokens.)"""
    given = [(f, v) for f, v in (("--tokens", hints.tokens), ("--batch", hints.batch)) if v]
    if len(given) != 1 or n % given[0][1] == 0:
        return
    flag, value = given[0]
    raise UserError(
        f"{flag} {value:,} does not divide the {n:,} token rows (N = B·S) of this "
        "snapshot's logits",
        f"drop {flag}, or give a divisor of {n:,}; for a chunked loss (its blocks hold a "
        "chunk of the tokens) give --tokens and --batch both",
    )


def split_batch(
    n: int, hints: Hints, direct: Direct, hidden: int | None = None
) -> tuple[int | None, int | None, list[str]]:
    """(B, S, reasons): given, or read off blocks whose op names S directly: positions
    (``arange`` of S int64) or a mask ``[S, S]`` (``triu``/``tril``/``ones``), backed by
    attention scores ``[B, h, S, S]`` (a head count that fits H) or rotary tables;
    (None, None) when no S is singled out. Sizes alone never split N."""
    _refuse_a_size_that_does_not_divide(n, hints)
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


def vocab_argued(r: Reading) -> bool:
    """Whether the trace argues V itself: a [V, H] weight (in either dtype), or a loss
    over V whose rows the token ids [N] confirm. A square [N, N] is a similarity or an
    attention matrix (retrieval's in-batch negatives) unless a [V, H] parameter (made
    before the forward) and token ids [N] say it is a language model's logits with as
    many tokens as vocabulary entries (Mistral's 32,768 at a 32k context): a similarity's
    [N, H] operands are activations, and its targets an arange, not token ids. A
    language model's vocabulary is larger than its hidden size. One block of [V, H]'s
    bytes is a coincidence (a graph's node features [nodes, H] under a softmax over the
    nodes): a weight argues V when there are several (embedding, lm_head, gradients,
    optimizer state) or when a forward matmul made the [N, V] in its dtype (the lm_head).
    Fewer than MIN_LOSS_TOKENS rows (blocks of a few KiB: a softmax over a graph's
    scores, a classifier on a handful of items) argue nothing about a vocabulary."""
    if r.hidden is not None and r.v <= r.hidden:
        return False
    if r.v in (r.n, r.tokens):
        return r.held_weight and r.ids and r.tokens >= MIN_LOSS_TOKENS
    if r.tokens < MIN_LOSS_TOKENS:
        return False
    weight = bool(r.weight_itemsizes) and (r.weight_blocks >= 2 or r.weight_agrees)
    return weight or (r.ids and r.tokens >= MIN_LOSS_TOKENS)
