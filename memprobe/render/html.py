"""The sweep's report page: a run directory → ``report.html`` (self-contained) and the
PNG plots beside it, both rendered from one :class:`~memprobe.render.page.Page`."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from memprobe.errors import UserError
from memprobe.render.canvas import made_by_memprobe
from memprobe.render.evidence import Evidence
from memprobe.render.headline import Headline
from memprobe.render.markup import esc, figure, page, write_bytes, write_text
from memprobe.render.page import Page, build_page
from memprobe.render.png import PLOT_NAMES, Plots, render_plots
from memprobe.render.sections import (
    answer,
    attribution,
    evidence_note,
    kernel_lines,
    results_table,
    run_metadata,
)

REPORT_NAME = "report.html"


def _figures(p: Plots, h: Headline, evidence: tuple[Evidence, ...]) -> str:
    at = f"{h.tokens:,} tokens × {h.vocab:,} vocabulary"
    img = p.images
    return "\n".join(
        [
            "<h2>How memory grows</h2>",
            figure(
                img["peak_vs_tokens"],
                "peak memory against tokens",
                f"Peak per kernel as the sequence grows, at {h.vocab:,} vocabulary. Dashed: the "
                "floor (what must be resident). Log scales: equal slopes mean equal growth rates.",
                "Only one token count in this run: no tokens plot.",
            ),
            figure(
                img["peak_vs_vocab"],
                "peak memory against vocabulary",
                f"Peak per kernel as the vocabulary grows, at {h.tokens:,} tokens.",
                "Only one vocabulary size in this run: no vocabulary plot.",
            ),
            f"<h2>What makes each peak at {esc(at)}</h2>",
            figure(
                img["peak_breakdown"],
                "what each kernel's peak is made of",
                "Bytes live at each kernel's peak, by what they are. The input logits and their "
                "gradient are the floor; float32 [B,S,V] blocks are what chunking removes.",
                "No trace at the largest case: no breakdown.",
            ),
            figure(
                img["timeline"],
                "memory timeline per kernel",
                "Live bytes through forward and backward (shaded), each float32 [B,S,V] block "
                "as a labelled band with the op that made it. The triangle marks the peak.",
                "No trace at the largest case: no timeline.",
            ),
            evidence_note(evidence),
        ]
    )


def _numerics(p: Plots) -> str:
    return "<h2>Numerics</h2>" + figure(
        p.images["numerics"],
        "worst deviation from float64 per kernel and dtype",
        "The largest absolute difference from a float64 reference, forward (log-probs) and "
        "backward (gradient), at a small shape on CPU.",
        "No numerics in this run (swept with --no-verify).",
    )


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
    run_dir: str | Path, out: str | Path | None = None, *, budget_bytes: int | None = None
) -> Path:
    """Render ``report.html`` and the PNG plots for a run; return the page's path.

    ``out`` defaults to ``RUN_DIR/report.html``; the PNGs go beside the page.
    ``budget_bytes`` draws a memory budget; without it a cuda run's recorded GPU
    capacity is used. Raises :class:`UserError` for a folder that is not a run.
    """
    run_dir = Path(run_dir)
    if budget_bytes is not None and budget_bytes <= 0:
        raise UserError(
            f"a memory budget must be more than 0 bytes, got {budget_bytes}", "e.g. --budget 80GiB"
        )
    model = build_page(run_dir, budget_bytes=budget_bytes)
    target = Path(out) if out is not None else run_dir / REPORT_NAME
    if target.is_dir():
        target = target / REPORT_NAME
    if not target.parent.is_dir():
        raise UserError(
            f"cannot write {target}: {target.parent} does not exist",
            "create it or choose another --out",
        )
    plots = render_plots(model)
    for name, path in _plot_paths(target).items():
        png = plots.images[name]
        if png is not None:
            write_bytes(path, png)
        else:
            _remove_stale_plot(path)
    return write_text(target, page(title_of(run_dir), _body(model, plots, target), sortable=True))


def _remove_stale_plot(path: Path) -> None:
    """A plot from an earlier render would mislead; a user's own file is left alone."""
    try:
        if made_by_memprobe(path.read_bytes()):
            path.unlink()
    except OSError:
        pass  # absent (the usual case) or unreadable: nothing of ours to remove


def title_of(run_dir: Path) -> str:
    return f"memprobe report: {run_dir.name}"


def _body(model: Page, plots: Plots, target: Path) -> str:
    h, meta, table, run_dir = model.headline, model.meta, model.table, model.run_dir
    device_name = model.device_name
    title = title_of(run_dir)
    return "\n".join(
        [
            f"<h1>{esc(title)}</h1>",
            f'<p class="sub">Peak memory of LLM log-prob kernels (logits [B,S,V] → per-token '
            f"log-probs, forward + backward) · {len(table):,} cases · {esc(device_name)} · "
            f"{esc(_when(meta.get('started')))}</p>",
            answer(h, device_name, table),
            kernel_lines(h),
            _figures(plots, h, model.evidence),
            attribution(model.evidence, h.case),
            _numerics(plots),
            results_table(table, target.parent, run_dir),
            run_metadata(meta, table, h, run_dir),
        ]
    )


__all__ = ["PLOT_NAMES", "REPORT_NAME", "write_report"]
