"""Attribute the difference between two snapshots' peaks: by category and by source line.

Each peak's live bytes are grouped by (the user's line, its caller, op, category), so
two call sites of one helper stay apart; a contributor's delta is its bytes at B's
peak minus at A's. Sorted by delta, largest growth first, so "context 512 → 1024"
names the line whose tensors grew.

Before the lines, what differs between the two runs as their readings show it
(:func:`run_differences`): the models (the parameters' block sizes), H and V, the
logits' dtype, autocast (weight copies), batch and sequence. A line-by-line table
between two different models is noise; those words say why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from memprobe.attribute.categories import AUTOCAST, PARAMETERS
from memprobe.attribute.findings import Findings
from memprobe.attribute.shape_records import NO_STACKS
from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes
from memprobe.io.text import printable
from memprobe.records import Frame


@dataclass(frozen=True)
class Contributor:
    frame: Frame | None
    op: str | None
    category: str
    bytes_a: int
    bytes_b: int
    caller: Frame | None = None  # told in the text; the --json schema has no place for it

    # The --json form (memprobe.io.codec): the delta beside its two sides, no caller.
    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "frame", "op", "category", "bytes_a", "bytes_b", "delta_bytes",
    )  # fmt: skip

    @property
    def delta_bytes(self) -> int:
        return self.bytes_b - self.bytes_a


@dataclass(frozen=True)
class Difference:
    """One way the two runs differ: ``what`` ("stack frames", "model", "hidden",
    "vocabulary", "logits dtype", "autocast", "batch", "sequence", "tokens"), its value
    in A and B (for "model" the parameters' bytes, for "autocast" the weight copies'
    bytes, 0 on the side without autocast), and what in the traces says so."""

    what: str
    a: int | str | None
    b: int | str | None
    evidence: str


def _parameter_blocks(f: Findings) -> Counter[int]:
    sizes: Counter[int] = Counter()
    for g in f.groups:
        if g.category == PARAMETERS:
            sizes[g.size] += g.count
    return sizes


def run_differences(a: Findings, b: Findings) -> tuple[Difference, ...]:
    """What differs between the runs, from each reading (nothing claimed that neither
    reading holds: an unknown B or S on either side names no batch change)."""
    out: list[Difference] = []
    sa, sb = (not any(NO_STACKS in why for why in f.inference.evidence) for f in (a, b))
    if sa != sb:
        # One file recorded without stacks (context=None): its bytes are all "other" with
        # no line, and the tables read that as every category moving there.
        out.append(
            Difference(
                "stack frames",
                "recorded" if sa else "none",
                "recorded" if sb else "none",
                f"{'B' if sa else 'A'} records none: its bytes have no category or line, so "
                "the tables below compare nothing alike (record both with context='all')",
            )
        )
    pa, pb = _parameter_blocks(a), _parameter_blocks(b)
    if pa and pb and pa != pb:
        only = len(set(pa) ^ set(pb))
        out.append(
            Difference(
                "model",
                sum(k * n for k, n in pa.items()),
                sum(k * n for k, n in pb.items()),
                f"parameter blocks at the peak: {sum(pa.values()):,} -> {sum(pb.values()):,}, "
                f"{only:,} block size(s) in only one of them",
            )
        )
    ia, ib = a.inference, b.inference
    for what, x, y in (("hidden", ia.hidden, ib.hidden), ("vocabulary", ia.vocab, ib.vocab)):
        if x is not None and y is not None and x != y:
            out.append(Difference(what, x, y, "each file's shape reading"))
    if ia.logits_dtype and ib.logits_dtype and ia.logits_dtype != ib.logits_dtype:
        out.append(
            Difference("logits dtype", ia.logits_dtype, ib.logits_dtype, "each logits family")
        )
    ca, cb = dict(a.breakdown).get(AUTOCAST, 0), dict(b.breakdown).get(AUTOCAST, 0)
    if bool(ca) != bool(cb):
        out.append(Difference("autocast", ca, cb, "bytes of autocast weight copies at each peak"))
    split = None not in (ia.batch, ia.seq, ib.batch, ib.seq)
    if split:
        for what, x, y in (("batch", ia.batch, ib.batch), ("sequence", ia.seq, ib.seq)):
            if x != y:
                out.append(Difference(what, x, y, "each file's B, S split"))
    elif ia.tokens is not None and ib.tokens is not None and ia.tokens != ib.tokens:
        out.append(Difference("tokens", ia.tokens, ib.tokens, "N = B·S in each file (unsplit)"))
    return tuple(out)


@dataclass(frozen=True)
class PeakDiff:
    path_a: str | None
    path_b: str | None
    peak_a_bytes: int
    peak_b_bytes: int
    categories: tuple[tuple[str, int, int], ...]  # (category, bytes at A, bytes at B)
    contributors: tuple[Contributor, ...]  # by delta, largest growth first
    differences: tuple[Difference, ...] = ()  # what differs between the runs
    # Each file's device and how many it holds with a trace, where it holds several (one
    # process on several GPUs): the peaks compared are one device's of each, and which
    # one was said nowhere. None where the file has one device or --device chose it. The
    # text says it; the --json keys stay the schema's.
    lead_a: tuple[int, int] | None = None
    lead_b: tuple[int, int] | None = None
    # Each side whose step ran out of memory: (side, entry, allocated then, requested) of
    # its first OOM. Its peak is what it held before the failure, not the step's: a step
    # that OOMed beside one that fits read "peak: 34.18 GiB -> 34.18 GiB (+0 B)", no line
    # changed, and the failed request was said nowhere.
    ooms: tuple[tuple[str, int, int, int], ...] = ()

    # The --json form (memprobe.io.codec): the peaks, what differs, the lines.
    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "peak_a_bytes", "peak_b_bytes", "differences", "contributors",
    )  # fmt: skip


def diff_findings(a: Findings, b: Findings) -> PeakDiff:
    _same_kind_of_peak(a, b)
    by_site: dict[tuple[Any, ...], list[int]] = {}
    for which, findings in ((0, a), (1, b)):
        for s in findings.peak_sites:
            by_site.setdefault((s.frame, s.caller, s.op, s.category), [0, 0])[which] += s.bytes
    contributors = [
        Contributor(f, op, c, x, y, caller) for (f, caller, op, c), (x, y) in by_site.items()
    ]
    contributors.sort(key=lambda c: (-c.delta_bytes, -c.bytes_b))
    cat_a: Counter[str] = Counter(dict(a.breakdown))
    cat_b: Counter[str] = Counter(dict(b.breakdown))
    # A's categories largest first, then B's new ones; a stable sort by delta keeps that
    # order among equal deltas (a set's order would change with each process's hash seed).
    categories = sorted(
        ((c, cat_a[c], cat_b[c]) for c in dict.fromkeys([*cat_a, *cat_b])),
        key=lambda t: -(t[2] - t[1]),
    )
    return PeakDiff(
        a.path,
        b.path,
        a.peak_allocated_bytes,
        b.peak_allocated_bytes,
        tuple(categories),
        tuple(contributors),
        run_differences(a, b),
        ooms=tuple(
            (side, f.ooms[0].index, f.ooms[0].allocated_bytes, f.ooms[0].requested_bytes)
            for side, f in (("A", a), ("B", b))
            if f.ooms
        ),
    )


def _same_kind_of_peak(a: Findings, b: Findings) -> None:
    """Both peaks are a trace's, or both are the segments' at snapshot time. A file
    recorded without history holds only what was live when it was written: set beside
    a trace's peak, it read as "peak: 516.76 KiB -> 0 B", a step whose peak vanished."""
    untraced = [(side, f) for side, f in (("A", a), ("B", b)) if f.peak_index is None]
    if len(untraced) != 1:
        return
    (side, f), other = untraced[0], "B" if untraced[0][0] == "A" else "A"
    raise UserError(
        f"{side} ({printable(str(f.path))}) records no trace, only what was live when it was "
        f"written ({format_bytes(f.peak_allocated_bytes)}): no peak to set beside {other}'s",
        "record both with torch.cuda.memory._record_memory_history() before the step "
        "(or memprobe profile), or diff two snapshots that both have none",
    )
