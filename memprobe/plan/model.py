"""What is planned and what a plan says: the budget, the target, the fitted line,
a search's evidence and the answer for one target.

A :class:`PlanTarget` checks itself when made: an unknown kernel, a tp that does
not divide the vocabulary or a hidden size for a logits kernel is a user error
before any simulation runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes, parse_size
from memprobe.kernels.registry import check_inputs_match, get_spec, kernel_names
from memprobe.records import DTYPES, Case, dtype_bytes, normalize_dtype

# Which peak a search plans on: the tracker's allocated bytes, or the reserved
# bytes of the CUDA caching-allocator model when one is installed.
ALLOCATED = "allocated"
RESERVED = "reserved"


@dataclass(frozen=True)
class Budget:
    """Bytes a GPU has, and bytes the rest of the job (weights, optimizer, activations) holds."""

    budget_bytes: int
    other_bytes: int = 0
    # The part of ``other`` the step counts itself (the lm_head weight, with
    # --other-includes-lm-head): given back, so it is not counted twice.
    in_step_bytes: int = 0
    # The part of "other" that grows with the step's tokens (activations), fitted from
    # snapshots by ``--other-from``; the searches add it to each simulated peak.
    other_per_token: float = 0.0
    # How far the farthest snapshot's reading lies from that fit (None: --other was given).
    other_residual: float | None = None

    @property
    def limit_bytes(self) -> int:
        """What the logprob step may use: budget − other's constant (+ what both count)."""
        return self.budget_bytes - self.other_bytes + self.in_step_bytes

    def other_growth(self, target: PlanTarget, local_tokens: int) -> int:
        """Bytes of "other" beyond its constant at ``local_tokens`` per sequence per rank."""
        return math.ceil(self.other_per_token * target.batch * local_tokens)


def make_budget(budget: str | int, other: str | int = 0) -> Budget:
    """Sizes as users write them (``"80GiB"``, bytes) → a checked :class:`Budget`."""
    budget_bytes = parse_size(budget, what="--budget")
    other_bytes = parse_size(other, what="--other")
    if other_bytes > budget_bytes:
        shown = _told_apart(other_bytes, budget_bytes)
        raise UserError(
            f"--other {shown[0]} is more than --budget {shown[1]}",
            "the budget is the GPU's whole memory; --other is the part the rest of the job holds",
        )
    return Budget(budget_bytes, other_bytes)


def _told_apart(*sizes: int) -> list[str]:
    """Sizes as a line compares them: two decimals of a unit, or, where that rounds them
    to one figure ("--other 1.00 GiB is more than --budget 1.00 GiB" of 1.0000001GiB), each
    in bytes too."""
    shown = [format_bytes(n) for n in sizes]
    if len(set(shown)) < len(set(sizes)):
        shown = [f"{s} ({n:,} B)" for s, n in zip(shown, sizes, strict=True)]
    return shown


def with_lm_head_in_other(budget: Budget, targets: list[PlanTarget]) -> Budget:
    """``budget`` where --other already holds the lm_head weight (--other-includes-lm-head).

    The weight is the one tensor both count at every moment of the step, so giving it
    back is exact. Its gradient is not given back: the step makes it (a new .grad, or a
    buffer added into an existing one), and that buffer is real memory at the peak.
    """
    sizes = {t.lm_head_bytes for t in targets}
    if None in sizes or len(sizes) != 1:
        raise UserError(
            "--other-includes-lm-head is for --hidden plans (the lm_head weight is in the step)",
            "add --hidden H, or drop --other-includes-lm-head",
        )
    (weight,) = sizes
    assert weight is not None
    if weight > budget.other_bytes:
        raise UserError(
            f"--other {format_bytes(budget.other_bytes)} cannot include the lm_head weight: "
            f"it alone is {format_bytes(weight)}",
            "check --other, --vocab and --hidden, or drop --other-includes-lm-head",
        )
    return replace(budget, in_step_bytes=weight)


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"{name} must be a positive integer, got {value!r}", f"e.g. {name}=1")


def _check_layout(kernel: str, tp: int, cp: int) -> None:
    """The kernel's input protocol's layout rule, so a plan never answers for a layout
    the sweep skips: the hidden family's simulation holds the whole sequence on one
    device, and dividing that by cp would not be one rank's peak."""
    from memprobe.measure.protocol import protocol_for

    why = protocol_for(kernel).unsupported_layout(tp, cp)
    if why is not None:
        raise UserError(
            f"{kernel} at tp {tp} cp {cp}: {why}, so memprobe cannot plan it per rank",
            "plan --hidden with --tp 1 --cp 1",
        )


@dataclass(frozen=True)
class PlanTarget:
    """One kernel on one parallel layout at one chunk size: what one plan answers for.

    Checked when made; the dtype is stored by memprobe's name (``bfloat16`` →
    ``bf16``) and a kernel that ignores the chunk size gets None.
    """

    kernel: str
    vocab: int
    batch: int = 1
    dtype: str = "bf16"
    chunk_size: int | None = 1024
    tp: int = 1
    cp: int = 1
    hidden: int | None = None  # H for the hidden family

    def __post_init__(self) -> None:
        try:
            spec = get_spec(self.kernel)
        except ValueError as exc:
            raise UserError(str(exc), "see `memprobe kernels`") from None
        for name in ("vocab", "batch", "tp", "cp"):
            _positive(name, getattr(self, name))
        chunk = self.chunk_size
        if chunk is not None and (
            isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0
        ):
            raise UserError(f"chunk size must be a positive integer, got {chunk!r}", "e.g. 1024")
        key = normalize_dtype(self.dtype) if isinstance(self.dtype, str) else None
        if key is None:
            raise UserError(f"unknown dtype {self.dtype!r}", f"use one of: {', '.join(DTYPES)}")
        if self.tp > 1 and not spec.distributed:
            sharded = ", ".join(kernel_names(distributed=True))
            raise UserError(
                f"tp {self.tp} shards the vocabulary, which {self.kernel} cannot do",
                f"use tp with: {sharded}",
            )
        if self.vocab % self.tp:
            raise UserError(
                f"--tp {self.tp} does not divide the vocabulary {self.vocab}", "pick a tp that does"
            )
        if self.hidden is not None:
            _positive("hidden", self.hidden)
        check_inputs_match([self.kernel], self.hidden)
        _check_layout(self.kernel, self.tp, self.cp)
        # Normalized in place: the record is frozen, and these are its canonical values.
        object.__setattr__(self, "dtype", key)
        object.__setattr__(self, "chunk_size", chunk if spec.uses_chunk_size else None)

    @property
    def lm_head_bytes(self) -> int | None:
        """The lm_head weight [V,H] in the step's dtype, live through the whole step of a
        hidden-family kernel (None for logits kernels)."""
        if self.hidden is None:
            return None
        return self.vocab * self.hidden * dtype_bytes(self.dtype)

    def case(self, local_tokens: int) -> Case:
        """The simulated case with ``local_tokens`` on each rank (``Case.tokens`` is global)."""
        return Case(
            self.kernel,
            self.batch,
            local_tokens * self.cp,
            self.vocab,
            self.dtype,
            self.chunk_size,
            self.tp,
            self.cp,
            "meta",
            self.hidden,
        )


@dataclass(frozen=True)
class Line:
    """``peak ≈ slope · tokens + fixed``, fitted through two simulated points."""

    slope: float
    fixed: float

    @classmethod
    def through(cls, a: tuple[int, int], b: tuple[int, int]) -> Line:
        (t1, p1), (t2, p2) = sorted((a, b))
        slope = (p2 - p1) / (t2 - t1)
        return cls(slope, p1 - slope * t1)

    def tokens_within(self, limit: int) -> int | None:
        """The largest token count the line puts at or under ``limit`` (None if flat)."""
        if self.slope <= 0:
            return None
        return max(0, math.floor((limit - self.fixed) / self.slope))


@dataclass(frozen=True)
class Probe:
    """One token count a search tried, and its peak: what progress shows while a long
    search runs (a whole step's trace takes seconds to minutes)."""

    target: PlanTarget
    kind: str  # ALLOCATED | RESERVED: the peak compared with the limit
    tokens: int  # per GPU (per sequence for a whole step)
    peak: int  # what the limit is compared with (the rest of the job included)
    limit: int

    @property
    def fits(self) -> bool:
        return self.peak <= self.limit


OnProbe = Callable[[Probe], None]


@dataclass(frozen=True)
class Search:
    """Where a search ended: the boundary and the evidence on both sides of it."""

    max_tokens: int
    peak_at_max: int | None  # None when nothing fits (max_tokens 0)
    # The peak at max_tokens + 1, the first count that does not fit; None when no longer
    # sequence can run (a whole-step plan that reached the positions the model learned).
    peak_above: int | None
    line: Line
    predicted: int | None  # what the seed line alone said
    simulations: int
    points: tuple[tuple[int, int], ...] = ()  # every (tokens, peak) simulated, by tokens

    @property
    def line_error_bytes(self) -> float | None:
        """Simulated peak at the answer minus the line's: how far the seed line was off.
        Where nothing fits, at one token (the count that does not fit): the line comes
        from counts far above, and its ``fixed`` (a chunk's whole workspace, say) can be
        megabytes more than one token's whole peak."""
        if self.peak_at_max is not None:
            return self.peak_at_max - (self.line.slope * self.max_tokens + self.line.fixed)
        if self.max_tokens == 0 and self.peak_above is not None:
            return self.peak_above - (self.line.slope + self.line.fixed)
        return None

    @property
    def line_exact(self) -> bool:
        """Whether the seed line alone was right. Where nothing fits, the line "predicts"
        no tokens as the search finds none whatever it is off by (a plan at a 4 KiB
        budget said `fixed 4.00 MiB ... exact` of a kernel one token of which needs
        8 KiB): there it must be within one token's bytes of the peak at one token."""
        if self.max_tokens == 0:
            error = self.line_error_bytes
            return error is None or abs(error) < max(self.line.slope, 1.0)
        return self.predicted == self.max_tokens


@dataclass(frozen=True)
class TokenPlan:
    """The answer for one target: tokens per GPU, the peak there, the line that predicted it."""

    target: PlanTarget
    budget: Budget
    allocated: Search
    reserved: Search | None = None

    @property
    def max_tokens(self) -> int:
        """Tokens per GPU (per sequence, each rank's share of it under context parallelism)."""
        return self.allocated.max_tokens

    @property
    def global_tokens(self) -> int:
        """The sequence length across the context-parallel group."""
        return self.allocated.max_tokens * self.target.cp

    @property
    def fits_at_all(self) -> bool:
        return self.allocated.max_tokens > 0

    @property
    def at_positions(self) -> bool:
        """The model's learned positions, not the budget, end the answer."""
        return self.allocated.peak_above is None

    def row(self) -> dict[str, Any]:
        """One flat, JSON-ready row (the ``--json`` output)."""
        a = self.allocated
        row: dict[str, Any] = {
            **asdict(self.target),
            "max_tokens": a.max_tokens,
            "global_tokens": self.global_tokens,
            "peak_bytes_at_max": a.peak_at_max,
            "peak_bytes_above_max": a.peak_above,
            "budget_bytes": self.budget.budget_bytes,
            "other_bytes": self.budget.other_bytes,
            "limit_bytes": self.budget.limit_bytes,
            "slope_bytes_per_token": a.line.slope,
            "fixed_bytes": a.line.fixed,
            "predicted_tokens": a.predicted,
            "line_exact": a.line_exact,
            "line_error_bytes": a.line_error_bytes,
            "simulations": a.simulations,
            "peak_kind": ALLOCATED,
        }
        if self.budget.in_step_bytes:  # --other-includes-lm-head
            row["other_in_step_bytes"] = self.budget.in_step_bytes
        r = self.reserved
        row["reserved_max_tokens"] = r.max_tokens if r else None
        row["reserved_peak_bytes_at_max"] = r.peak_at_max if r else None
        return row
