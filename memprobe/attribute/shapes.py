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

B and S are split only when attention-shaped ``[B, h, S, S]`` blocks and a mask or
position block of that S are there too; otherwise the answer is ``[N=B·S, V]``.
The user's ``--vocab/--tokens/--batch`` override whatever they fix.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MIN_VOCAB = 256  # a classifier over fewer classes is not a language model's head
MAX_VOCAB = 1 << 20
MIN_LOSS_BLOCK = 1024  # smaller loss-made blocks are scalars and per-row statistics
MIN_HIDDEN, MAX_HIDDEN, HIDDEN_STEP = 64, 65536, 64
MAX_HEADS = 256
PLAUSIBLE_HIDDEN = 256
# bytes / (N·H) of activations: [N, H], [N, 3H] (qkv), [N, 4H] (MLP) in 16/32-bit
_ACTIVATION_RATIOS = frozenset(
    {2, 4, 6, 8, 12, 16}
)  # language models' hidden sizes are at least this
MAX_CANDIDATE_SIZES = 8  # loss-made sizes tried as N·V·itemsize (largest first)
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

    @property
    def known(self) -> bool:
        return self.tokens is not None and self.vocab is not None

    def shape_text(self) -> str:
        if not self.known:
            return "[B, S, V] unknown"
        if self.batch is not None and self.seq is not None:
            return f"[B={self.batch:,}, S={self.seq:,}, V={self.vocab:,}]"
        return f"[N=B·S={self.tokens:,}, V={self.vocab:,}]"

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "vocab": self.vocab,
            "hidden": self.hidden,
            "batch": self.batch,
            "seq": self.seq,
            "family": [list(f) for f in self.family],
            "logits_dtype": self.logits_dtype,
            "logits_path": self.logits_path,
            "confidence": self.confidence,
            "evidence": list(self.evidence),
            "alternatives": list(self.alternatives),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShapeInference:
        return cls(
            **{
                **d,
                "family": tuple((int(b), str(t)) for b, t in d["family"]),
                "evidence": tuple(d["evidence"]),
                "alternatives": tuple(d["alternatives"]),
            }
        )


@dataclass(frozen=True)
class Hints:
    vocab: int | None = None
    tokens: int | None = None  # S, as the CLI's --tokens
    batch: int | None = None


@dataclass
class _Reading:
    n: int
    v: int
    score: float
    reasons: list[str]
    hidden: int | None
    family: list[tuple[int, str]]


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
) -> ShapeInference:
    """``sizes``: how many blocks of each byte count the trace holds; ``loss_sizes``:
    byte counts of blocks made by a softmax/loss over V (or their backward);
    ``labelled``: shapes memprobe's own labels record for such blocks (exact);
    ``matmul_sizes``: byte counts of forward matmul outputs (the lm_head is one)."""
    matmuls = frozenset(matmul_sizes)
    candidates = sorted({s for s in loss_sizes if s >= MIN_LOSS_BLOCK}, reverse=True)
    if not candidates:
        return _without_logits_path(hints)
    readings: dict[tuple[int, int], _Reading] = {}
    recorded: dict[tuple[int, int], tuple[int, ...]] = {}
    for shape in labelled:
        if len(shape) >= 2 and _vocab_ok(shape[-1], hints):
            n = 1
            for d in shape[:-1]:
                n *= d
            recorded[(n, shape[-1])] = shape
    for (n, v), shape in recorded.items():
        reading = _score(n, v, sizes, candidates, matmuls)
        reading.score += 10
        reading.reasons.insert(0, f"memprobe's label records {list(shape)}")
        readings[(n, v)] = reading
    small_sizes = [s for s in sizes if s % 4 == 0]
    for x in candidates[:MAX_CANDIDATE_SIZES]:
        for itemsize, _ in ITEMSIZES:
            if x % itemsize:
                continue
            elements = x // itemsize
            for n in _token_candidates(elements, small_sizes, hints):
                v = elements // n
                if (n, v) in readings or not _vocab_ok(v, hints):
                    continue
                readings[(n, v)] = _score(n, v, sizes, candidates, matmuls)
    if not readings:
        return _without_logits_path(hints, found_loss=True)
    ranked = sorted(readings.values(), key=lambda r: (-r.score, -r.v))
    best = ranked[0]
    margin = best.score - ranked[1].score if len(ranked) > 1 else best.score
    given = hints.vocab is not None and hints.tokens is not None and hints.batch is not None
    if given:
        confidence = "given"
    elif margin >= 3:
        confidence = "high"
    elif margin >= 1:
        confidence = "medium"
    else:
        confidence = "low"
    shape = recorded.get((best.n, best.v))
    if shape is not None and len(shape) == 3 and hints.batch is None and hints.tokens is None:
        batch, seq, split_reasons = shape[0], shape[1], []
    else:
        batch, seq, split_reasons = _split(best.n, sizes, hints, best.hidden)
    family = sorted(best.family, key=lambda f: f[0])
    return ShapeInference(
        tokens=best.n,
        vocab=best.v,
        hidden=best.hidden,
        batch=batch,
        seq=seq,
        family=tuple(family),
        logits_dtype=family[0][1] if family else None,
        logits_path=True,
        confidence=confidence,
        evidence=tuple(best.reasons + split_reasons),
        alternatives=tuple(f"[N={r.n:,}, V={r.v:,}] (score {r.score:g})" for r in ranked[1:4]),
    )


def _without_logits_path(hints: Hints, *, found_loss: bool = False) -> ShapeInference:
    why = (
        "loss/softmax blocks are there, but none fits [N, V] with V >= "
        f"{MIN_VOCAB} (a classifier, not a language model's head?)"
        if found_loss
        else "no softmax / log_softmax / cross_entropy / nll_loss (or their backward) "
        "made a block in the trace"
    )
    n = hints.batch * hints.tokens if hints.batch and hints.tokens else None
    return ShapeInference(
        tokens=n,
        vocab=hints.vocab,
        hidden=None,
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
    out = set()
    for s in sizes:
        for width in (8, 4):
            if s % width == 0:
                n = s // width
                if n > 1 and elements % n == 0 and _n_ok(n, hints):
                    out.add(n)
    if not out:
        # No [N]-sized block: every split of the element count with a plausible V.
        out = {
            n
            for n in _divisors(elements)
            if MIN_VOCAB <= elements // n <= MAX_VOCAB and _n_ok(n, hints)
        }
    return sorted(out)


def _n_ok(n: int, hints: Hints) -> bool:
    return all(h is None or n % h == 0 for h in (hints.tokens, hints.batch))


def _score(
    n: int,
    v: int,
    sizes: Counter[int],
    loss_sizes: list[int],
    matmuls: frozenset[int] = frozenset(),
) -> _Reading:
    score = 0.0
    reasons: list[str] = []
    family = [(n * v * k, name) for k, name in ITEMSIZES if n * v * k in set(loss_sizes)]
    names = " and ".join(f"{name} ({n * v * k:,} B)" for k, name in ITEMSIZES
                         if n * v * k in set(loss_sizes))  # fmt: skip
    reasons.append(f"loss/softmax blocks of N·V = {n:,}·{v:,} elements in {names}")
    if len(family) > 1:
        score += 2
        reasons.append("the same [N, V] in two dtypes (logits and a float32 copy)")
    if 8 * n in sizes:
        score += 3
        reasons.append(f"{sizes[8 * n]} int64 [N] block(s) of {8 * n:,} B (targets / token ids)")
    if 4 * n in sizes:
        score += 1.5
        reasons.append(f"{sizes[4 * n]} float32 [N] block(s) of {4 * n:,} B (per-token loss)")
    lm_head = [n * v * k for k, _ in ITEMSIZES if n * v * k in matmuls]
    if lm_head:
        score += 2
        reasons.append(f"a forward matmul made a [N, V] block of {lm_head[0]:,} B (the lm_head)")
    hidden, h_score, h_reasons, weight_itemsize = _hidden(n, v, sizes)
    score += h_score
    reasons += h_reasons
    # A matmul's output has its weight's dtype: the lm_head's [N, V] and the [V, H]
    # weight agree in a consistent reading (fp32 [N, V] from a bf16 weight does not).
    if lm_head and weight_itemsize and lm_head[0] == n * v * weight_itemsize:
        score += 2
        reasons.append("the lm_head output and the [V, H] weight have the same dtype")
    if family and family[-1][1] == "float32":
        score += 1
        reasons.append("the loss's largest block read as float32 (loss math runs in float32)")
    if v in COMMON_VOCABS:
        score += 1
        reasons.append(f"V = {v:,} is a common tokenizer size")
    if n % 64 == 0:
        score += 0.5
    return _Reading(n, v, score, reasons, hidden, family)


def _hidden(n: int, v: int, sizes: Counter[int]) -> tuple[int | None, float, list[str], int | None]:
    """The hidden size H best supported by [N, H] / [N, 4H] activations and [V, H] weights."""
    activations: Counter[tuple[int, int]] = Counter()  # (H, itemsize) -> blocks
    family = {n * v * k for k, _ in ITEMSIZES}
    for s, count in sizes.items():
        if s in family:
            continue
        for itemsize, _ in ITEMSIZES:
            if s % (n * itemsize) == 0:
                h = s // (n * itemsize)
                if MIN_HIDDEN <= h <= MAX_HIDDEN and h % HIDDEN_STEP == 0:
                    activations[(h, itemsize)] += count
    best: tuple[float, int, list[str], int | None] | None = None
    for (h, itemsize), count in activations.items():
        if count < 2:
            continue
        # Each layer makes its own activations: many blocks are worth more than a few.
        score = min(math.log2(count), 12) / 2 + (1 if h >= PLAUSIBLE_HIDDEN else 0)
        reasons = [f"{count} activation block(s) of [N, H={h:,}] ({n * h * itemsize:,} B)"]
        wide = 4 * h * n * itemsize
        if wide in sizes and wide not in family:
            score += 1
            reasons.append(f"{sizes[wide]} MLP block(s) of [N, 4H] ({wide:,} B)")
        weights = [
            (k, name) for k, name in ITEMSIZES if v * h * k in sizes and v * h * k not in family
        ]
        weight_itemsize = weights[0][0] if weights else None
        if weights:
            k, name = weights[0]
            # Embedding and lm_head weight, grads, Adam state: several; one is a coincidence.
            score += (3 if sizes[v * h * k] >= 2 else 1) + (1 if k == itemsize else 0)
            reasons.append(
                f"{sizes[v * h * k]} {name} [V, H] block(s) of {v * h * k:,} B "
                "(embedding / lm_head weight, its gradient, optimizer state)"
            )
        if best is None or score > best[0]:
            best = (score, h, reasons, weight_itemsize)
    if best is None:
        return None, 0.0, [], None
    return best[1], min(best[0], 10.0), best[2], best[3]


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
    n: int, sizes: Counter[int], hints: Hints, hidden: int | None = None
) -> tuple[int | None, int | None, list[str]]:
    """(B, S, reasons): given, or supported by attention [B, h, S, S] blocks (whose head
    count fits H with a head size of 32-256) plus a mask or position block of that S;
    (None, None) when the evidence does not single one out."""
    if hints.tokens is not None and n % hints.tokens == 0:
        return n // hints.tokens, hints.tokens, [f"S = {hints.tokens:,} as given"]
    if hints.batch is not None and n % hints.batch == 0:
        return hints.batch, n // hints.batch, [f"B = {hints.batch:,} as given"]
    scored: list[tuple[int, int, int]] = []  # (evidence, S, attention blocks)
    for s in _divisors(n):
        if s < 16:
            continue
        b = n // s
        attention = 0
        for size, count in sizes.items():
            if hidden and size % (n * hidden) == 0 and size // (n * hidden) in _ACTIVATION_RATIOS:
                continue  # an activation [N, H] / [N, 3H] / [N, 4H], whatever else it divides into
            if size % (s * s) == 0:
                q = size // (s * s)
                if q % b == 0 and _heads_ok(q // b, hidden):
                    attention += count
        extra = sum(x in sizes for x in (s * s, 4 * s * s, 8 * s))
        if attention >= 2 and extra:
            scored.append((extra, attention, s))
    scored.sort(reverse=True)
    if not scored or (len(scored) > 1 and scored[0][:2] == scored[1][:2]):
        return None, None, ["B and S not split: no attention and mask evidence singles out S"]
    extra, attention, s = scored[0]
    return (
        n // s,
        s,
        [
            f"S = {s:,}: {attention} attention [B, h, S, S] block(s) and a [S, S] mask or "
            "[S] position block"
        ],
    )
