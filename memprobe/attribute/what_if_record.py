"""The what-if prediction as a record: recorded beside predicted, as JSON and text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from memprobe.attribute.findings import Findings
from memprobe.io.sizes import format_bytes


@dataclass(frozen=True)
class UnmetRequest:
    """A request the recorded step failed (an OOM) outside the loss step: the new kernel
    still makes it, with ``allocated_bytes`` (the spliced trace's) held then."""

    entry: int  # its entry in the recorded trace
    requested_bytes: int
    allocated_bytes: int

    @property
    def needed_bytes(self) -> int:
        return self.allocated_bytes + self.requested_bytes


@dataclass(frozen=True)
class WhatIf:
    """The prediction: the recorded step beside the same step with ``kernel``."""

    kernel: str
    shape: tuple[int, int, int]  # B, S, V of the logits the kernel was simulated at
    dtype: str
    chunk_size: int | None
    forward_entries: tuple[int, int]
    backward_entries: tuple[int, int]
    cut_blocks: int
    recorded_peak_bytes: int
    predicted_peak_bytes: int
    recorded_reserved_peak_bytes: int | None
    model_reserved_peak_bytes: int  # the allocator model on the recorded trace
    predicted_reserved_peak_bytes: int
    predicted: Findings  # the spliced trace, attributed: the new peak's place and makeup
    capacity_bytes: int | None
    capacity_source: str | None
    shifted: bool = False  # the loss ran on logits[:, :-1] (``shape`` has its S − 1 rows)
    # The device whose step was predicted, where the snapshot has more than one: its
    # lines follow every device's findings, and the loss may be on any one of them.
    device: int | None = None
    unmet: UnmetRequest | None = None  # the largest OOM outside the loss step, if any

    # The --json keys, in the order the schema has always had (io/codec.py): the
    # prediction's findings enter only as its peak's place and makeup.
    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "kernel", "shape", "shifted", "dtype", "chunk_size", "recorded_peak_bytes",
        "predicted_peak_bytes", "recorded_reserved_peak_bytes", "model_reserved_peak_bytes",
        "predicted_reserved_peak_bytes", "saved_bytes", "fits", "capacity_bytes",
        "capacity_source", "predicted_peak_index", "predicted_peak_phase", "predicted_peak_op",
        "predicted_breakdown", "forward_entries", "backward_entries", "cut_blocks", "device",
        "unmet_request_entry", "unmet_request_bytes", "unmet_needed_bytes",
    )  # fmt: skip

    @property
    def saved_bytes(self) -> int:
        return self.recorded_peak_bytes - self.predicted_peak_bytes

    @property
    def fits(self) -> bool | None:
        """Whether the predicted reserved peak, and every request the recorded step failed
        outside the loss step, fit the capacity (None: none known)."""
        if self.capacity_bytes is None:
            return None
        if self.unmet is not None and self.unmet.needed_bytes > self.capacity_bytes:
            return False
        return self.predicted_reserved_peak_bytes <= self.capacity_bytes

    @property
    def unmet_request_entry(self) -> int | None:
        return None if self.unmet is None else self.unmet.entry

    @property
    def unmet_request_bytes(self) -> int | None:
        return None if self.unmet is None else self.unmet.requested_bytes

    @property
    def unmet_needed_bytes(self) -> int | None:
        return None if self.unmet is None else self.unmet.needed_bytes

    @property
    def predicted_peak_index(self) -> int | None:
        return self.predicted.peak_index

    @property
    def predicted_peak_phase(self) -> str | None:
        return self.predicted.peak_phase

    @property
    def predicted_peak_op(self) -> str | None:
        return self.predicted.peak_op

    @property
    def predicted_breakdown(self) -> tuple[tuple[str, int], ...]:
        return tuple(self.predicted.breakdown)

    def lines(self) -> list[str]:
        b, s, v = self.shape
        chunk = f", chunk {self.chunk_size}" if self.chunk_size else ""
        on = " on logits[:, :-1] (a shifted loss)" if self.shifted else ""
        on_device = f" on device {self.device}" if self.device is not None else ""
        (fa, fb), (ba, bb) = self.forward_entries, self.backward_entries
        p = self.predicted
        if p.peak_index is None:
            where = "at snapshot time"
        elif p.peak_index < 0:  # BEFORE_TRACE: what was live before the first entry
            where = "at the start of the recorded trace"
        else:
            where = f"at entry #{p.peak_index}"
        if p.peak_phase:
            where += f" during {p.peak_phase}"
        if p.peak_op:
            where += f" (op {p.peak_op})"
        total = self.predicted_peak_bytes or 1
        made = ", ".join(f"{format_bytes(n)} {c} ({100 * n / total:.0f}%)" for c, n in p.breakdown)
        recorded_reserved = (
            format_bytes(self.recorded_reserved_peak_bytes)
            if self.recorded_reserved_peak_bytes is not None
            else "not recorded"
        )
        out = [
            f"what-if {self.kernel}{on_device}: the loss step (forward entries #{fa}-#{fb}, "
            f"backward #{ba}-#{bb}: {self.cut_blocks} blocks) replaced by {self.kernel} at "
            f"[B={b:,}, S={s:,}, V={v:,}] {self.dtype}{chunk}{on}, simulated on meta",
            f"  peak allocated: {format_bytes(self.recorded_peak_bytes)} recorded -> "
            f"{format_bytes(self.predicted_peak_bytes)} predicted "
            f"({_saving(self.saved_bytes)}), {where}",
            f"  made of: {made}",
            f"  peak reserved:  {recorded_reserved} recorded -> "
            f"{format_bytes(self.predicted_reserved_peak_bytes)} predicted by memprobe's "
            "caching-allocator model (which gives "
            f"{format_bytes(self.model_reserved_peak_bytes)} on the recorded trace)",
        ]
        verdict = f"  with {self.kernel}: {format_bytes(self.predicted_peak_bytes)} allocated, "
        verdict += f"{format_bytes(self.predicted_reserved_peak_bytes)} reserved"
        if self.capacity_bytes is None:
            verdict += "; no device capacity recorded (give --budget to say whether it fits)"
        else:
            word = "fits" if self.fits else "does not fit"
            verdict += f": {word} {format_bytes(self.capacity_bytes)} ({self.capacity_source})"
        if self.unmet is not None:
            u = self.unmet
            verdict += (
                f"; the recorded step failed a request of {format_bytes(u.requested_bytes)} "
                f"at entry #{u.entry}, outside the loss step, which {self.kernel} does not "
                f"change ({format_bytes(u.needed_bytes)} with what is allocated then)"
            )
        return [*out, verdict]


def _saving(saved: int) -> str:
    if saved >= 0:
        return f"saves {format_bytes(saved)}"
    return f"costs {format_bytes(-saved)} more"
