"""``memprobe attribute``: read a snapshot, attribute every device's peak and OOMs, print
(and page) it. Imports no torch: reading a snapshot costs no torch start-up."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.allocator import DeviceReplay, modelled_alloc_conf, replay_snapshot
from memprobe.attribute import DEFAULT_TOP, attribute_devices
from memprobe.attribute.what_if import WhatIf, check_what_if_kernel
from memprobe.attribute.what_if import what_if as predict_with
from memprobe.commands.flags import (
    MAX_COUNT,
    answer,
    check_temp_dir,
    user_errors,
    warn_on_size,
)
from memprobe.errors import UserError
from memprobe.io.codec import to_json
from memprobe.io.files import guard_outputs
from memprobe.io.sizes import format_bytes, parse_budget
from memprobe.io.text import printable
from memprobe.render.findings_text import render_devices
from memprobe.snapshot.load import load_snapshot


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
    replay: bool = False,
    alloc_conf: str | None = None,
    what_if: str | None = None,
    budget: str | None = None,
    chunk_size: int | None = None,
) -> str:
    """What ``memprobe attribute`` prints: the text report, or one JSON object (the lead
    device's findings, the other devices under ``other_devices``).

    Writes the HTML page first when ``html_path`` is given. With ``replay`` the trace's
    requests also go through memprobe's model of the caching allocator (under the
    snapshot's own settings, or ``alloc_conf`` for a what-if) and the result is compared
    with what the real allocator recorded. ``what_if`` names a kernel to predict the step
    with (:mod:`memprobe.attribute.what_if`), against ``budget`` when given.
    """
    if alloc_conf is not None and not replay:
        raise UserError("--alloc-conf applies to --replay", "add --replay")
    for flag, value in (("--budget", budget), ("--chunk-size", chunk_size)):
        if value is not None and what_if is None:
            raise UserError(f"{flag} applies to --what-if", "add --what-if KERNEL")
    warn_on_size(budget, "--budget")  # `--budget 80` (bytes) or 80GB, as sweep and plan warn
    budget_bytes = parse_budget(budget) if budget is not None else None
    if what_if is not None:
        check_temp_dir()  # the prediction runs the kernel on meta
        check_what_if_kernel(what_if)  # before the snapshot is read
    conf = modelled_alloc_conf(alloc_conf) if alloc_conf is not None else None
    if html_path is not None:
        # Before anything is read or written: the page must not replace the snapshot.
        from memprobe.kernels.user_sources import kernel_source_files, loaded_code_files

        sources = [Path(snapshot), *kernel_source_files(what_if)]
        guard_outputs({"--html": html_path}, [*sources, *loaded_code_files([html_path])])
    loaded = load_snapshot(snapshot)
    predicted = None
    if what_if is not None:
        predicted = predict_with(
            loaded,
            what_if,
            budget_bytes=budget_bytes,
            chunk_size=chunk_size if chunk_size is not None else 1024,
            device=device,
            vocab=vocab,
            tokens=tokens,
            batch=batch,
            path=str(snapshot),
        )
    if html_path is not None and what_if is not None:
        from memprobe.kernels.user_sources import loaded_code_files

        # A module the kernel imported as it ran is code too: never replaced.
        guard_outputs({"--html": html_path}, loaded_code_files([html_path]))
    if html_path is not None:
        # After the code guards: a module the kernel imported is refused as code, by name.
        from memprobe.render.html import refuse_foreign_html

        refuse_foreign_html(html_path)
    return attribution_output(
        loaded,
        normalized=True,
        path=str(snapshot),
        vocab=vocab,
        tokens=tokens,
        batch=batch,
        top=top,
        device=device,
        as_json=as_json,
        html_path=html_path,
        replay=replay,
        conf=conf,
        what_if=predicted,
    )


def attribution_output(
    loaded: dict,
    *,
    path: str,
    vocab: int | None = None,
    tokens: int | None = None,
    batch: int | None = None,
    top: int = DEFAULT_TOP,
    device: int | None = None,
    as_json: bool = False,
    html_path: str | os.PathLike[str] | None = None,
    replay: bool = False,
    conf: object = None,
    what_if: WhatIf | None = None,
    normalized: bool = False,
) -> str:
    """The text (or JSON) ``memprobe attribute`` prints for a snapshot dict already in
    hand (``memprobe profile`` prints the same for the snapshot it made); writes the
    HTML page first when ``html_path`` is given. ``normalized``: ``loaded`` came from
    ``load_snapshot``."""
    found = attribute_devices(
        loaded,
        path=path,
        vocab=vocab,
        tokens=tokens,
        batch=batch,
        top=top,
        device=device,
        timeline=html_path is not None,
        normalized=normalized,
    )
    if html_path is not None:
        # Imported here: matplotlib is only needed for the page.
        from memprobe.render.attribute_page import write_attribute_page

        write_attribute_page(found, html_path, title=f"memprobe attribute: {path}")
    replays = _replays(loaded, conf) if replay else {}
    if as_json:
        devices = []
        for f in found:
            out = to_json(f)
            if replay:
                out["replay"] = replays[f.device].json if f.device in replays else None
            devices.append(out)
        lead = devices[0]
        lead["other_devices"] = devices[1:]
        if what_if is not None:
            lead["what_if"] = to_json(what_if)
        return json.dumps(lead, indent=1)
    lines = render_devices(found, top=top)
    for f in found:
        if f.device in replays:
            lines += ["", *replays[f.device].lines()]
    if what_if is not None:
        lines += ["", *what_if.lines()]
    return "\n".join(lines)


class _Replay:
    """One device's replay: faithful (the snapshot's own settings, new segments at the
    recorded addresses) and, with other settings, the what-if."""

    def __init__(self, faithful: DeviceReplay, what_if: DeviceReplay | None) -> None:
        self.faithful, self.what_if = faithful, what_if

    @property
    def json(self) -> dict[str, object]:
        shown = self.what_if or self.faithful
        return {
            "predicted_reserved_peak_bytes": shown.predicted_reserved_peak_bytes,
            "recorded_reserved_peak_bytes": self.faithful.recorded_reserved_peak_bytes,
            "predicted_segments": shown.predicted_segments,
            "recorded_segments": self.faithful.recorded_segments,
            "error_pct": self.faithful.error_pct,
            "alloc_conf": shown.alloc_conf,
            "address_mismatches": self.faithful.address_mismatches,
            "recorded_from": self.faithful.recorded_from,
            "timeline_mismatches": self.faithful.timeline_mismatches,
            "first_address_mismatch": None
            if self.faithful.first_address_mismatch is None
            else list(self.faithful.first_address_mismatch),
            "requests": self.faithful.requests,
            "notes": list(self.faithful.notes),
        }

    def lines(self) -> list[str]:
        r = self.faithful
        settings = r.alloc_conf or "default settings"
        peak = format_bytes(r.predicted_reserved_peak_bytes)
        head = (
            f"replay on device {r.device} (memprobe's caching-allocator model, {settings}, "
            f"{r.requests:,} requests): reserved peak {peak}"
        )
        if r.recorded_reserved_peak_bytes is None:
            head += "; the snapshot holds neither segments nor segment events to compare with"
        else:
            recorded = format_bytes(r.recorded_reserved_peak_bytes)
            if r.recorded_from == "constant":
                # No segment events: the final segments were reserved through the window.
                recorded += " held throughout (no segment events: reserved never changed)"
            else:
                recorded += " recorded"
            head += (
                f" against {recorded} ({r.error_pct:+.2f}%), {r.predicted_segments} segments "
                f"against {r.recorded_segments}"
            )
            if r.recorded_from == "constant" and r.timeline_mismatches is not None:
                head += (
                    ", the model's reserved equal to it after every allocation"
                    if r.timeline_mismatches == 0
                    else f", the model's reserved off it after {r.timeline_mismatches:,} "
                    f"allocations (the first at entry #{r.first_mismatch_index})"
                )
            if r.address_mismatches == 0:
                head += ", every allocation at its recorded address"
            elif r.address_mismatches:
                head += f", {r.address_mismatches:,} allocations away from their recorded address"
        out = [head, *(f"  note: {n}" for n in r.notes)]
        if self.what_if is not None:
            before = r.recorded_reserved_peak_bytes or r.predicted_reserved_peak_bytes
            out.append(
                f"what-if {self.what_if.alloc_conf or 'default settings'}: this job would have "
                f"reserved {format_bytes(self.what_if.predicted_reserved_peak_bytes)} instead of "
                f"{format_bytes(before)}"
            )
        return out


def _replays(snapshot: dict, conf: object) -> dict[int, _Replay]:
    faithful = replay_snapshot(snapshot, use_recorded_addresses=True)
    what_if = replay_snapshot(snapshot, conf=conf) if conf is not None else ()  # type: ignore[arg-type]
    by_device = {r.device: r for r in what_if}
    return {r.device: _Replay(r, by_device.get(r.device)) for r in faithful}


HELP = """What the peak is made of: inferred shapes, categories, logits-family blocks, OOMs."""


@user_errors
def command(
    snapshot: Annotated[
        Path, typer.Argument(help="CUDA allocator snapshot (.pickle from torch or memprobe).")
    ],
    vocab: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, max=MAX_COUNT, help="Vocabulary size V (overrides what is inferred)."),
    ] = None,
    tokens: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, max=MAX_COUNT, help="Sequence length S (tokens per sequence)."),
    ] = None,
    batch: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, max=MAX_COUNT, help="Batch size B."),
    ] = None,
    top: Annotated[
        int,
        typer.Option(min=1, max=MAX_COUNT, help="Groups / blocks listed at the peak and each OOM."),
    ] = 10,
    device: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=0, max=MAX_COUNT, help="Attribute only this device (default: every device)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    html: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Also write a self-contained HTML page of the findings."),
    ] = None,
    replay: Annotated[
        bool,
        typer.Option(
            "--replay",
            help="Also replay the trace through memprobe's caching-allocator model and compare "
            "its reserved peak and segments with what the real allocator recorded.",
        ),
    ] = False,
    alloc_conf: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="With --replay: allocator settings (PYTORCH_ALLOC_CONF syntax) for a what-if, "
            "e.g. expandable_segments:True.",
        ),
    ] = None,
    what_if: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--what-if",
            help="Predict the step with this logprob kernel as its loss (`memprobe kernels`): "
            "peak allocated and reserved, and whether it fits.",
        ),
    ] = None,
    budget: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="With --what-if: the device's memory, e.g. 80GiB."),
    ] = None,
    chunk_size: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=1, max=MAX_COUNT, help="With --what-if: the kernel's chunk size. (default: 1024)"
        ),
    ] = None,
) -> None:

    text = attribute_command(
        snapshot,
        vocab=vocab,
        tokens=tokens,
        batch=batch,
        top=top,
        device=device,
        as_json=as_json,
        html_path=html,
        replay=replay,
        alloc_conf=alloc_conf,
        what_if=what_if,
        budget=budget,
        chunk_size=chunk_size,
    )
    answer(text)
    if html is not None:  # on stderr: stdout stays the reading (or the --json object)
        typer.echo(f"page: {printable(str(html))}", err=True)
