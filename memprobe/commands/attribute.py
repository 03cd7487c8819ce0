"""``memprobe attribute``: read a snapshot, attribute every device's peak and OOMs, print
(and page) it. Imports no torch: reading a snapshot costs no torch start-up."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from memprobe.allocator import DeviceReplay, parse_alloc_conf, replay_snapshot
from memprobe.attribute import DEFAULT_TOP, attribute_devices
from memprobe.commands.flags import user_errors
from memprobe.errors import UserError
from memprobe.io.files import guard_outputs
from memprobe.io.sizes import format_bytes
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
) -> str:
    """What ``memprobe attribute`` prints: the text report, or one JSON object (the lead
    device's findings, the other devices under ``other_devices``).

    Writes the HTML page first when ``html_path`` is given. With ``replay`` the trace's
    requests also go through memprobe's model of the caching allocator (under the
    snapshot's own settings, or ``alloc_conf`` for a what-if) and the result is compared
    with what the real allocator recorded.
    """
    if alloc_conf is not None and not replay:
        raise UserError("--alloc-conf applies to --replay", "add --replay")
    conf = parse_alloc_conf(alloc_conf) if alloc_conf is not None else None
    if html_path is not None:
        # Before anything is read or written: the page must not replace the snapshot.
        guard_outputs({"--html": html_path}, [Path(snapshot)])
    loaded = load_snapshot(snapshot)
    return attribution_output(
        loaded,
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
) -> str:
    """The text (or JSON) ``memprobe attribute`` prints for a snapshot dict already in
    hand (``memprobe profile`` prints the same for the snapshot it made); writes the
    HTML page first when ``html_path`` is given."""
    found = attribute_devices(
        loaded,
        path=path,
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

        write_attribute_page(found, html_path, title=f"memprobe attribute: {path}")
    replays = _replays(loaded, conf) if replay else {}
    if as_json:
        devices = []
        for f in found:
            out = f.to_json()
            if replay:
                out["replay"] = replays[f.device].json if f.device in replays else None
            devices.append(out)
        lead = devices[0]
        lead["other_devices"] = devices[1:]
        return json.dumps(lead, indent=1)
    lines = render_devices(found, top=top)
    for f in found:
        if f.device in replays:
            lines += ["", *replays[f.device].lines()]
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
            head += "; the trace records no segment events to compare with"
        else:
            head += (
                f" against {format_bytes(r.recorded_reserved_peak_bytes)} recorded "
                f"({r.error_pct:+.2f}%), {r.predicted_segments} segments against "
                f"{r.recorded_segments}"
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
        replay=replay,
        alloc_conf=alloc_conf,
    )
    typer.echo(text)
