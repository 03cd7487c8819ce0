"""The records attribution hands on: one block, a group of identical blocks, an OOM,
bytes per source line, and a sampled timeline. Each has a plain JSON form."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from memprobe.attribute.allocator_view import OomVerdict
from memprobe.attribute.explain import Explanation
from memprobe.records import Frame


def frame_json(frame: Frame | None) -> dict[str, Any] | None:
    if frame is None:
        return None
    return {"name": frame.name, "filename": frame.filename, "line": frame.line}


def frame_from_json(d: dict[str, Any] | None) -> Frame | None:
    return None if d is None else Frame(d["name"], d["filename"], d["line"])


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

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(
            shape=None if self.shape is None else list(self.shape),
            frame=frame_json(self.frame),
            chain=[frame_json(f) for f in self.chain],
            via=list(self.via),
            oom_numbers=list(self.oom_numbers),
            explanations=[e.to_json() for e in self.explanations],
        )
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BlockFinding:
        return cls(
            **{
                **d,
                "shape": None if d["shape"] is None else tuple(d["shape"]),
                "frame": frame_from_json(d["frame"]),
                "chain": tuple(frame_from_json(f) for f in d["chain"]),
                "via": tuple(d["via"]),
                "oom_numbers": tuple(d["oom_numbers"]),
                "explanations": tuple(Explanation.from_json(e) for e in d["explanations"]),
            }
        )


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

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["frame"] = frame_json(self.frame)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BlockGroup:
        return cls(**{**d, "frame": frame_from_json(d["frame"])})


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

    def to_json(self) -> dict[str, Any]:
        return {
            "frame": frame_json(self.frame),
            "caller": frame_json(self.caller),
            "op": self.op,
            "category": self.category,
            "bytes": self.bytes,
            "count": self.count,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SiteBytes:
        return cls(
            **{
                **d,
                "frame": frame_from_json(d["frame"]),
                "caller": frame_from_json(d.get("caller")),
            }
        )


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

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(
            live_addresses=list(self.live_addresses),
            frame=frame_json(self.frame),
            breakdown=[list(b) for b in self.breakdown],
            verdict=self.verdict.to_json(),
        )
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OomFinding:
        return cls(
            **{
                **d,
                "live_addresses": tuple(d["live_addresses"]),
                "frame": frame_from_json(d["frame"]),
                "breakdown": tuple((str(c), int(b)) for c, b in d["breakdown"]),
                "verdict": OomVerdict(**d["verdict"]),
            }
        )


@dataclass(frozen=True)
class Timeline:
    """Allocated bytes per category at sampled trace positions (for the HTML page)."""

    positions: tuple[int, ...]
    series: tuple[tuple[str, tuple[int, ...]], ...]  # category -> bytes at each position

    def to_json(self) -> dict[str, Any]:
        return {
            "positions": list(self.positions),
            "series": [[c, list(v)] for c, v in self.series],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Timeline:
        return cls(tuple(d["positions"]), tuple((str(c), tuple(v)) for c, v in d["series"]))
