"""``memprobe diff A.pickle B.pickle``: what grew between two snapshots' peaks, and where."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from memprobe.attribute import attribute_file_devices
from memprobe.attribute.diff import Difference, PeakDiff, diff_findings
from memprobe.attribute.frames import describe_frame
from memprobe.commands.flags import MAX_COUNT, answer, user_errors
from memprobe.errors import UserError
from memprobe.io.codec import to_json
from memprobe.io.sizes import format_bytes
from memprobe.io.text import printable
from memprobe.render.console import Part, show, table

DEFAULT_SHOWN = 10


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_bytes(abs(n))


def _difference(x: Difference) -> str:
    if x.what == "model":
        return (
            f"the models differ: parameters {format_bytes(int(x.a or 0))} -> "
            f"{format_bytes(int(x.b or 0))} ({x.evidence})"
        )
    if x.what == "autocast":
        side = "B" if x.b else "A"
        return (
            f"autocast: only {side} runs under it (weight copies at the peak "
            f"{format_bytes(int(x.a or 0))} -> {format_bytes(int(x.b or 0))})"
        )
    a, b = (f"{v:,}" if isinstance(v, int) else str(v) for v in (x.a, x.b))
    return f"{x.what}: {a} -> {b} ({x.evidence})"


def _lead_text(lead: tuple[int, int] | None) -> str:
    if lead is None:
        return ""
    device, count = lead
    return f" (device {device}, the lead of its {count} devices with a trace; --device N picks one)"


def render_diff(d: PeakDiff, *, top: int = DEFAULT_SHOWN) -> list[Part]:
    """The difference as printable parts: the peaks, what differs between the runs,
    then two tables (by category; by source line and op)."""
    delta = d.peak_b_bytes - d.peak_a_bytes
    out: list[Part] = [
        f"A: {printable(str(d.path_a))}{_lead_text(d.lead_a)}",
        f"B: {printable(str(d.path_b))}{_lead_text(d.lead_b)}",
        f"peak: {format_bytes(d.peak_a_bytes)} -> {format_bytes(d.peak_b_bytes)} "
        f"({_signed(delta)})",
    ]
    for side, index, held, requested in d.ooms:
        out.append(
            f"  {side} ran out of memory at entry #{index:,}: {format_bytes(held)} allocated "
            f"+ {format_bytes(requested)} requested; its peak is what it held before the "
            f"failure, the step needed at least {format_bytes(held + requested)}"
        )
    if d.differences:
        out += ["", "what differs between the runs (from each file's reading):"]
        out += [f"  {_difference(x)}" for x in d.differences]
    out += ["", "by category (bytes live at each peak):"]
    rows = [
        (category, format_bytes(a), format_bytes(b), _signed(b - a))
        for category, a, b in d.categories
    ]
    out.append(table(("category", "A", "B", "change"), rows, left={"category"}))
    # The N largest changes either way (a fix that frees 9.77 GiB must show), listed
    # growth first like the --json list; lines that did not change are left out.
    changed = [c for c in d.contributors if c.delta_bytes]
    shown = sorted(changed, key=lambda c: -abs(c.delta_bytes))[:top]
    shown.sort(key=lambda c: -c.delta_bytes)
    if not shown:
        out += ["", "by source line and op: no line's bytes changed"]
        return out
    out += ["", f"by source line and op (the {len(shown)} largest changes, growth first):"]
    lines = []
    for c in shown:
        where = describe_frame(c.frame) if c.frame else "no user frame"
        if c.caller is not None:
            where += f" <- {describe_frame(c.caller)}"
        lines.append(
            (
                _signed(c.delta_bytes),
                format_bytes(c.bytes_a),
                format_bytes(c.bytes_b),
                c.op or "?",
                c.category,
                where,
            )
        )
    header = ("change", "A", "B", "op", "category", "where")
    out.append(table(header, lines, left={"op", "category", "where"}))
    return out


def diff_files(
    a: str | os.PathLike[str], b: str | os.PathLike[str], *, device: int | None = None
) -> PeakDiff:
    """Each file's lead device (the one that hit an OOM, else the largest peak), compared."""
    (fa, lead_a), (fb, lead_b) = (_lead(path, device) for path in (a, b))
    return dataclasses.replace(diff_findings(fa, fb), lead_a=lead_a, lead_b=lead_b)


def _lead(path: str | os.PathLike[str], device: int | None) -> tuple[Any, tuple[int, int] | None]:
    """The file's lead device's findings, and (that device, how many the file has) where
    it has several."""
    try:
        found = attribute_file_devices(path, device=device)
        # Devices that only hold segments (no trace) are read too, but never lead.
        traced = sum(1 for f in found if f.trace_entries)
        return found[0], (found[0].device, traced) if traced > 1 else None
    except UserError as exc:
        if device is None or "has nothing for device" not in exc.message:
            raise
        # Of two files, say which has no such device: "the snapshot" was either of them.
        raise UserError(f"{path}: {exc.message}", exc.hint) from None


HELP = """Attribute the difference between two snapshots' peaks, by category and source line."""


@user_errors
def command(
    a: Annotated[Path, typer.Argument(help="Snapshot A (before).")],
    b: Annotated[Path, typer.Argument(help="Snapshot B (after).")],
    device: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=0, max=MAX_COUNT, help="Compare this device (default: each file's lead device)."
        ),
    ] = None,
    top: Annotated[
        int, typer.Option(min=1, max=MAX_COUNT, help="Contributors listed.")
    ] = DEFAULT_SHOWN,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    d = diff_files(a, b, device=device)
    if as_json:
        answer(json.dumps(to_json(d), indent=1))
    else:
        show(render_diff(d, top=top))
