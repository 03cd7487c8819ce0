"""``--other`` read from snapshots: what the rest of the job holds beside the logprob step.

Each snapshot gives one reading (tokens N = B·S, bytes) of the memory that is not the
logprob step at that step's moment (:func:`memprobe.attribute.other_memory.other_memory`).
One reading (or several at one token count) is a constant; readings at two or more
token counts are fitted by least squares to ``constant + per_token · N``: weights and
optimizer state do not grow with the tokens, activations do. The fit's residual (the
largest distance of a reading from the line) is stated with it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes


@dataclass(frozen=True)
class OtherFit:
    """``other(N) = constant + per_token · N`` bytes, from ``points`` (tokens, bytes)."""

    constant_bytes: float
    per_token_bytes: float
    residual_bytes: float
    points: tuple[tuple[int, int], ...]

    def at(self, tokens: int) -> int:
        """The other memory at ``tokens`` (N = B·S per rank), whole bytes, rounded up."""
        return max(0, math.ceil(self.constant_bytes + self.per_token_bytes * tokens))

    def describe(self) -> str:
        n = len(self.points)
        read = f"{n} snapshot{'s' if n != 1 else ''}"
        if not self.per_token_bytes:
            spread = f" (spread {format_bytes(self.residual_bytes)})" if n > 1 else ""
            return f"other: {format_bytes(self.constant_bytes)}, read from {read}{spread}"
        at = ", ".join(f"{t:,} tokens: {format_bytes(b)}" for t, b in self.points)
        return (
            f"other: {format_bytes(self.constant_bytes)} + "
            f"{format_bytes(self.per_token_bytes)} per token, fitted to {read} ({at}; "
            f"residual {format_bytes(self.residual_bytes)}); the plan's peaks include "
            "its per-token part"
        )


def fit_other(points: Sequence[tuple[int, int]]) -> OtherFit:
    """The constant (one token count) or least-squares line (two or more) through ``points``."""
    if not points:
        raise ValueError("fit_other needs at least one reading")
    pts = tuple(sorted((int(t), int(b)) for t, b in points))
    xs = [t for t, _ in pts]
    ys = [b for _, b in pts]
    if len(set(xs)) < 2:
        return OtherFit(float(max(ys)), 0.0, float(max(ys) - min(ys)), pts)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x in xs)
    constant = my - slope * mx
    residual = max(abs(y - (constant + slope * x)) for x, y in pts)
    return OtherFit(constant, slope, residual, pts)


def other_from_snapshots(
    paths: Sequence[str | os.PathLike[str]], *, vocab: int | None = None
) -> OtherFit:
    """Read each snapshot's other memory and fit them (see the module notes). With
    ``vocab`` (the plan's), a snapshot whose loss is over another vocabulary is refused:
    it is another job (its lm_head, embedding and their optimizer state are another size),
    and its "other" would be planned as this one's."""
    from memprobe.attribute.other_memory import other_memory
    from memprobe.snapshot.load import load_snapshot

    points = []
    for path in paths:
        snapshot = load_snapshot(path)
        try:
            reading = other_memory(snapshot, path=str(path))
        except UserError as exc:
            message, hint = _as_other_from(exc.message), _as_other_from(exc.hint)
            raise UserError(f"--other-from {path}: {message}", hint) from None
        if vocab is not None and reading.vocab and reading.vocab != vocab:
            raise UserError(
                f"--other-from {path}: its loss is over a vocabulary of {reading.vocab:,}, "
                f"and this plan's --vocab is {vocab:,}",
                "profile the job you plan (its model at its vocabulary), or give --other",
            )
        points.append((reading.tokens, reading.other_bytes))
    fit = fit_other(points)
    if fit.per_token_bytes < 0:
        # Weights and optimizer state stay, activations grow: one job's other memory never
        # falls as its tokens grow. Snapshots of two jobs (another model, layout or
        # checkpointing) fitted a negative per-token part, and the plan took it: "other"
        # fell to 0 B at the answer (a 4-layer model's weights gone), or the kernel was
        # blamed for a peak that "stops growing with tokens".
        read = ", ".join(f"{t:,} tokens: {format_bytes(b)}" for t, b in fit.points)
        raise UserError(
            f"--other-from: the rest of the job holds less at more tokens ({read}), "
            "so these snapshots are not one job at different token counts (another model, "
            "batch layout or checkpointing?)",
            "give snapshots of the job you plan, profiled at each token count, or one snapshot",
        )
    return fit


# The loss step is found as --what-if finds it, and its refusals say what --what-if does
# with it; --other-from reads the memory beside that step (a user who never gave
# --what-if was told "--what-if cuts exactly one").
_OTHER_FROM_WORDS = (
    ("--what-if cuts a", "--other-from needs a"),
    ("--what-if cuts", "--other-from reads beside"),
    ("--what-if swaps", "--other-from reads"),
    ("--what-if replaces", "--other-from needs"),
    ("--what-if needs", "--other-from needs"),
    ("--what-if", "--other-from"),
    ("nothing to replace", "nothing to read beside"),
)


def _as_other_from(text: str) -> str:
    """A loss-step refusal worded for --other-from."""
    for said, meant in _OTHER_FROM_WORDS:
        text = text.replace(said, meant)
    return text
