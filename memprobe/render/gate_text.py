"""A Verdict as text for the terminal, JUnit XML for CI, and Markdown for a GitHub step summary.

Every number printed here is computed from the Check it describes.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from memprobe.gate import Check, Verdict
from memprobe.units import format_bytes

_LIMIT_NAMES = {
    "max_peak": "peak",
    "max_peak_over_floor": "peak/floor",
    "max_big_fp32_blocks": "float32 [B,S,V] blocks",
    "regression": "peak vs baseline",
    "status": "status",
}


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return format_bytes(value)
    if unit == "ratio":
        return f"{value:.3f}x"
    return f"{value:g}"


def format_excess(check: Check) -> str:
    """``1.97 GiB (+19.1%)``: how far measured is from the limit (over, or to spare)."""
    excess, pct = check.excess, check.excess_pct
    if excess is None:
        return "-"
    if check.unit == "bytes":
        text = format_bytes(abs(excess))
    elif check.unit == "ratio":
        text = f"{abs(excess):.3f}"
    else:
        text = f"{abs(excess):g}"
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


def format_check(check: Check, *, case_width: int = 0) -> str:
    mark = "ok  " if check.passed else "FAIL"
    return (
        f"{mark}  {check.source:<9} {check.kind:<20} {check.case:<{case_width}}  {describe(check)}"
    )


def format_verdict(verdict: Verdict, *, written: Sequence[Path] = ()) -> str:
    """The terminal report: one line per check (failures last), notes, then the summary."""
    lines = [f"memprobe gate: {verdict.cases} case(s) from {verdict.results}"]
    if verdict.config:
        lines.append(f"  rules from {verdict.config}")
    if verdict.baseline:
        lines.append(f"  baseline {verdict.baseline} (max regression {verdict.max_regression:g}%)")
    width = max((len(c.case) for c in verdict.checks), default=0)
    ordered = [c for c in verdict.checks if c.passed] + list(verdict.failures)
    lines.extend("  " + format_check(c, case_width=width) for c in ordered)
    lines.extend(f"  note: {n}" for n in verdict.notes)
    lines.extend(f"  wrote {p}" for p in written)
    total, failed = len(verdict.checks), len(verdict.failures)
    if failed:
        lines.append(f"FAILED: {failed} of {total} check(s) failed")
    else:
        lines.append(f"passed: all {total} check(s)")
    return "\n".join(lines)


# -- JUnit ---------------------------------------------------------------------


def junit_tree(verdict: Verdict) -> ET.ElementTree:
    """One testcase per check (rule limit × case, baseline × case); a <failure> per violation."""
    total, failed = str(len(verdict.checks)), str(len(verdict.failures))
    counts = {"tests": total, "failures": failed, "errors": "0", "skipped": "0", "time": "0"}
    root = ET.Element("testsuites", {"name": "memprobe gate", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": "memprobe gate", **counts})
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("results", verdict.results),
        ("config", verdict.config),
        ("baseline", verdict.baseline),
        ("max_regression_pct", f"{verdict.max_regression:g}" if verdict.baseline else None),
    ):
        if value is not None:
            ET.SubElement(props, "property", {"name": name, "value": value})
    for check in verdict.checks:
        case = ET.SubElement(
            suite,
            "testcase",
            {
                "classname": f"memprobe.gate.{check.source}",
                "name": f"{check.kind}: {check.case}",
                "time": "0",
            },
        )
        detail = describe(check)
        if check.rule:
            detail = f"rule {check.source}: {check.rule}\ncase {check.case_id}\n{detail}"
        if check.passed:
            ET.SubElement(case, "system-out").text = detail
        else:
            failure = ET.SubElement(
                case, "failure", {"message": describe(check), "type": check.kind}
            )
            failure.text = detail
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(path: Path, verdict: Verdict) -> None:
    from memprobe.atomic_files import write_atomic

    text = ET.tostring(junit_tree(verdict).getroot(), encoding="unicode")
    write_atomic(path, '<?xml version="1.0" encoding="utf-8"?>\n' + text + "\n", what="JUnit file")


# -- Markdown ------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_summary(verdict: Verdict) -> str:
    failed, total = len(verdict.failures), len(verdict.checks)
    title = f"{failed} of {total} checks failed" if failed else f"all {total} checks passed"
    lines = [
        f"### memprobe gate: {title}",
        "",
        f"{verdict.cases} case(s) from `{verdict.results}`"
        + (
            f"; baseline `{verdict.baseline}` (max regression {verdict.max_regression:g}%)"
            if verdict.baseline
            else ""
        ),
        "",
        "| | check | case | measured | limit | over by |",
        "|---|---|---|---|---|---|",
    ]
    ordered = list(verdict.failures) + [c for c in verdict.checks if c.passed]
    for c in ordered:
        measured = format_value(c.measured, c.unit) if c.measured is not None else c.reason
        cells = [
            "✅" if c.passed else "❌",
            f"{c.source} {c.kind}",
            f"`{c.case}`",
            measured,
            format_value(c.limit, c.unit),
            "" if c.passed else format_excess(c),
        ]
        lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return "\n".join(lines) + "\n\n"


def append_step_summary(verdict: Verdict) -> str | None:
    """Append the Markdown table to $GITHUB_STEP_SUMMARY when set. Returns a warning on failure.

    A summary that cannot be written must not hide the verdict, so this warns
    instead of raising.
    """
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(markdown_summary(verdict))
    except OSError as exc:
        return f"could not append to GITHUB_STEP_SUMMARY ({target}): {exc.strerror or exc}"
    return None
