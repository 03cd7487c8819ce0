"""``memprobe attribute``: read a snapshot, attribute its peak and OOMs, print (and page) it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.attribute import DEFAULT_TOP, attribute_file
from memprobe.commands.flags import user_errors
from memprobe.render.findings_text import render_findings


def attribute_command(
    snapshot: str | os.PathLike[str],
    *,
    vocab: int | None = None,
    tokens: int | None = None,
    batch: int | None = None,
    top: int = DEFAULT_TOP,
    as_json: bool = False,
    html_path: str | os.PathLike[str] | None = None,
) -> str:
    """What ``memprobe attribute`` prints: the text report, or one JSON object.

    Writes the HTML page first when ``html_path`` is given.
    """
    findings = attribute_file(snapshot, vocab=vocab, tokens=tokens, batch=batch, top=top)
    if html_path is not None:
        from memprobe.render import write_findings_page

        write_findings_page(
            findings, html_path, title=f"memprobe attribute: {findings.path or snapshot}"
        )
    if as_json:
        return json.dumps(findings.to_json(), indent=1)
    return "\n".join(render_findings(findings, top=top))


@user_errors
def command(
    snapshot: Annotated[
        Path, typer.Argument(help="CUDA allocator snapshot (.pickle from torch or memprobe).")
    ],
    vocab: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="Vocabulary size V: narrows the [B,S,V] explanations."),
    ] = None,
    tokens: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="Sequence length S (tokens per sequence)."),
    ] = None,
    batch: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="Batch size B."),
    ] = None,
    top: Annotated[int, typer.Option(min=1, help="Blocks listed at the peak and each OOM.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    html: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Also write a self-contained HTML page of the findings."),
    ] = None,
) -> None:
    """Name the big blocks of a snapshot: peak, [B,S,V] fits, op, frame, phase, OOMs."""

    text = attribute_command(
        snapshot, vocab=vocab, tokens=tokens, batch=batch, top=top, as_json=as_json, html_path=html
    )
    typer.echo(text)
