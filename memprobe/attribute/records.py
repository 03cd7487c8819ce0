"""The records attribution hands on: one block, a group of identical blocks, an OOM,
bytes per source line, and a sampled timeline. Each has a plain JSON form
(:mod:`memprobe.io.codec`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from memprobe.attribute.allocator_view import OomVerdict
from memprobe.attribute.explain import Explanation
from memprobe.records import Frame


@dataclass(frozen=True)
class BlockFinding:
    """One block: what it is, who made it, when, and whether it mattered."""

    address: int
    size: int  # requested bytes, as the trace records them
    block_size: int | None  # the allocator's block (rounded) when the segments show it
    dtype: str | None  # recorded by memprobe's label, else the inferred logits dtype
    shape: tuple[int, ...] | None
    dtype_source: str | None  # "label" | "inferred" | None
    op: str | None
    op_source: str | None  # "label" | "frames" | None
    node: str | None  # autograd node that made it (``LogSoftmaxBackward0``)
    frame: Frame | None  # the user's line
    chain: tuple[Frame, ...]  # the user's line and up to two callers
    via: tuple[str, ...]  # libraries the call went through
    phase: str | None  # "setup" | "forward" | "backward" | "optimizer" | None
    phase_reason: str
    category: str
    category_reason: str
    logits: bool  # a [B,S,V]-family block (size fits AND made on the logits path)
    logits_reason: str
    alloc_index: int | None  # trace position; None: allocated before the trace began
    alloc_time_us: int | None
    free_index: int | None  # None: still live at the end of the trace
    free_time_us: int | None
    lifetime_us: int | None
    lifetime_entries: int | None
    live_at_peak: bool
    live_at_oom: bool
    oom_numbers: tuple[int, ...]
    explanations: tuple[Explanation, ...]
    more_explanations: int
    label: str
    stream: int
    kernel: Frame | None = None  # the line in memprobe's kernel the user's ``frame`` called


@dataclass(frozen=True)
class BlockGroup:
    """Identical blocks live at one moment: same size, category, op, line and phase."""

    count: int
    size: int
    total_bytes: int
    category: str
    op: str | None
    frame: Frame | None
    phase: str | None
    before_trace: bool
    logits: bool
    reason: str = ""  # why the category: the evidence most of the group's blocks rest on
    kernel: Frame | None = None  # the line in memprobe's kernel the user's ``frame`` called


@dataclass(frozen=True)
class SiteBytes:
    """Bytes live at the peak made by one (line, its caller, op, category): what ``diff``
    compares. The caller tells two call sites of one helper apart."""

    frame: Frame | None
    op: str | None
    category: str
    bytes: int
    count: int
    caller: Frame | None = None  # the user frame that called ``frame``'s function

    # The JSON form (memprobe.io.codec) writes the caller beside the frame.
    JSON_KEYS: ClassVar[tuple[str, ...]] = ("frame", "caller", "op", "category", "bytes", "count")


@dataclass(frozen=True)
class OomFinding:
    """One failed request, what held the memory then, and fragmentation or exhaustion."""

    number: int
    index: int
    time_us: int | None
    requested_bytes: int
    device_free_bytes: int | None
    allocated_bytes: int  # allocated (by the trace's count) when the request failed
    live_count: int
    live_addresses: tuple[int, ...]  # listed findings live then, largest first
    op: str | None
    frame: Frame | None
    phase: str | None
    breakdown: tuple[tuple[str, int], ...]  # category -> bytes live then
    verdict: OomVerdict


@dataclass(frozen=True)
class Timeline:
    """Allocated bytes per category at sampled trace positions (for the HTML page)."""

    positions: tuple[int, ...]
    series: tuple[tuple[str, tuple[int, ...]], ...]  # category -> bytes at each position
