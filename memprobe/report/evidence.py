"""Per-kernel evidence at the largest case, read from the snapshot the sweep wrote.

Each finished case of a sweep has ``snapshots/<case_id>.pickle`` (on cuda the
allocator's own record, elsewhere one synthesized from the tracker's events). It
is read once, safely, and everything the page shows about the case comes from
it: the trace, what made the peak, attribution. The report never measures or
simulates: a case without a snapshot (a results file from elsewhere, a case that
failed before it allocated) has no trace, and the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprobe.errors import UserError
from memprobe.io.sizes import MAX_SIZE
from memprobe.records import Case
from memprobe.report.breakdown import Breakdown, breakdown
from memprobe.report.trace import Trace, from_snapshot
from memprobe.results import case_of
from memprobe.snapshot.synthesize import another_case, contradicted_peak

FINDINGS_TOP = 6
NO_SNAPSHOT = "no snapshot in the run for this case: no trace, breakdown or attribution"


@dataclass(frozen=True)
class Evidence:
    kernel: str
    case: Case
    snapshot: str | None  # the snapshot's path as the page names it; None when none was read
    trace: Trace | None = None
    breakdown: Breakdown | None = None
    findings: Any = None  # memprobe.attribute.Findings
    problems: tuple[str, ...] = ()


def _snapshot_path(row: dict[str, Any], run_dir: Path) -> Path | None:
    value = row.get("snapshot")
    if not isinstance(value, str) or not value:
        return None
    return run_dir / value


def gather(row: dict[str, Any], run_dir: Path) -> Evidence:
    """Evidence for one finished (validated) row. Never raises for a bad case: problems
    are listed instead."""
    case = case_of(row)
    path = _snapshot_path(row, run_dir)
    if path is None:
        return Evidence(case.kernel, case, None, problems=(NO_SNAPSHOT,))
    from memprobe.snapshot.load import load_snapshot

    try:
        snapshot = load_snapshot(path)
    except UserError as exc:
        return Evidence(case.kernel, case, None, problems=(f"snapshot not used: {exc.one_line()}",))
    recorded = another_case(snapshot, case.case_id)
    if recorded is not None:
        problem = f"snapshot not used: {row['snapshot']} was recorded for case {recorded}"
        return Evidence(case.kernel, case, None, problems=(problem,))
    trace = from_snapshot(snapshot)
    if trace.length == 0:
        # A snapshot of segments only (torch's, recorded without history, or the trace
        # emptied): no allocation to place, so its "peak" was 0 B of nothing, and the
        # breakdown figure of such peaks ended `report` in a traceback from matplotlib.
        problem = (
            f"snapshot not used: {row['snapshot']} records no allocation or free "
            "(no trace: record it with torch.cuda.memory._record_memory_history())"
        )
        return Evidence(case.kernel, case, None, problems=(problem,))
    if sum(b.nbytes for b in trace.blocks) > MAX_SIZE:
        # Live bytes are summed in int64 to draw the step: blocks past 8 EiB together
        # (a trace's sizes may be up to 2^64) ended `report` in an OverflowError, or
        # wrapped below zero unseen. No device holds that much.
        problem = (
            f"snapshot not used: {row['snapshot']} holds blocks of more than 8 EiB "
            "together, more than any device (the file was edited or is not torch's)"
        )
        return Evidence(case.kernel, case, None, problems=(problem,))
    if (contradiction := contradicted_peak(snapshot, row)) is not None:
        problem = f"snapshot not used: {row['snapshot']} {contradiction}"
        return Evidence(case.kernel, case, None, problems=(problem,))
    findings, problems = _attribute(case, snapshot)
    return Evidence(
        kernel=case.kernel,
        case=case,
        snapshot=str(path.relative_to(run_dir) if path.is_relative_to(run_dir) else path),
        trace=trace,
        breakdown=breakdown(case.kernel, trace, case),
        findings=findings,
        problems=problems,
    )


def _attribute(case: Case, snapshot: dict[str, Any]) -> tuple[Any, tuple[str, ...]]:
    from memprobe.attribute import attribute

    try:
        findings = attribute(
            snapshot,
            vocab=case.local_vocab,
            tokens=case.local_tokens,
            batch=case.batch,
            top=FINDINGS_TOP,
        )
    except Exception as exc:  # attribution failing on one kernel must not end the report
        return None, (f"attribution failed: {type(exc).__name__}: {exc}".splitlines()[0],)
    return findings, ()
