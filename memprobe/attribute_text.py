"""Findings as text lines for the terminal and as a minimal self-contained HTML page.

Every number printed comes from the Findings; nothing here computes memory facts.
"""

from __future__ import annotations

import json
import os

from memprobe.attribute import DEFAULT_TOP, BlockFinding, Findings, OomFinding, attribute_file
from memprobe.records import Frame
from memprobe.snapshot.frames import describe_frame
from memprobe.units import format_bytes

OTHER_FITS_SHOWN = 3


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


def _what(f: BlockFinding) -> str:
    if f.dtype is None:
        return "no [B,S,V] fit"
    shape = "?" if f.shape is None else "[" + ", ".join(str(d) for d in f.shape) + "]"
    source = " (recorded)" if f.dtype_source == "label" else ""
    return f"{f.dtype} {shape}{source}"


def _life(f: BlockFinding) -> str:
    start = "before the trace" if f.alloc_index is None else f"#{f.alloc_index}"
    end = "still live at the end" if f.free_index is None else f"#{f.free_index}"
    lived = f"lived {_duration(f.lifetime_us)}, " if f.lifetime_us is not None else ""
    return f"{lived}entries {start} -> {end}"


def _made_at(frame: Frame | None, phase: str | None) -> str:
    if frame is not None:
        return f"made at {describe_frame(frame)}"
    # Backward ops run from autograd's C++ engine: no Python line made them.
    return "made by autograd (no Python frame)" if phase == "backward" else "no user-code frame"


def _block_lines(n: int, f: BlockFinding) -> list[str]:
    size = format_bytes(f.size)
    phase = f.phase or "phase unknown"
    lines = [f"  {n}. {size:>10}  {_what(f)}  {phase}  op {f.op or '?'}"]
    where = []
    if f.live_at_peak:
        where.append("live at the peak")
    if f.oom_numbers:
        where.append("live at OOM " + ", ".join(f"#{k + 1}" for k in f.oom_numbers))
    made = _made_at(f.frame, f.phase)
    lines.append(f"     {made}; {_life(f)}" + (f"; {'; '.join(where)}" if where else ""))
    if f.explanations:
        best = f.explanations[0]
        lines.append(f"     why {best.describe()}: {'; '.join(best.reasons)}")
        others = [e.describe() for e in f.explanations[1 : 1 + OTHER_FITS_SHOWN]]
        more = len(f.explanations) - 1 - len(others) + f.more_explanations
        # A recorded dtype and shape settle it; otherwise the other fits matter.
        if others and f.dtype_source != "label":
            tail = f" (+{more} more)" if more else ""
            hint = "; pass --vocab/--tokens/--batch to narrow"
            lines.append(f"     also fits: {'; '.join(others)}{tail}{hint}")
    return lines


def _oom_lines(o: OomFinding, findings: Findings) -> list[str]:
    free = "unknown" if o.device_free_bytes is None else format_bytes(o.device_free_bytes)
    lines = [
        f"OOM #{o.number + 1} {_moment(findings, o.index, o.time_us)}: requested "
        f"{format_bytes(o.requested_bytes)} with {free} free on the device; "
        f"{format_bytes(o.allocated_bytes)} allocated in {_plural(o.live_count, 'live block')}",
        f"  failing request: {o.phase or 'phase unknown'}, op {o.op or '?'}, "
        + _made_at(o.frame, o.phase),
    ]
    by_addr = {f.address: f for f in findings.findings}
    for k, addr in enumerate(o.live_addresses, 1):
        f = by_addr.get(addr)
        if f is not None:
            lines.append(
                f"  {k}. {format_bytes(f.size):>10}  {_what(f)}  {f.phase or 'phase unknown'}  "
                f"op {f.op or '?'}  " + _made_at(f.frame, f.phase)
            )
    return lines


def _header_lines(findings: Findings) -> list[str]:
    out: list[str] = []
    if findings.path:
        out.append(f"snapshot: {findings.path}")
    if findings.source == "trace":
        out.append(f"trace: {findings.trace_entries:,} entries on device {findings.device}")
    else:
        out.append(f"no trace on device {findings.device}: what the segments hold at snapshot time")
    peak_moment = _moment(findings, findings.peak_index, findings.peak_time_us)
    out.append(f"peak allocated: {format_bytes(findings.peak_allocated_bytes)} {peak_moment}")
    if findings.peak_reserved_bytes is not None:
        moment = _moment(findings, findings.peak_reserved_index, findings.peak_reserved_time_us)
        out.append(f"peak reserved:  {format_bytes(findings.peak_reserved_bytes)} {moment}")
    else:
        held = findings.reserved_at_snapshot_bytes
        known = f"; {format_bytes(held)} reserved at snapshot time" if held is not None else ""
        out.append(f"peak reserved:  unknown (no segment events in the trace){known}")
    return out


def render_findings(findings: Findings, *, top: int | None = None) -> list[str]:
    """The report ``memprobe attribute`` prints, as lines."""
    out = _header_lines(findings)
    at_peak = [f for f in findings.findings if f.live_at_peak]
    others = [f for f in findings.findings if not f.live_at_peak and not f.live_at_oom]
    at_oom_only = [f for f in findings.findings if not f.live_at_peak and f.live_at_oom]
    limit = top if top is not None else len(findings.findings)
    n = 0
    if at_peak:
        shown = at_peak[:limit]
        out.append("")
        count = findings.live_at_peak_count
        out.append(f"live at the peak: {_plural(count, 'block')}; the {len(shown)} largest:")
        for f in shown:
            n += 1
            out.extend(_block_lines(n, f))
    if at_oom_only:
        out.append("")
        out.append("live at an OOM but not at the peak:")
        for f in at_oom_only[:limit]:
            n += 1
            out.extend(_block_lines(n, f))
    for o in findings.ooms:
        out.append("")
        out.extend(_oom_lines(o, findings))
    if others:
        out.append("")
        out.append("other large blocks (not live at the peak):")
        for f in others[:limit]:
            n += 1
            out.extend(_block_lines(n, f))
    if findings.notes:
        out.append("")
        out.extend(f"note: {note}" for note in findings.notes)
    return out


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
