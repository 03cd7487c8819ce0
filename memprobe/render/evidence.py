"""Per-kernel evidence at the largest case: the trace, what made the peak, attribution.

Where the sweep wrote a snapshot for the case (``snapshots/<case_id>.pickle``; on
cuda it is the allocator's own record) the report reads it, safely. Otherwise it
re-simulates the case on meta tensors — exact for any case, milliseconds — and
synthesizes the snapshot that attribution reads from the tracker's events. The page
says which source each kernel's evidence came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from memprobe.errors import UserError
from memprobe.records import Case
from memprobe.render.breakdown import Breakdown, CaseShape, breakdown
from memprobe.render.trace import Trace, from_events, from_snapshot

FINDINGS_TOP = 6


@dataclass
class Evidence:
    kernel: str
    case: Case
    source: str  # "snapshot <path>" | "meta re-simulation" | "" when none
    trace: Trace | None = None
    breakdown: Breakdown | None = None
    findings: dict[str, Any] | None = None  # Findings.to_json()
    problems: list[str] = field(default_factory=list)


def case_of(row: pd.Series) -> Case:
    chunk = row["chunk_size"]
    chunk_size = (
        None if chunk is None or (isinstance(chunk, float) and math.isnan(chunk)) else int(chunk)
    )
    return Case(
        kernel=str(row["kernel"]),
        batch=int(row["batch"]),
        tokens=int(row["tokens"]),
        vocab=int(row["vocab"]),
        dtype=str(row["dtype"]),
        chunk_size=chunk_size,
        tp=int(row["tp"]),
        cp=int(row["cp"]),
        device=str(row["device"]),
    )


def _snapshot_path(row: pd.Series, run_dir: Path) -> Path | None:
    value = row.get("snapshot")
    if not isinstance(value, str) or not value:
        return None
    return run_dir / value


def gather(row: pd.Series, run_dir: Path, *, attribution: bool = True) -> Evidence:
    """Evidence for one finished row. Never raises for a bad case: problems are listed."""
    case = case_of(row)
    ev = Evidence(kernel=case.kernel, case=case, source="")
    snapshot: dict[str, Any] | None = None
    path = _snapshot_path(row, run_dir)
    if path is not None:
        from memprobe.snapshot.load import load_snapshot

        try:
            snapshot = load_snapshot(path)
            ev.trace = from_snapshot(snapshot)
            ev.source = (
                f"snapshot {path.relative_to(run_dir) if path.is_relative_to(run_dir) else path}"
            )
        except UserError as exc:
            ev.problems.append(f"snapshot not used: {exc.one_line()}")
            snapshot = None
    if ev.trace is None:
        snapshot = _simulate(ev, attribution=attribution)
    if ev.trace is not None:
        ev.breakdown = breakdown(case.kernel, ev.trace, CaseShape.of(case))
    if attribution and snapshot is not None:
        ev.findings = _attribute(ev, snapshot)
    return ev


def _simulate(ev: Evidence, *, attribution: bool) -> dict[str, Any] | None:
    try:
        from memprobe.measure.meta_backend import simulate

        # Frames only matter to attribution (the first user frame of each block).
        tracker = simulate(ev.case, capture_frames=attribution)
    except Exception as exc:  # an unknown or broken kernel must not end the report
        ev.problems.append(
            f"could not re-simulate on meta: {type(exc).__name__}: {exc}".splitlines()[0]
        )
        return None
    ev.trace = from_events(tracker.events)
    ev.source = "meta re-simulation"
    if not attribution:
        return None
    try:
        from memprobe.snapshot.synthesize import synthesize_snapshot
    except ImportError:
        ev.problems.append("attribution unavailable: memprobe.snapshot.synthesize is missing")
        return None
    return synthesize_snapshot(tracker.events, case=ev.case)


def _attribute(ev: Evidence, snapshot: dict[str, Any]) -> dict[str, Any] | None:
    try:
        from memprobe.attribute import attribute
    except ImportError:
        ev.problems.append("attribution unavailable: memprobe.attribute is missing")
        return None
    c = ev.case
    try:
        findings = attribute(
            snapshot, vocab=c.local_vocab, tokens=c.local_tokens, batch=c.batch, top=FINDINGS_TOP
        )
    except Exception as exc:  # attribution failing on one kernel must not end the report
        ev.problems.append(f"attribution failed: {type(exc).__name__}: {exc}".splitlines()[0])
        return None
    return findings.to_json()
