"""A gate Verdict as Markdown, for a GitHub step summary."""

from __future__ import annotations

import os

from memprobe.gate import Verdict
from memprobe.render.gate_text import format_excess, format_value


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
