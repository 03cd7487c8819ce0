"""Findings as text lines for the terminal.

The first screen says what failed, when the snapshot holds an OOM (the exact request,
what the device and the allocator had free at that moment, the verdict), then what the
peak is made of (bytes per category and the phase it happened in) and what the step's
shapes are; then identical blocks grouped, every logits-family block of the trace, the
allocator's view and the notes.
Every number printed comes from the Findings; nothing here computes memory facts.
"""

from __future__ import annotations

from memprobe.attribute.findings import Findings
from memprobe.attribute.frames import describe_frame, in_kernel
from memprobe.attribute.records import BlockFinding, BlockGroup, OomFinding
from memprobe.io.sizes import format_bytes
from memprobe.io.text import printable
from memprobe.records import Frame
from memprobe.snapshot.labels import op_words

LOGITS_SHOWN = 40  # logits-family blocks printed one by one (all are in --json)
EVIDENCE_SHOWN = 6


def _duration(us: int | None) -> str:
    if us is None:
        return "-"
    if abs(us) < 1000:
        return f"{us} us"
    if abs(us) < 1_000_000:
        return f"{us / 1000:.2f} ms"
    return f"{us / 1e6:.2f} s"


def _moment(findings: Findings, index: int | None, time_us: int | None) -> str:
    if index is None:
        return "at snapshot time"
    if index < 0:
        return "at the start of the recorded trace"
    text = f"at entry #{index}"
    if time_us is not None and findings.trace_start_us is not None:
        text += f" (t=+{_duration(time_us - findings.trace_start_us)})"
    return text


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _phase(phase: str | None, reason: str = "") -> str:
    if phase == "backward" and reason.startswith("no frames"):
        return "backward (autograd engine)"
    if phase == "optimizer":
        return "optimizer step"
    return phase or "phase unknown"


def _what(f: BlockFinding) -> str:
    if f.dtype is None or f.shape is None:
        return ""
    e = f.explanations[0] if f.explanations else None
    shape = e.describe().split(" ", 1)[1] if e else "[" + ", ".join(map(str, f.shape)) + "]"
    return f"{f.dtype} {shape}" + (" (recorded)" if f.dtype_source == "label" else "")


def _made(frame: Frame | None, chain: tuple[Frame, ...], via: tuple[str, ...], phase: str | None,
          reason: str = "") -> str:  # fmt: skip
    if frame is None:
        if phase == "backward":
            # Backward ops run from autograd's engine: no Python line made them.
            return "made by autograd (no user frame)"
        return "no user-code frame"
    text = f"made at {describe_frame(frame)}"
    callers = [describe_frame(f) for f in chain[1:]]
    if callers:
        text += " <- " + " <- ".join(callers)
    if via:
        text += f" (via {', '.join(via)})"
    return text


def _op(op: str | None, node: str | None, kernel: Frame | None = None) -> str:
    # As the page and the gate's note spell it (``input: logits``, not the label's word).
    text = f"op {op_words(op) if op else '?'}"
    text += f" [{node}]" if node and node not in (op or "") else ""
    return text + in_kernel(kernel)


def _life(f: BlockFinding, findings: Findings) -> str:
    start = "before the trace" if f.alloc_index is None else f"#{f.alloc_index}"
    if f.free_index is None:
        end = "still live at the end"
    else:
        peak = findings.peak_index
        when = ""
        if peak is not None and peak >= 0 and not f.live_at_peak:
            when = " (before the peak)" if f.free_index <= peak else " (after the peak)"
        end = f"freed #{f.free_index}{when}"
    lived = f"lived {_duration(f.lifetime_us)}, " if f.lifetime_us is not None else ""
    return f"{lived}{start} -> {end}"


def _block_lines(n: int, f: BlockFinding, findings: Findings) -> list[str]:
    what = _what(f)
    head = f"  {n}. {format_bytes(f.size):>10}  {f.category}"
    head += f"  {what}" if what else ""
    head += f"  {_phase(f.phase, f.phase_reason)}  {_op(f.op, f.node, f.kernel)}"
    where = []
    if f.live_at_peak:
        where.append("live at the peak")
    if f.oom_numbers:
        where.append("live at OOM " + ", ".join(f"#{k + 1}" for k in f.oom_numbers))
    made = _made(f.frame, f.chain, f.via, f.phase)
    lines = [
        head,
        f"     {made}; {_life(f, findings)}" + (f"; {'; '.join(where)}" if where else ""),
    ]
    if f.logits and f.logits_reason:
        lines.append(f"     why logits-family: {f.logits_reason}")
    return lines


def _group_line(n: int, g: BlockGroup) -> str:
    size = format_bytes(g.size)
    count = f"{g.count} × {size}" if g.count > 1 else size
    total = f" = {format_bytes(g.total_bytes)}" if g.count > 1 else ""
    where = describe_frame(g.frame) if g.frame else "no user frame"
    when = "alive before the trace" if g.before_trace else _phase(g.phase)
    op = f"op {op_words(g.op) if g.op else '?'}{in_kernel(g.kernel)}"
    return f"  {n}. {count}{total}  {g.category}, {when}, {op}, {where}"


def _shape_lines(findings: Findings) -> list[str]:
    inf = findings.inference
    if not inf.logits_path:
        # Unknown, said as such: no [B, S, V] is claimed without a logits path.
        lines = [f"shapes: [B, S, V] unknown: {inf.evidence[0]}"]
        if findings.vocab or findings.tokens or findings.batch:
            lines.append("  (--vocab/--tokens/--batch are not applied without a logits path)")
        return lines
    dtypes = " / ".join(dict.fromkeys(t for _, t in reversed(inf.family))) or "?"
    hidden = f", H = {inf.hidden:,}" if inf.hidden else ""
    head = f"shapes: logits {inf.shape_text()}{hidden}, {dtypes}"
    if inf.forward_only:
        ran_backward = findings.peak_phase in ("backward", "optimizer") or any(
            f.phase in ("backward", "optimizer") for f in findings.findings
        )
        # "Forward only" is a claim about the trace: a step whose backward ran had a loss,
        # just none over [N, V] blocks (a chunked or fused one).
        head += (
            " (a backward ran, but no loss over [N, V]: a chunked or fused loss?)"
            if ran_backward
            else " (forward only, no loss)"
        )
    lines = [f"{head}; confidence {inf.confidence}"]
    # The first lines, and always the one a B, S split rests on (a claim's evidence is
    # never cut); the rest are in --json.
    shown = [r for k, r in enumerate(inf.evidence) if k < EVIDENCE_SHOWN or r.startswith("B = ")]
    for reason in shown:
        lines.append(f"  - {reason}")
    if len(shown) < len(inf.evidence):
        lines.append(f"  - … {len(inf.evidence) - len(shown)} more (all are in --json)")
    if inf.alternatives and inf.confidence not in ("given", "high"):
        lines.append(f"  other readings: {'; '.join(inf.alternatives)}")
    if inf.confidence in ("low", "medium"):
        # Only the flags not given: after `--vocab 32000` the line asked for --vocab again.
        given = {"--vocab": findings.vocab, "--tokens": findings.tokens, "--batch": findings.batch}
        left = [flag for flag, value in given.items() if value is None]
        if left:
            lines.append(f"  pass {'/'.join(left)} to settle it")
    return lines


def _breakdown_text(breakdown: tuple[tuple[str, int], ...], total: int) -> str:
    return ", ".join(f"{format_bytes(b)} {c} ({_percent(b, total)})" for c, b in breakdown)


def _header_lines(findings: Findings) -> list[str]:
    out: list[str] = []
    if findings.source == "trace":
        simulated = " (simulated: no times)" if findings.times == "simulated" else ""
        out.append(f"device {findings.device}: {findings.trace_entries:,} trace entries{simulated}")
    else:
        out.append(f"device {findings.device}: no trace; what the segments hold at snapshot time")
    peak_moment = _moment(findings, findings.peak_index, findings.peak_time_us)
    during = ""
    if findings.peak_phase:
        during = f" during {_phase(findings.peak_phase)}"
        if findings.peak_frame is not None:
            kernel = findings.peak_kernel
            inside = f", inside memprobe's kernel at {describe_frame(kernel)}" if kernel else ""
            during += f" ({describe_frame(findings.peak_frame)}{inside})"
    out.append(
        f"peak allocated: {format_bytes(findings.peak_allocated_bytes)} {peak_moment}{during}"
    )
    if findings.breakdown:
        out.append(
            "  made of: " + _breakdown_text(findings.breakdown, findings.peak_allocated_bytes)
        )
    if findings.peak_reserved_bytes is not None:
        moment = _moment(findings, findings.peak_reserved_index, findings.peak_reserved_time_us)
        # torch allocates inside segments: a trace holding more than they reserve (sizes
        # edited, devices mixed) read "peak allocated 20,971,520.00 TiB" over "peak
        # reserved 46.57 GiB" as two facts; the note says why, this line says so too.
        below = findings.peak_reserved_bytes < findings.peak_allocated_bytes
        bound = " (a lower bound: below the peak allocated, see the note)" if below else ""
        out.append(f"peak reserved:  {format_bytes(findings.peak_reserved_bytes)} {moment}{bound}")
    else:
        held = findings.reserved_at_snapshot_bytes
        known = f"; {format_bytes(held)} reserved at snapshot time" if held is not None else ""
        out.append(f"peak reserved:  unknown (no segment events in the trace){known}")
    return out


def _oom_lines(o: OomFinding, findings: Findings) -> list[str]:
    free = "unknown" if o.device_free_bytes is None else format_bytes(o.device_free_bytes)
    v = o.verdict
    lines = [
        f"OOM #{o.number + 1} on device {findings.device} {_moment(findings, o.index, o.time_us)}:"
        f" requested {o.requested_bytes:,} B ({format_bytes(o.requested_bytes)}), "
        f"{_phase(o.phase)}, op {op_words(o.op) if o.op else '?'}, "
        + _made(o.frame, (), (), o.phase),
    ]
    moment = [f"{free} free on the device"]
    if v.reserved_bytes is not None:
        unused = format_bytes(v.free_in_reserved_bytes or 0)
        held = f"{format_bytes(v.reserved_bytes)} reserved, {unused} of it not allocated"
        if v.largest_free_block is not None:
            held += f" (largest free block {format_bytes(v.largest_free_block)})"
        moment.append(held)
    moment.append(
        f"{format_bytes(o.allocated_bytes)} allocated in {_plural(o.live_count, 'live block')}"
    )
    lines.append("  at that moment: " + ", ".join(moment))
    lines.append(f"  verdict: {v.text}")
    if o.breakdown:
        lines.append("  live then: " + _breakdown_text(o.breakdown, o.allocated_bytes))
    return lines


def _allocator_lines(findings: Findings) -> list[str]:
    a = findings.allocator
    allocated = findings.peak_allocated_bytes
    out = []
    if a.segments:
        out.append(
            f"allocator at snapshot time: {_plural(a.segments, 'segment')} ({a.large_segments} "
            f"large, {a.small_segments} small, {a.expandable_segments} expandable), "
            f"{format_bytes(a.reserved_bytes)} reserved, {format_bytes(a.active_bytes)} in live "
            f"blocks, {format_bytes(a.inactive_split_bytes)} free inside split segments, "
            f"largest free block {format_bytes(a.largest_free_block)}"
        )
    if a.reserved_at_peak_bytes is not None and a.reserved_at_peak_bytes < allocated:
        out.append(
            f"at the peak: {format_bytes(a.reserved_at_peak_bytes)} reserved, less than the "
            f"{format_bytes(allocated)} allocated (the trace and its segments disagree)"
        )
    elif a.free_in_reserved_at_peak_bytes is not None:
        out.append(
            f"at the peak: {format_bytes(a.reserved_at_peak_bytes)} reserved, "
            f"{format_bytes(a.free_in_reserved_at_peak_bytes)} of it not allocated "
            "(reserved − allocated, requested sizes)"
        )
    if a.settings:
        out.append("allocator settings: " + ", ".join(f"{k}={v}" for k, v in a.settings))
    return out


def render_findings(findings: Findings, *, top: int | None = None) -> list[str]:
    """The report ``memprobe attribute`` prints for one device, as lines."""
    out = [f"snapshot: {printable(findings.path)}"] if findings.path else []
    header = _header_lines(findings)
    out.append(header[0])
    # The failure first: what was asked for, what the device and the allocator had then.
    for o in findings.ooms:
        out += _oom_lines(o, findings)
    if findings.ooms:
        out.append("")
    out += header[1:]
    out += _shape_lines(findings)
    limit = top if top is not None else len(findings.groups)
    if findings.groups:
        shown = findings.groups[:limit]
        out.append("")
        out.append(
            f"live at the peak: {_plural(findings.live_at_peak_count, 'block')} in "
            f"{_plural(len(findings.groups), 'group')}; the {len(shown)} largest:"
        )
        for n, g in enumerate(shown, 1):
            out.append(_group_line(n, g))
            if g.reason:
                out.append(f"     why {g.category}: {g.reason}")
    n = 0
    family = findings.logits_family
    out.append("")
    if family:
        made = sum(f.size for f in family)
        live = sum(f.size for f in family if f.live_at_peak)
        out.append(
            f"logits-family blocks: {len(family)} in the trace ({format_bytes(made)} made, "
            f"{format_bytes(live)} live at the peak):"
        )
        for f in family[:LOGITS_SHOWN]:
            n += 1
            out += _block_lines(n, f, findings)
        if len(family) > LOGITS_SHOWN:
            out.append(f"  … {len(family) - LOGITS_SHOWN} more (all are in --json)")
    else:
        why = "no LM logits path found" if not findings.inference.logits_path else "none found"
        out.append(f"logits-family blocks: {why}")
    at_oom_only = [
        f for f in findings.findings if not f.live_at_peak and f.live_at_oom and not f.logits
    ]
    if at_oom_only:
        out.append("")
        out.append("live at an OOM but not at the peak:")
        for f in at_oom_only[: top or len(at_oom_only)]:
            n += 1
            out += _block_lines(n, f, findings)
    others = [
        f for f in findings.findings if not f.live_at_peak and not f.live_at_oom and not f.logits
    ]
    if others:
        out.append("")
        out.append("other large blocks (not live at the peak):")
        for f in others[: top or len(others)]:
            n += 1
            out += _block_lines(n, f, findings)
    allocator = _allocator_lines(findings)
    if allocator:
        out.append("")
        out += allocator
    if findings.notes:
        out.append("")
        out += [f"note: {note}" for note in findings.notes]
    return out


def render_devices(all_findings: tuple[Findings, ...], *, top: int | None = None) -> list[str]:
    """Every device, the one that hit an OOM first (as ``attribute_devices`` orders them)."""
    out: list[str] = []
    if len(all_findings) > 1:
        summary = "; ".join(
            (
                f"device {f.device}: peak {format_bytes(f.peak_allocated_bytes)}"
                if f.trace_entries
                else f"device {f.device}: no trace, {format_bytes(f.peak_allocated_bytes)} live"
            )
            + (f", {_plural(len(f.ooms) + f.more_ooms, 'OOM')}" if f.ooms else "")
            for f in all_findings
        )
        traced = sum(1 for f in all_findings if f.trace_entries)
        # A device idle while history was recorded holds segments but has no trace.
        count = (
            f"{len(all_findings)} devices with a trace"
            if traced == len(all_findings)
            else f"{len(all_findings)} devices, {traced} with a trace"
        )
        out.append(f"{count} ({summary})")
        out.append("")
    for i, f in enumerate(all_findings):
        if i:
            out += ["", "=" * 72, ""]
        out += render_findings(f, top=top)
    return out
