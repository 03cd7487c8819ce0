"""What the plan tells the user beside its table: what the reserved column stands on,
and what a hidden-family step counts that --other may hold too."""

from __future__ import annotations

from collections.abc import Sequence

from memprobe.allocator import settings_words
from memprobe.io.sizes import format_bytes
from memprobe.plan.long_loops import RESERVED_MAX_CHUNKS
from memprobe.plan.model import Budget, PlanTarget, TokenPlan


def reserved_status(setting: tuple[str, str | None] | None = None) -> str:
    """One line on what the reserved column is planned on, and what it promises. The
    reserved peak is not monotone in tokens: blocks round up to the allocator's sizes and a
    few tokens more can land in a segment that was already there (chunked_distributed at tp
    2, 80 GiB - 54 GiB: 105,382 fits, 105,383-105,392 do not, 105,393-105,398 fit). So the
    answer is a boundary, not the largest count that fits."""
    return (
        "reserved: planned on memprobe's model of the CUDA caching allocator with "
        f"{settings_words(setting)} (memory outside PyTorch's allocator, e.g. the CUDA "
        "context, not included); tokens (reserved) fits and one token more does not, but "
        "the reserved peak is not monotone in tokens: some larger counts may fit too"
    )


def lm_head_status(targets: Sequence[PlanTarget], budget: Budget) -> str | None:
    """For hidden-family plans: the step itself holds the lm_head weight, its gradient and
    the hidden states with theirs, so --other must not hold the weight as well."""
    sizes = {t.lm_head_bytes for t in targets if t.lm_head_bytes is not None}
    if not sizes:
        return None
    size = format_bytes(max(sizes))
    if budget.in_step_bytes:
        return (
            f"lm_head: the weight [V,H] ({size}) is in --other and in the step, so it is given "
            "back once (--other-includes-lm-head); its gradient stays counted: the step makes it"
        )
    return (
        f"lm_head: the step counts the weight [V,H] ({size}), its gradient and the hidden "
        "states [B,S,H] with theirs; keep the weight out of --other, or pass "
        "--other-includes-lm-head"
    )


def long_loop_status(plans: Sequence[TokenPlan]) -> str | None:
    """Which plans have no reserved answer because their loop is too long to replay."""
    left = [p for p in plans if p.reserved is None]
    if not left:
        return None
    names = ", ".join(
        dict.fromkeys(f"{p.target.kernel} (chunk {p.target.chunk_size})" for p in left)
    )
    return (
        f"reserved: not planned for {names}: past {RESERVED_MAX_CHUNKS} chunks its simulation "
        "runs every chunk (the allocated answer is exact); a larger --chunk-size shortens it"
    )


def kept_memory_status(targets: Sequence[PlanTarget]) -> str | None:
    """Which kernels keep memory between calls, whose sizes were each simulated afresh."""
    from memprobe.measure import fresh

    names = list(dict.fromkeys(t.kernel for t in targets if fresh.keeps(t.kernel)))
    if not names:
        return None
    return (
        f"kept memory: {', '.join(names)} keep{'s' if len(names) == 1 else ''} memory between "
        "calls (a cache, a global): each size is the second call of a loop at that size, "
        "simulated in a process of its own, beside what the first call kept"
    )
