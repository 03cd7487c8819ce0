"""Which targets a plan covers: every kernel × tp × cp × chunk size that can run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from memprobe.errors import UserError
from memprobe.kernels.registry import get_spec, kernel_names
from memprobe.plan.model import PlanTarget


def default_kernels(tp: Iterable[int], hidden: int | None = None) -> list[str]:
    """As the sweep decides: with any tp above 1, the vocabulary-parallel kernels;
    with a hidden size, the hidden family."""
    if hidden is not None:
        return kernel_names(inputs="hidden")
    return kernel_names(distributed=max(tp) > 1)


def plan_targets(
    kernels: Sequence[str] | None,
    *,
    vocab: int,
    batch: int = 1,
    dtype: str = "bf16",
    chunk_sizes: Sequence[int | None] = (1024,),
    tp: Sequence[int] = (1,),
    cp: Sequence[int] = (1,),
    hidden: int | None = None,
) -> tuple[list[PlanTarget], list[str]]:
    """Every kernel × tp × cp × chunk size that can run, and a note for each kernel × tp
    left out (a single-device kernel cannot shard the vocabulary)."""
    names = list(kernels) if kernels else default_kernels(tp, hidden)
    if not names:
        raise UserError("no kernels given", "see `memprobe kernels`")
    if not chunk_sizes:
        raise UserError("no chunk sizes given", "e.g. --chunk-size 1024")
    targets: list[PlanTarget] = []
    skipped: list[str] = []
    for name in names:
        for t in tp:
            try:
                spec = get_spec(name)
            except ValueError as exc:
                raise UserError(str(exc), "see `memprobe kernels`") from None
            if t > 1 and not spec.distributed:
                skipped.append(f"{name} at tp {t}")
                continue
            for c in cp:
                for chunk in chunk_sizes:
                    targets.append(PlanTarget(name, vocab, batch, dtype, chunk, t, c, hidden))
    targets = list(dict.fromkeys(targets))  # kernels that ignore the chunk size: once
    if not targets:
        if hidden is not None:
            # No hidden-family kernel shards the vocabulary: naming the logits family's
            # sharded kernels would contradict --hidden.
            raise UserError(
                f"none of {', '.join(names)} can shard the vocabulary (--tp): the hidden "
                "family runs on one device",
                "drop --tp, or drop --hidden to plan the logits kernels that shard it",
            )
        sharded = ", ".join(kernel_names(distributed=True))
        raise UserError(
            f"none of {', '.join(names)} can shard the vocabulary (--tp)",
            f"use --tp with: {sharded}",
        )
    return targets, skipped
