"""What the attribute page leads with: one sentence on the peak, and each OOM moment.

Read from :class:`~memprobe.attribute.Findings` as attribution recorded them: the
peak's phase, the user's line that was allocating, the category holding the most
bytes; for an OOM the device, the exact request, and the free and reserved bytes at
that moment (never the snapshot-time figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from memprobe.attribute.findings import Findings
from memprobe.attribute.frames import describe_frame
from memprobe.attribute.records import OomFinding
from memprobe.io.sizes import format_bytes


def _share(part: int, total: int) -> str:
    return f"{100 * part / total:.0f}%" if total else "-"


def _phase(phase: str | None) -> str:
    return "the optimizer step" if phase == "optimizer" else phase or ""


def headline(f: Findings) -> str:
    """'Peak 34.18 GiB allocated on device 0 during backward, at train.py:12 in step;
    logits-family holds 29.30 GiB (86%) of it.'"""
    text = f"Peak {format_bytes(f.peak_allocated_bytes)} allocated on device {f.device}"
    if f.source != "trace":
        text = (
            f"{format_bytes(f.peak_allocated_bytes)} allocated on device {f.device} when the "
            "snapshot was taken (no trace: not a peak)"
        )
    if f.peak_phase:
        text += f" during {_phase(f.peak_phase)}"
    if f.peak_frame is not None:
        text += f", while {describe_frame(f.peak_frame)} was allocating"
    if f.breakdown:
        category, nbytes = f.breakdown[0]  # largest first
        text += (
            f"; {category} holds the most: {format_bytes(nbytes)} "
            f"({_share(nbytes, f.peak_allocated_bytes)})"
        )
    return text + "."


@dataclass(frozen=True)
class OomSummary:
    """One failed request, with the figures of its own moment."""

    device: int
    number: int  # 1-based, as the text report counts them
    entry: int  # trace position of the failed request
    requested_bytes: int
    device_free_bytes: int | None  # free on the device when it failed (torch records it)
    allocated_bytes: int
    reserved_bytes: int | None  # reserved then (from segment events); None: unknown
    free_in_reserved_bytes: int | None
    largest_free_block: int | None  # the largest free block then (the trace's segments)
    phase: str
    op: str
    frame: str
    verdict: str


def oom_summaries(f: Findings) -> tuple[OomSummary, ...]:
    return tuple(_summary(f.device, o) for o in f.ooms)


def _summary(device: int, o: OomFinding) -> OomSummary:
    v = o.verdict
    return OomSummary(
        device=device,
        number=o.number + 1,
        entry=o.index,
        requested_bytes=o.requested_bytes,
        device_free_bytes=o.device_free_bytes,
        allocated_bytes=o.allocated_bytes,
        reserved_bytes=v.reserved_bytes,
        free_in_reserved_bytes=v.free_in_reserved_bytes,
        largest_free_block=v.largest_free_block,
        phase=_phase(o.phase) or "phase unknown",
        op=o.op or "?",
        frame=describe_frame(o.frame),
        verdict=v.text,
    )
