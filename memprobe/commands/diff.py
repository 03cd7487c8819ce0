"""``memprobe diff A.pickle B.pickle``: what grew between two snapshots' peaks, and where."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.attribute import attribute_file_devices
from memprobe.attribute.diff import Difference, PeakDiff, diff_findings
from memprobe.attribute.frames import describe_frame
from memprobe.commands.flags import MAX_COUNT, user_errors
from memprobe.io.codec import to_json
from memprobe.io.sizes import format_bytes

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


def render_diff(d: PeakDiff, *, top: int = DEFAULT_SHOWN) -> list[str]:
    delta = d.peak_b_bytes - d.peak_a_bytes
    out = [
        f"A: {d.path_a}",
        f"B: {d.path_b}",
        f"peak: {format_bytes(d.peak_a_bytes)} -> {format_bytes(d.peak_b_bytes)} "
        f"({_signed(delta)})",
    ]
    if d.differences:
        out += ["", "what differs between the runs (from each file's reading):"]
        out += [f"  {_difference(x)}" for x in d.differences]
    out += ["", "by category (bytes live at each peak):"]
    for category, a, b in d.categories:
        out.append(
            f"  {category:<22} {format_bytes(a):>12} -> {format_bytes(b):>12}  {_signed(b - a)}"
        )
    # The N largest changes either way (a fix that frees 9.77 GiB must show), listed
    # growth first like the --json list; lines that did not change are left out.
    changed = [c for c in d.contributors if c.delta_bytes]
    shown = sorted(changed, key=lambda c: -abs(c.delta_bytes))[:top]
    shown.sort(key=lambda c: -c.delta_bytes)
    if not shown:
        out += ["", "by source line and op: no line's bytes changed"]
    else:
        out += ["", f"by source line and op (the {len(shown)} largest changes, growth first):"]
    for c in shown:
        where = describe_frame(c.frame) if c.frame else "no user frame"
        if c.caller is not None:
            where += f" <- {describe_frame(c.caller)}"
        out.append(
            f"  {_signed(c.delta_bytes):>13}  {where}  op {c.op or '?'}  {c.category}  "
            f"({format_bytes(c.bytes_a)} -> {format_bytes(c.bytes_b)})"
        )
    return out


def diff_command(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    device: int | None = None,
    top: int = DEFAULT_SHOWN,
    as_json: bool = False,
) -> str:
    # Each file's lead device (the one that hit an OOM, else the largest peak).
    fa = attribute_file_devices(a, device=device)[0]
    fb = attribute_file_devices(b, device=device)[0]
    d = diff_findings(fa, fb)
    if as_json:
        return json.dumps(to_json(d), indent=1)
    return "\n".join(render_diff(d, top=top))


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
    """Attribute the difference between two snapshots' peaks, by category and source line."""
    typer.echo(diff_command(a, b, device=device, top=top, as_json=as_json))
