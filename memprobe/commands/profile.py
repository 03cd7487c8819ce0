"""``memprobe profile MODULE:FUNCTION``: run a user's training step under memprobe's tracker
(meta or cpu) or torch's allocator history (cuda), write the CUDA-format snapshot and print
its attribution, as ``memprobe attribute`` would. torch is imported only when it runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.allocator import alloc_conf_to_model
from memprobe.commands.attribute import attribution_output
from memprobe.commands.flags import MAX_COUNT, answer, runs_torch, user_errors
from memprobe.errors import UserError
from memprobe.io.files import check_output_file, guard_outputs
from memprobe.io.text import printable
from memprobe.records import DEVICES


def profile_command(
    step: str,
    *,
    device: str = "meta",
    out: str | os.PathLike[str] | None = None,
    html_path: str | os.PathLike[str] | None = None,
    as_json: bool = False,
    top: int = 10,
    alloc_conf: str | None = None,
) -> str:
    """Profile ``step`` (``pkg.mod:fn``) on ``device``; write the snapshot to ``out`` (pickle
    protocol 4, atomically) and the page to ``html_path`` when given; return what
    ``memprobe attribute`` prints for it. Nothing is written when the step fails."""
    if device not in DEVICES:
        raise UserError(
            f"--device {device!r} is not one of {', '.join(DEVICES)}", "e.g. --device meta"
        )
    if alloc_conf is not None and device == "cuda":
        raise UserError(
            "--alloc-conf applies to the allocator model (meta, cpu)",
            "on cuda set PYTORCH_ALLOC_CONF in the environment instead",
        )
    # On meta and cpu --alloc-conf, else the environment's (as sweep); on cuda the real
    # allocator reads the environment itself.
    conf = alloc_conf_to_model(alloc_conf) if device != "cuda" else None
    outputs = {"--out": out, "--html": html_path}
    guard_outputs(outputs, [])
    for path, what in ((out, "snapshot"), (html_path, "HTML page")):
        if path is not None:
            check_output_file(path, what=what)
    # torch only now: the CLI starts without it.
    from memprobe.kernels.user_sources import loaded_code_files, source_files
    from memprobe.profile import load_step, profile_step
    from memprobe.snapshot.write import write_snapshot

    fn = load_step(step)
    # The step's own source file is an input: an output must never replace it; nor may it
    # replace a module the step imported, as it was imported or (checked again) as it ran.
    guard_outputs(outputs, [*source_files(fn), *loaded_code_files(outputs.values())])
    snapshot = profile_step(fn, device, alloc_conf=conf, name=step)
    guard_outputs(outputs, loaded_code_files(outputs.values()))
    if html_path is not None:
        # After the code guards: a module of the step's is refused as code, by name.
        from memprobe.render.html import refuse_foreign_html

        refuse_foreign_html(html_path)
    if out is not None:
        write_snapshot(snapshot, out)
    text = attribution_output(
        snapshot,
        path=str(out) if out is not None else step,
        top=top,
        as_json=as_json,
        html_path=html_path,
    )
    if out is None and not as_json:
        # Without --out nothing is written, yet the reading began "snapshot: my_step:train_step",
        # the step's name where `attribute` names a file: a newcomer looked for that file.
        named = f"snapshot: {printable(step)}\n"
        if text.startswith(named):
            text = (
                f"step: {printable(step)} (no snapshot written: --out FILE keeps one)\n"
                + (text[len(named) :])
            )
    return text


HELP = """Run your training step under memprobe's tracker: the snapshot torch would write, and
what its peak is made of."""


@user_errors
@runs_torch
def command(
    step: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:FUNCTION",
            help="The step, as package.module:function: fn(device) builds its model and "
            "inputs on that device and runs forward, loss, backward (and optionally an "
            "optimizer step).",
        ),
    ],
    device: Annotated[
        str,
        typer.Option(
            help="meta: exact simulation, nothing real allocated (any size); cpu: real "
            "tensors (keep them small); cuda: torch's own allocator history on a GPU."
        ),
    ] = "meta",
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Write the CUDA-format snapshot here (pickle protocol 4)."),
    ] = None,
    html: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Also write a self-contained HTML page of the attribution."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    top: Annotated[
        int,
        typer.Option(min=1, max=MAX_COUNT, help="Groups / blocks listed at the peak and each OOM."),
    ] = 10,
    alloc_conf: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="meta/cpu: allocator settings for the model (PYTORCH_ALLOC_CONF syntax), "
            "e.g. expandable_segments:True."
        ),
    ] = None,
) -> None:
    answer(
        profile_command(
            step,
            device=device,
            out=out,
            html_path=html,
            as_json=as_json,
            top=top,
            alloc_conf=alloc_conf,
        )
    )
    if html is not None:  # on stderr: stdout stays the reading (or the --json object)
        typer.echo(f"page: {printable(str(html))}", err=True)
