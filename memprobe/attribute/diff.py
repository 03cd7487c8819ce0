"""Attribute the difference between two snapshots' peaks: by category and by source line.

Each peak's live bytes are grouped by (the user's line, its caller, op, category), so
two call sites of one helper stay apart; a contributor's delta is its bytes at B's
peak minus at A's. Sorted by delta, largest growth first, so "context 512 → 1024"
names the line whose tensors grew.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from memprobe.attribute.findings import Findings
from memprobe.attribute.records import frame_json
from memprobe.records import Frame


@dataclass(frozen=True)
class Contributor:
    frame: Frame | None
    op: str | None
    category: str
    bytes_a: int
    bytes_b: int
    caller: Frame | None = None  # told in the text; the --json schema has no place for it

    @property
    def delta_bytes(self) -> int:
        return self.bytes_b - self.bytes_a

    def to_json(self) -> dict[str, Any]:
        return {
            "frame": frame_json(self.frame),
            "op": self.op,
            "category": self.category,
            "bytes_a": self.bytes_a,
            "bytes_b": self.bytes_b,
            "delta_bytes": self.delta_bytes,
        }


@dataclass(frozen=True)
class PeakDiff:
    path_a: str | None
    path_b: str | None
    peak_a_bytes: int
    peak_b_bytes: int
    categories: tuple[tuple[str, int, int], ...]  # (category, bytes at A, bytes at B)
    contributors: tuple[Contributor, ...]  # by delta, largest growth first

    def to_json(self) -> dict[str, Any]:
        return {
            "peak_a_bytes": self.peak_a_bytes,
            "peak_b_bytes": self.peak_b_bytes,
            "contributors": [c.to_json() for c in self.contributors],
        }


def diff_findings(a: Findings, b: Findings) -> PeakDiff:
    by_site: dict[tuple[Any, ...], list[int]] = {}
    for which, findings in ((0, a), (1, b)):
        for s in findings.peak_sites:
            by_site.setdefault((s.frame, s.caller, s.op, s.category), [0, 0])[which] += s.bytes
    contributors = [
        Contributor(f, op, c, x, y, caller) for (f, caller, op, c), (x, y) in by_site.items()
    ]
    contributors.sort(key=lambda c: (-c.delta_bytes, -c.bytes_b))
    cat_a: Counter[str] = Counter(dict(a.breakdown))
    cat_b: Counter[str] = Counter(dict(b.breakdown))
    categories = sorted(
        ((c, cat_a[c], cat_b[c]) for c in set(cat_a) | set(cat_b)),
        key=lambda t: -(t[2] - t[1]),
    )
    return PeakDiff(
        a.path,
        b.path,
        a.peak_allocated_bytes,
        b.peak_allocated_bytes,
        tuple(categories),
        tuple(contributors),
    )
