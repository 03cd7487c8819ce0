"""A Verdict as terminal text, and the wording of one check that JUnit and Markdown share.

Every number printed here is computed from the Check it describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from memprobe.gate import Check, Verdict
from memprobe.io.sizes import format_bytes
from memprobe.io.text import printable
from memprobe.render.console import indented, table

_LIMIT_NAMES = {
    "max_peak": "peak",
    "max_peak_over_floor": "peak/floor",
    "max_big_fp32_blocks": "float32 [B,S,V] blocks",
    "regression": "peak vs baseline",
    "status": "status",
}


def format_value(value: float | None, unit: str, *, ratio_suffix: str = "x") -> str:
    """A measured value or limit in its unit: bytes, a ratio (``1.050x``) or a count."""
    if value is None:
        return "-"
    if unit == "bytes":
        return format_bytes(value)
    if unit == "ratio":
        return f"{value:.3f}{ratio_suffix}"
    return f"{value:g}"


def format_excess(check: Check) -> str:
    """``1.97 GiB (+19.1%)``: how far measured is from the limit (over, or to spare)."""
    excess, pct = check.excess, check.excess_pct
    if excess is None:
        return "-"
    # A difference of two ratios is a plain number, not a ratio: no "x".
    text = format_value(abs(excess), check.unit, ratio_suffix="")
    return f"{text} ({pct:+.1f}%)" if pct is not None else text


def describe(check: Check) -> str:
    """What was measured against what, in words: the detail of one check."""
    if check.measured is None:
        if check.limit is not None:
            return f"{check.reason}; limit {format_value(check.limit, check.unit)}"
        return check.reason
    measured = format_value(check.measured, check.unit)
    limit = format_value(check.limit, check.unit)
    what = _LIMIT_NAMES.get(check.kind, check.kind)
    if check.kind == "regression" and check.reference is not None and check.limit is not None:
        growth = (
            100.0 * (check.measured - check.reference) / check.reference if check.reference else 0.0
        )
        allowed = (
            100.0 * (check.limit - check.reference) / check.reference if check.reference else 0.0
        )
        head = (
            f"peak {measured} vs baseline {format_bytes(check.reference)} ({growth:+.2f}%, "
            f"allowed +{allowed:.2f}% = {limit})"
        )
    else:
        op = "<=" if check.passed else ">"
        head = f"{what} {measured} {op} limit {limit}"
    if not check.passed:
        return f"{head}: over by {format_excess(check)}"
    if check.kind != "regression" and check.unit != "count" and check.excess:
        return f"{head} ({format_excess(check).split(' (')[0]} to spare)"
    return head


def format_verdict(verdict: Verdict, *, written: Sequence[Path] = ()) -> str:
    """The terminal report: one row per check (failures last), notes, then the summary.

    Plain text wherever it goes (a terminal, a CI log): the checks' table comes
    through :mod:`~memprobe.render.console` without its box."""
    lines = [f"memprobe gate: {verdict.cases} case(s) from {printable(str(verdict.results))}"]
    if verdict.config:
        lines.append(f"  rules from {printable(str(verdict.config))}")
    if verdict.baseline:
        shown = printable(str(verdict.baseline))
        lines.append(f"  baseline {shown} (max regression {verdict.max_regression:g}%)")
    ordered = [c for c in verdict.checks if c.passed] + list(verdict.failures)
    checks = table(
        ["", "source", "kind", "case", "detail"],
        [["ok" if c.passed else "FAIL", c.source, c.kind, c.case, describe(c)] for c in ordered],
        left=("", "source", "kind", "case", "detail"),
        show_header=False,
    )
    tail = [f"  note: {printable(n)}" for n in verdict.notes]
    tail += [f"  wrote {printable(str(p))}" for p in written]
    total, failed = len(verdict.checks), len(verdict.failures)
    if failed:
        tail.append(f"FAILED: {failed} of {total} check(s) failed")
    else:
        tail.append(f"passed: all {total} check(s)")
    return "\n".join([*lines, *(indented(checks) if ordered else []), *tail])
