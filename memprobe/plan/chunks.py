"""Chunk choice from measured rows: per chunked kernel × layout, the chunk size that fits
the most tokens, and the one a cpu/cuda run measured fastest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memprobe.plan.model import TokenPlan


@dataclass(frozen=True)
class ChunkChoice:
    """For one chunked kernel on one layout: the chunk size that fits the most tokens, and
    the one measured fastest (None without times)."""

    kernel: str
    tp: int
    cp: int
    for_memory: int | None
    for_time: int | None
    why: str
    single: bool = False  # only one chunk size was planned: nothing was compared


def chunk_choices(
    plans: Sequence[TokenPlan], rows: Sequence[Mapping[str, Any]] | None
) -> list[ChunkChoice]:
    """Per chunked kernel × layout: the chunk size with the most tokens (the lowest peak at
    any count), and the fastest one from a run's measured forward + backward times."""
    groups: dict[tuple[str, int, int], list[TokenPlan]] = {}
    for p in plans:
        if p.target.chunk_size is not None:
            key = (p.target.kernel, p.target.tp, p.target.cp)
            groups.setdefault(key, []).append(p)
    choices = []
    for (kernel, tp, cp), group in groups.items():
        best = max(group, key=lambda p: (p.max_tokens, -(p.target.chunk_size or 0)))
        timed = _fastest(group, rows)
        if len(group) == 1 and timed is None:
            why = f"chunk {best.target.chunk_size} was the only size planned"
        elif timed is None:
            why = "on memory alone: " + (
                "no run given (--from-run DIR)" if rows is None else "the run has no times for it"
            )
        else:
            why = timed[1]
        choices.append(
            ChunkChoice(
                kernel,
                tp,
                cp,
                best.target.chunk_size,
                timed[0] if timed else None,
                why=why,
                single=len(group) == 1,
            )
        )
    return choices


def _fastest(
    group: Sequence[TokenPlan], rows: Sequence[Mapping[str, Any]] | None
) -> tuple[int, str] | None:
    """The planned chunk size a run measured fastest, at its largest shape with times for
    two or more of them; None when the run cannot say."""
    if not rows:
        return None
    t = group[0].target
    planned = {p.target.chunk_size for p in group}
    by_shape: dict[tuple[int, int, str], dict[int, float]] = {}
    for r in rows:
        seconds = step_seconds(r)
        if (
            seconds is None
            or r.get("kernel") != t.kernel
            or (r.get("tp"), r.get("cp"), r.get("dtype"), r.get("batch"))
            != (t.tp, t.cp, t.dtype, t.batch)
            or r.get("chunk_size") not in planned
        ):
            continue
        shape = (int(r["tokens"]), int(r["vocab"]), str(r.get("device")))
        by_shape.setdefault(shape, {})[int(r["chunk_size"])] = seconds
    usable = [(s, times) for s, times in by_shape.items() if len(times) >= 2]
    if not usable:
        return None
    (tokens, vocab, device), times = max(usable, key=lambda st: (st[0][0] * st[0][1], st[0]))
    chunk = min(times, key=lambda c: times[c])
    fit = next(p.max_tokens for p in group if p.target.chunk_size == chunk)
    return chunk, (
        f"{fit:,} tokens; measured fastest of {len(times)} sizes: {times[chunk]:.3g} s forward "
        f"+ backward at {tokens:,} tokens x {vocab:,} vocab on {device}"
    )


def step_seconds(row: Mapping[str, Any]) -> float | None:
    """A row's measured forward + backward seconds; None unless it finished ok with both."""
    fwd, bwd = row.get("fwd_time_s"), row.get("bwd_time_s")
    if row.get("status") != "ok" or fwd is None or bwd is None:
        return None
    return float(fwd) + float(bwd)
