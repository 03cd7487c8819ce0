"""``memprobe attribute``: read a snapshot, attribute every device's peak and OOMs, print
(and page) it. Imports no torch: reading a snapshot costs no torch start-up."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.attribute import DEFAULT_TOP, attribute_file_devices
from memprobe.commands.flags import user_errors
from memprobe.io.files import check_output
from memprobe.render.findings_text import render_devices


def attribute_command(
    snapshot: str | os.PathLike[str],
    *,
    vocab: int | None = None,
    tokens: int | None = None,
    batch: int | None = None,
    top: int = DEFAULT_TOP,
    device: int | None = None,
    as_json: bool = False,
    html_path: str | os.PathLike[str] | None = None,
) -> str:
    """What ``memprobe attribute`` prints: the text report, or one JSON object (the lead
    device's findings, the other devices under ``other_devices``).

    Writes the HTML page first when ``html_path`` is given.
    """
    if html_path is not None:
        # Before anything is read or written: the page must not replace the snapshot.
        check_output(html_path, [Path(snapshot)], flag="--html")
    found = attribute_file_devices(
        snapshot,
        vocab=vocab,
        tokens=tokens,
        batch=batch,
        top=top,
        device=device,
        timeline=html_path is not None,
    )
    if html_path is not None:
        # Imported here: matplotlib is only needed for the page.
        from memprobe.render.attribute_page import write_attribute_page

        write_attribute_page(found, html_path, title=f"memprobe attribute: {snapshot}")
    if as_json:
        lead = found[0].to_json()
        lead["other_devices"] = [f.to_json() for f in found[1:]]
        return json.dumps(lead, indent=1)
    return "\n".join(render_devices(found, top=top))


@user_errors
def command(
    snapshot: Annotated[
        Path, typer.Argument(help="CUDA allocator snapshot (.pickle from torch or memprobe).")
    ],
    vocab: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="Vocabulary size V (overrides what is inferred)."),
    ] = None,
    tokens: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="Sequence length S (tokens per sequence)."),
    ] = None,
    batch: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="Batch size B."),
    ] = None,
    top: Annotated[
        int, typer.Option(min=1, help="Groups / blocks listed at the peak and each OOM.")
    ] = 10,
    device: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=0, help="Attribute only this device (default: every device)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    html: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Also write a self-contained HTML page of the findings."),
    ] = None,
    # A --replay flag (the allocator model re-running the trace) belongs here once
    # memprobe.allocator lands; attribution itself does not depend on it.
) -> None:
    """What the peak is made of: inferred shapes, categories, logits-family blocks, OOMs."""

    text = attribute_command(
        snapshot,
        vocab=vocab,
        tokens=tokens,
        batch=batch,
        top=top,
        device=device,
        as_json=as_json,
        html_path=html,
    )
    typer.echo(text)
