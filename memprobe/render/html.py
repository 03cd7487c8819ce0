"""The sweep's report page: a run directory → ``report.html`` (self-contained) and the
PNG plots beside it, both rendered from one :class:`~memprobe.report.page.Page`.

This module turns the page model into the plain values ``templates/report.html``
shows; the markup is the template's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from memprobe.errors import UserError
from memprobe.io.files import file_in_the_way, leads_out, read_regular, write_atomic
from memprobe.io.sizes import format_bytes
from memprobe.io.text import shell_word
from memprobe.records import Case
from memprobe.render import REPORT_NAME
from memprobe.render.canvas import made_by_memprobe
from memprobe.render.findings_view import FindingsView, findings_view
from memprobe.render.png import PLOT_NAMES, Plots, render_plots
from memprobe.render.templating import (
    Cell,
    Figure,
    Table,
    bytes_cell,
    number_cell,
    relative_href,
    render_page,
)
from memprobe.report.evidence import Evidence
from memprobe.report.headline import (
    Headline,
    budget_sentence,
    kernel_line_parts,
    other_slices,
    recommendation,
    shape_text,
    why_sentence,
)
from memprobe.report.page import Page, build_page
from memprobe.results import MAX_JSON_BYTES, missing


def _figures(p: Plots, h: Headline) -> dict[str, Figure]:
    img = p.images
    return {
        "peak_vs_tokens": Figure(
            img["peak_vs_tokens"],
            "peak memory against tokens",
            f"Peak per kernel as the sequence grows, at {h.vocab:,} vocabulary. Dashed: the "
            "floor (what must be resident). Log scales: equal slopes mean equal growth rates.",
            "Only one token count in this run: no tokens plot.",
        ),
        "peak_vs_vocab": Figure(
            img["peak_vs_vocab"],
            "peak memory against vocabulary",
            f"Peak per kernel as the vocabulary grows, at {h.tokens:,} tokens.",
            "Only one vocabulary size in this run: no vocabulary plot.",
        ),
        "peak_breakdown": Figure(
            img["peak_breakdown"],
            "what each kernel's peak is made of",
            "Bytes live at each kernel's peak, by what they are. The input logits and their "
            "gradient are the floor; float32 [B,S,V] blocks are what chunking removes.",
            "No trace at the largest case: no breakdown.",
        ),
        "timeline": Figure(
            img["timeline"],
            "memory timeline per kernel",
            "Live bytes through forward and backward (shaded), each float32 [B,S,V] block "
            "as a labelled band with the op that made it. The triangle marks the peak.",
            "No trace at the largest case: no timeline.",
        ),
        "numerics": Figure(
            img["numerics"],
            "worst deviation from float64 per kernel and dtype",
            "The largest absolute difference from a float64 reference, forward (log-probs) and "
            "backward (gradient), at a small shape on CPU.",
            "No numerics in this run (swept with --no-verify).",
        ),
    }


@dataclass(frozen=True)
class _Layout:
    shape: str
    lines: list[str]
    budget: str


@dataclass(frozen=True)
class _Answer:
    shape: str
    where: str
    lines: list[str]
    budget: str
    why: str | None
    layouts: list[_Layout]  # the same answer at every other tp/cp of the largest case


def _answer(
    h: Headline, device_name: str, table: pd.DataFrame, others: Sequence[Headline] = ()
) -> _Answer:
    lines = recommendation(h)
    # The answer covers every layout; the plots and kernel lines stay at the first one.
    also = (
        other_slices(table, h, subject="The plots and the kernel-by-kernel lines are")
        if others
        else other_slices(table, h)
    )
    where = (
        "simulated exactly on meta tensors" if h.device == "meta" else f"measured on {device_name}"
    )
    return _Answer(
        shape=shape_text(h),
        where=where,
        lines=[*lines, also] if also else lines,
        budget=budget_sentence(h),
        why=why_sentence(h),
        layouts=[_Layout(shape_text(o), recommendation(o), _layout_budget(o)) for o in others],
    )


def _layout_budget(h: Headline) -> str:
    """Said once at the top when there is no budget; each layout repeats only a verdict."""
    if h.budget_bytes is None and not any(k.status == "oom" for k in h.kernels):
        return ""
    return budget_sentence(h)


@dataclass(frozen=True)
class _KernelLine:
    head: str
    rest: str
    ok: bool
    summary: str


def _kernel_lines(h: Headline) -> list[_KernelLine]:
    out = []
    for k in h.kernels:
        head, rest = kernel_line_parts(k, h)
        out.append(_KernelLine(head, rest, k.ok, k.summary))
    return out


def _evidence(evidence: tuple[Evidence, ...]) -> dict[str, Any]:
    """Where each kernel's trace came from, and what could not be shown."""
    snap = [e.kernel for e in evidence if e.snapshot is not None]
    sources = ""
    if snap:
        sources = f"the run's allocator snapshots (snapshots/, one per case) for {', '.join(snap)}"
    problems = [f"{e.kernel}: {p}" for e in evidence for p in e.problems]
    return {"sources": sources, "problems": problems}


@dataclass(frozen=True)
class _Attribution:
    kernel: str
    flag: str
    open: bool
    view: FindingsView


def _attribution(evidence: tuple[Evidence, ...], case: Case) -> list[_Attribution]:
    out = []
    for e in evidence:
        if e.findings is None:
            continue
        big = any(
            f.live_at_peak and f.dtype is not None and case.is_fp32_bsv(f.size, f.dtype)
            for f in e.findings.findings
        )
        flag = " — float32 [B,S,V] blocks at the peak" if big else ""
        out.append(_Attribution(e.kernel, flag, big, findings_view(e.findings)))
    return out


_ORDER = ["batch", "dtype", "tp", "cp", "vocab", "tokens"]


def _peak_vs_reference(saving: Any) -> Cell:
    """This peak over the reference's, the direction the terminal table reads."""
    if missing(saving) or not saving:
        return Cell("-", None, numeric=True)
    ratio = 1 / float(saving)
    return Cell(f"{ratio:.2f}×", ratio, numeric=True)


def _results(results: pd.DataFrame, page_dir: Path, run_dir: Path) -> dict[str, Any]:
    """Every case; ``results`` has the ratios (the page model's table)."""
    rows = results.sort_values(_ORDER, kind="stable")
    cols: list[tuple[str, bool, Any]] = [
        ("kernel", False, lambda r: Cell(str(r.kernel))),
        ("tokens", True, lambda r: number_cell(r.tokens, ",")),
        ("vocab", True, lambda r: number_cell(r.vocab, ",")),
        ("batch", True, lambda r: number_cell(r.batch, ",")),
        ("dtype", False, lambda r: Cell(str(r.dtype))),
        ("chunk", True, lambda r: number_cell(r.chunk_size, ",.0f")),
        ("tp", True, lambda r: number_cell(r.tp, "d")),
        ("cp", True, lambda r: number_cell(r.cp, "d")),
        ("status", False, lambda r: Cell(str(r.status))),
        ("peak", True, lambda r: bytes_cell(r.peak_bytes)),
        ("floor", True, lambda r: bytes_cell(r.floor_bytes)),
        ("peak / floor", True, lambda r: number_cell(r.peak_over_floor, ".2f", "×")),
        ("peak vs unchunked", True, lambda r: _peak_vs_reference(r.saving_vs_unchunked)),
        ("fp32 [B,S,V] at peak", True, lambda r: number_cell(r.big_fp32_blocks, ".0f")),
        ("forward peak", True, lambda r: bytes_cell(r.forward_peak_bytes)),
        ("backward peak", True, lambda r: bytes_cell(r.backward_peak_bytes)),
        ("reserved peak", True, lambda r: bytes_cell(r.reserved_peak_bytes)),
        ("forward s", True, lambda r: number_cell(r.fwd_time_s, ".4f")),
        ("backward s", True, lambda r: number_cell(r.bwd_time_s, ".4f")),
        ("max |err| fwd", True, lambda r: number_cell(r.max_abs_err_fwd, ".1e")),
        ("max |err| bwd", True, lambda r: number_cell(r.max_abs_err_bwd, ".1e")),
        ("note", False, lambda r: Cell("" if missing(r.note) else str(r.note))),
        ("snapshot", False, lambda r: _snapshot_cell(r.snapshot, page_dir, run_dir)),
    ]
    source = {
        "chunk": "chunk_size",
        "reserved peak": "reserved_peak_bytes",
        "forward s": "fwd_time_s",
        "backward s": "bwd_time_s",
        "max |err| fwd": "max_abs_err_fwd",
        "max |err| bwd": "max_abs_err_bwd",
        "note": "note",
        "snapshot": "snapshot",
        "tp": "tp",
        "cp": "cp",
    }
    dropped = []
    keep = []
    for title, numeric, make in cols:
        column = source.get(title)
        if column is not None and _uninformative(rows[column], column):
            dropped.append(title)
            continue
        keep.append((title, numeric, make))
    body = [[make(r) for _, _, make in keep] for r in rows.itertuples(index=False)]
    classes = ["" if r.status == "ok" else "bad" for r in rows.itertuples(index=False)]
    table = Table([(t, n) for t, n, _ in keep], body, sortable=True, row_classes=classes)
    return {"count": f"{len(rows):,}", "dropped": ", ".join(dropped), "table": table}


def _uninformative(values: pd.Series, column: str) -> bool:
    present = values.dropna()
    present = present[present.astype(str) != ""]
    if present.empty:
        return True
    return column in ("tp", "cp") and set(present.astype(int)) == {1}


def _snapshot_cell(value: Any, page_dir: Path, run_dir: Path) -> Cell:
    if missing(value) or not value:
        return Cell("")
    return Cell("pickle", value, href=relative_href(run_dir / value, page_dir))


def _run_metadata(
    meta: dict[str, Any], frame: pd.DataFrame, h: Headline, run_dir: Path
) -> list[tuple[str, Any]]:
    planned = len(meta.get("cases") or [])
    statuses = frame["status"].value_counts().to_dict()
    counts = ", ".join(f"{n:,} {s}" for s, n in statuses.items())
    budget = None
    if h.budget_bytes is not None:
        budget = f"{format_bytes(h.budget_bytes)} ({h.budget_source})"
    pairs = [
        ("run directory", str(run_dir)),
        ("command", meta.get("command")),
        ("started", meta.get("started")),
        ("device", f"{meta.get('device', '?')}: {meta.get('device_name', '?')}"),
        ("memprobe", meta.get("memprobe_version")),
        ("torch", meta.get("torch_version")),
        ("python", meta.get("python_version")),
        ("cases", f"{len(frame):,} finished of {planned:,} planned ({counts})"),
        ("memory budget", budget),
        ("re-render", f"memprobe report {shell_word(run_dir)}"),
    ]
    return [(k, v) for k, v in pairs if not missing(v) and v != ""]


def _when(started: Any) -> str:
    """'2026-11-29T19:12:17+00:00' → '2026-11-29 19:12 UTC' (as recorded when unparsable)."""
    try:
        moment = datetime.fromisoformat(str(started))
    except ValueError:
        return str(started or "")
    zone = moment.strftime("%Z") if moment.tzinfo else ""
    return moment.strftime("%Y-%m-%d %H:%M") + (f" {zone}" if zone else "")


def _plot_paths(out: Path) -> dict[str, Path]:
    # Beside the page; a page not named report.html prefixes its plots with its own name,
    # so two pages in one folder never overwrite each other's images.
    prefix = "" if out.name == REPORT_NAME else f"{out.stem}-"
    return {name: out.parent / f"{prefix}{name}.png" for name in PLOT_NAMES}


def write_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    *,
    budget_bytes: int | None = None,
    budget_source: str | None = None,
) -> Path:
    """Render ``report.html`` and the PNG plots for a run; return the page's path.

    ``out`` defaults to ``RUN_DIR/report.html``; the PNGs go beside the page.
    ``budget_bytes`` draws a memory budget (named ``budget_source``, default "--budget");
    without it the budget run.json records, else a cuda run's recorded GPU capacity.
    Raises :class:`UserError` for a folder that is not a run.
    """
    run_dir = Path(run_dir)
    if budget_bytes is not None and budget_bytes <= 0:
        raise UserError(
            f"a memory budget must be more than 0 bytes, got {budget_bytes}", "e.g. --budget 80GiB"
        )
    model = build_page(run_dir, budget_bytes=budget_bytes, budget_source=budget_source)
    target = Path(out) if out is not None else run_dir / REPORT_NAME
    # --out may name a folder for the page; the run's own report.html being a folder is
    # no such choice (it was written into as run/report.html/report.html): refused below.
    if out is not None and target.is_dir():
        target = target / REPORT_NAME
    if not target.parent.is_dir():
        # A file where the page's folder goes was said not to exist.
        blocked = file_in_the_way(target)
        if blocked is not None:
            raise UserError(
                f"cannot write {target}: {blocked} is a file, not a folder",
                "choose another --out, or move that file",
            )
        raise UserError(
            f"cannot write {target}: {target.parent} does not exist",
            "create it or choose another --out",
        )
    own = run_dir if out is None else None
    refuse_foreign([target], run_dir=own)  # the page first: drawing the plots takes seconds
    plots = render_plots(model)
    paths = _plot_paths(target)
    refuse_foreign([p for n, p in paths.items() if plots.images[n] is not None], run_dir=own)
    for name, path in _plot_paths(target).items():
        png = plots.images[name]
        if png is not None:
            write_atomic(path, png)
        else:
            _remove_stale_plot(path)
    return write_atomic(target, report_html(model, plots, target))


def _made_by_memprobe(path: Path) -> bool:
    head = path.read_bytes()[:4096] if path.is_file() else b""
    if path.suffix == ".png":
        return made_by_memprobe(head)
    if path.suffix == ".json":
        return _plan_rows(path)
    # Pages carry a generator tag; pages from before it, memprobe's own title.
    return b'<meta name="generator" content="memprobe">' in head or b"<title>memprobe " in head


def _plan_rows(path: Path) -> bool:
    """Whether ``path`` is a plan.json memprobe wrote: a list of the plan's rows, each
    naming its kernel and the tokens that fit (the file carries no other mark)."""
    try:
        rows = json.loads(read_regular(path, what="plan rows", max_bytes=MAX_JSON_BYTES))
    except (UserError, ValueError, RecursionError):
        return False
    return isinstance(rows, list) and all(
        isinstance(r, dict) and {"kernel", "max_tokens"} <= set(r) for r in rows
    )


def refuse_foreign(
    paths: list[Path],
    *,
    writer: str = "report",
    hint: str = "choose another --out, or move that file",
    run_dir: Path | None = None,
    instead: str = "give --out",
) -> None:
    """A page, its plots and a plan's rows replace only files memprobe wrote: a user's own
    report.html, timeline.png or plan.json in the --out folder is left alone, and nothing
    is written. ``writer`` names what would replace it.

    ``run_dir``: the paths are the run's own page and plots (no --out), written only
    inside it (``instead``: the other way out). A write goes through a link: a
    report.html or timeline.png linked out of the run (dangling, or to another run's
    page) put the page there, making the folders the link names (as results files and
    snapshots linked out are refused on resume)."""
    for path in paths:
        if run_dir is not None and leads_out(path, run_dir):
            raise UserError(
                f"{path} is a link (to {os.readlink(path)}) that leads out of the run, "
                f"and the {writer} would be written there",
                f"make it a file of the run again (remove the link), or {instead}",
            )
        if path.exists() and not _made_by_memprobe(path):
            raise UserError(
                f"{path} exists and was not written by memprobe; the {writer} would replace it",
                hint,
            )


def refuse_foreign_html(path: str | os.PathLike[str], flag: str = "--html") -> None:
    """A page given by ``--html PAGE`` replaces only a page memprobe wrote, as ``report
    --out`` and ``plan --out`` do: ``attribute s.pickle --html notes.html`` replaced the
    user's own notes without a word. Only a regular file (or a link to one) is judged: a
    device such as /dev/stdout is not a file anyone keeps."""
    target = Path(path)
    if target.is_file() and not _made_by_memprobe(target):
        raise UserError(
            f"{flag} {path} exists and was not written by memprobe; the page would replace it",
            f"choose another {flag}, or move that file",
        )


def refuse_foreign_page(run_dir: Path) -> None:
    """Before a resume runs its cases: the page it writes at the end replaces only
    memprobe's files. Checked only as the page was written, a user's report.html (or a
    folder named timeline.png) refused the page after every case had run, exit 2."""
    target = run_dir / REPORT_NAME
    refuse_foreign(
        [target, *_plot_paths(target).values()],
        hint="move that file, or resume with --no-report",
        run_dir=run_dir,
        instead="resume with --no-report",
    )


def _remove_stale_plot(path: Path) -> None:
    """A plot from an earlier render would mislead; a user's own file is left alone."""
    try:
        if made_by_memprobe(path.read_bytes()):
            path.unlink()
    except OSError:
        pass  # absent (the usual case) or unreadable: nothing of ours to remove


def title_of(run_dir: Path) -> str:
    return f"memprobe report: {run_dir.name}"


def report_html(model: Page, plots: Plots, target: Path) -> str:
    h, meta, table, run_dir = model.headline, model.meta, model.table, model.run_dir
    return render_page(
        "report.html",
        title=title_of(run_dir),
        sortable=True,
        cases=f"{len(table):,}",
        device_name=model.device_name,
        when=_when(meta.get("started")),
        answer=_answer(h, model.device_name, table, model.other_layouts),
        kernel_lines=_kernel_lines(h),
        at=f"{h.tokens:,} tokens × {h.vocab:,} vocabulary",
        figures=_figures(plots, h),
        evidence=_evidence(model.evidence),
        attribution=_attribution(model.evidence, h.case),
        results=_results(table, target.parent, run_dir),
        run=_run_metadata(meta, table, h, run_dir),
    )


__all__ = ["PLOT_NAMES", "REPORT_NAME", "write_report"]
