"""One ``[B, S, V] × dtype`` reading of a block, and why.

The reading comes from :mod:`memprobe.attribute.shapes` (inference over the whole
trace, or memprobe's own label); a block gets one only when it is on the logits
path (:mod:`memprobe.attribute.categories`). Bytes alone never make a reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Explanation:
    """One ``[B, S, V] × dtype`` reading of a block, with why it ranks where it does."""

    # The JSON form (memprobe.io.codec) writes the shape beside the dtype.
    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "dtype", "shape", "batch", "tokens", "vocab", "exact", "score", "reasons", "split",
    )  # fmt: skip

    dtype: str
    batch: int
    tokens: int
    vocab: int
    exact: bool  # bytes == B·S·V·itemsize (else it fits only after allocator rounding)
    score: int
    reasons: tuple[str, ...]
    split: bool = True  # False: B and S unknown, ``tokens`` is N = B·S

    @property
    def shape(self) -> tuple[int, ...]:
        if not self.split:
            return (self.tokens, self.vocab)
        return (self.batch, self.tokens, self.vocab)

    def describe(self) -> str:
        if not self.split:
            return f"{self.dtype} [N={self.tokens}, V={self.vocab}]"
        return f"{self.dtype} [{self.batch}, {self.tokens}, {self.vocab}]"
