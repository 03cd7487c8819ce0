"""Which ``[B, S, V] × dtype`` tensors could a block of N bytes be?

Bytes alone cannot tell a float32 ``[1, 20000, 131072]`` from a float32
``[1, 80000, 32768]``: the same number fits many shapes. So every fit is listed,
scored by what supports it (the user's ``--vocab/--tokens/--batch``, memprobe's own
label on the allocation, the op, round sequence lengths), most likely first, each
with its reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memprobe.snapshot.allocator import could_hold

# Vocabulary sizes of widely used tokenizers (and their padded variants).
COMMON_VOCABS: tuple[int, ...] = (
    32000, 32064, 32768, 50257, 50304, 65536, 100352,
    128000, 128256, 131072, 151936, 152064, 256000, 262144,
)  # fmt: skip
DTYPE_BYTES: tuple[tuple[str, int], ...] = (("float32", 4), ("bfloat16", 2), ("float16", 2))
# Shards a given dimension may arrive in: tensor parallel splits V, context parallel S.
SHARDS = (2, 4, 8)
# Ops whose [B,S,V] output is float32 in mixed-precision log-prob code.
_FLOAT32_OPS = ("softmax", "logsumexp", "log_softmax")
_CAST_OPS = ("_to_copy", "to_copy", ".float", "float(")
_MAX_TOKENS = 1 << 21  # more than 2M tokens on one rank is not a plausible S
_LONG_TOKENS = 1 << 17  # beyond 128k tokens per rank is uncommon


@dataclass(frozen=True)
class Explanation:
    """One ``[B, S, V] × dtype`` reading of a block, with why it ranks where it does."""

    dtype: str
    batch: int
    tokens: int
    vocab: int
    exact: bool  # bytes == B·S·V·itemsize (else it fits only after allocator rounding)
    score: int
    reasons: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.batch, self.tokens, self.vocab)

    def describe(self) -> str:
        return f"{self.dtype} [{self.batch}, {self.tokens}, {self.vocab}]"

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "batch": self.batch,
            "tokens": self.tokens,
            "vocab": self.vocab,
            "exact": self.exact,
            "score": self.score,
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Explanation:
        return cls(
            dtype=d["dtype"],
            batch=d["batch"],
            tokens=d["tokens"],
            vocab=d["vocab"],
            exact=d["exact"],
            score=d["score"],
            reasons=tuple(d["reasons"]),
        )


@dataclass(frozen=True)
class Hints:
    """What is known besides the byte count."""

    vocab: int | None = None
    tokens: int | None = None
    batch: int | None = None
    op: str | None = None
    recorded_dtype: str | None = None  # from memprobe's label: "float32", …
    recorded_shape: tuple[int, ...] | None = None
    # Sizes of every block in the trace: a float32 or int64 [B, S] block (the
    # log-probs, the targets) of 4·B·S or 8·B·S bytes is evidence for that B·S.
    block_sizes: frozenset[int] = frozenset()


def _candidates(
    given: int | None, common: tuple[int, ...], what: str
) -> list[tuple[int, int, str]]:
    """(value, score, reason) for a dimension: the given one and its shards, or the common list."""
    if given is None:
        return [(v, 0, f"V = {v} is a common vocabulary size") for v in common] if common else []
    out = [(given, 100, f"{what} = {given} as given")]
    out += [
        # Fewer shards are the more common setup: 2-way ranks above 8-way.
        (given // k, 60 - k, f"{what} = {given}/{k}: a {k}-way shard of the given {what}")
        for k in SHARDS
        if given % k == 0
    ]
    return out


def _bs_for(nbytes: int, exact_size: bool, per_token: int) -> tuple[int, bool] | None:
    """Tokens (B·S) a block of ``nbytes`` holds at ``per_token`` bytes each, and whether exact."""
    if per_token <= 0:
        return None
    if nbytes % per_token == 0:
        return nbytes // per_token, True
    if exact_size:
        return None
    bs = nbytes // per_token
    return (bs, False) if bs > 0 and could_hold(nbytes, bs * per_token) else None


def explain_block(nbytes: int, hints: Hints, *, exact_size: bool = True) -> list[Explanation]:
    """Every ``[B, S, V] × dtype`` fit for ``nbytes``, best first.

    ``exact_size``: the byte count is the tensor's requested size (trace entries and
    ``requested_size`` are); when False it is a block size that may include the
    allocator's rounding, and fits within that slack are accepted too.
    """
    if nbytes <= 0:
        return []
    vocabs = _candidates(hints.vocab, COMMON_VOCABS, "V")
    out: list[Explanation] = []
    for dtype, itemsize in DTYPE_BYTES:
        for vocab, v_score, v_reason in vocabs:
            fit = _bs_for(nbytes, exact_size, itemsize * vocab)
            if fit is None:
                continue
            bs, exact = fit
            for batch, tokens, bs_score, bs_reasons in _split_tokens(bs, hints):
                if exact:
                    size_reason = f"exactly B·S·V·{itemsize} bytes"
                else:
                    slack = nbytes - batch * tokens * vocab * itemsize
                    size_reason = f"fits after allocator rounding ({slack:,} bytes of slack)"
                d_score, d_reasons = _dtype_score(dtype, hints)
                score = v_score + bs_score + (20 if exact else 0) + d_score
                reasons = [v_reason, *bs_reasons, size_reason, *d_reasons]
                clue = _token_clue(batch * tokens, hints.block_sizes)
                if clue:
                    score += 8
                    reasons.append(clue)
                if tokens > _MAX_TOKENS:
                    score -= 30
                    reasons.append(f"S = {tokens:,} is implausibly long for one rank")
                elif tokens > _LONG_TOKENS:
                    score -= 5
                    reasons.append(f"S = {tokens:,} is longer than most sequences (> 128k)")
                if hints.recorded_shape == (batch, tokens, vocab):
                    # The tracker saw the tensor: nothing else needs saying.
                    score += 1000
                    what = hints.recorded_dtype or dtype
                    reasons = [f"memprobe's label records {what} [{batch}, {tokens}, {vocab}]"]
                    reasons.append(size_reason)
                out.append(Explanation(dtype, batch, tokens, vocab, exact, score, tuple(reasons)))
    # Stable ties: larger vocabularies first (modern LLMs), then the dtype order above.
    out.sort(key=lambda e: (-e.score, -e.vocab))
    return out


def _split_tokens(bs: int, hints: Hints) -> list[tuple[int, int, int, list[str]]]:
    """Ways to read B·S = ``bs`` as (B, S), with score and reasons."""
    out = []
    if hints.batch is not None and hints.tokens is not None:
        for s, s_score, s_reason in _candidates(hints.tokens, (), "S"):
            if hints.batch * s == bs:
                out.append(
                    (hints.batch, s, 100 + s_score, [f"B = {hints.batch} as given", s_reason])
                )
        return out
    if hints.batch is not None:
        if bs % hints.batch == 0:
            s = bs // hints.batch
            out.append(
                (
                    hints.batch,
                    s,
                    100 + _round_score(s)[0],
                    [f"B = {hints.batch} as given", *_round_score(s)[1]],
                )
            )
        return out
    if hints.tokens is not None:
        for s, s_score, s_reason in _candidates(hints.tokens, (), "S"):
            if bs % s == 0:
                b = bs // s
                # One (packed) sequence per rank is the usual long-context layout.
                bonus = 2 if b == 1 else 0
                out.append((b, s, s_score + bonus, [s_reason, f"B = {b} from B·S = {bs:,}"]))
        return out
    score, reasons = _round_score(bs)
    return [
        (
            1,
            bs,
            score,
            [f"B·S = {bs:,}; B = 1 assumed (pass --batch or --tokens to split)", *reasons],
        )
    ]


_MIN_CLUE_TOKENS = 512  # below this a [B,S]-sized block is likely a coincidence


def _token_clue(bs: int, sizes: frozenset[int]) -> str | None:
    if bs < _MIN_CLUE_TOKENS:
        return None
    for itemsize, what in ((4, "a float32"), (8, "an int64")):
        if itemsize * bs in sizes:
            return f"{what} [B·S] block of {itemsize * bs:,} bytes ({bs:,} tokens) is there too"
    return None


def _round_score(tokens: int) -> tuple[int, list[str]]:
    if tokens % 1024 == 0:
        return 4, [f"S = {tokens:,} is a multiple of 1024"]
    if tokens % 1000 == 0:
        return 4, [f"S = {tokens:,} is a round number"]
    return 0, []


def _dtype_score(dtype: str, hints: Hints) -> tuple[int, list[str]]:
    if hints.recorded_dtype:
        if hints.recorded_dtype == dtype:
            return 500, [f"memprobe's label records dtype {dtype}"]
        return -500, [f"memprobe's label records dtype {hints.recorded_dtype}, not {dtype}"]
    op = (hints.op or "").lower()
    if dtype == "float32":
        if any(k in op for k in _FLOAT32_OPS):
            return 30, [f"{hints.op} over [B,S,V] runs in float32 in mixed-precision code"]
        if any(k in op for k in _CAST_OPS):
            return 10, [f"{hints.op} is a dtype cast: up-casting bf16 logits makes a float32 copy"]
        return 5, ["float32 [B,S,V] copies are what blow up log-prob memory"]
    if dtype == "bfloat16":
        return 3, ["bf16 is the usual dtype of the logits themselves"]
    return 1, ["fp16 logits are rarer than bf16 (same bytes)"]
