"""A run directory → ``report.html`` (self-contained) and the PNG plots beside it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from memprobe.errors import UserError
from memprobe.render import plots, timeline
from memprobe.render.breakdown import CaseShape
from memprobe.render.evidence import Evidence, gather
from memprobe.render.headline import Headline, config_slice, headline_slice, make_headline
from memprobe.render.markup import esc, figure, page, write_bytes, write_text
from memprobe.render.sections import (
    answer,
    attribution,
    evidence_note,
    kernel_lines,
    results_table,
    run_metadata,
)
from memprobe.render.style import kernel_looks

REPORT_NAME = "report.html"
PLOT_NAMES = ("peak_vs_tokens", "peak_vs_vocab", "peak_breakdown", "timeline", "numerics")


@dataclass(frozen=True)
class Plots:
    """PNG bytes per plot name (None: nothing to draw for this run)."""

    images: dict[str, bytes | None]


def _read_run(run_dir: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    from memprobe.results import read_results, read_run_meta

    if not run_dir.is_dir():
        raise UserError(
            f"{run_dir} is not a directory", "give a run directory made by `memprobe sweep`"
        )
    meta = read_run_meta(run_dir)
    frame = read_results(run_dir)
    if frame.empty:
        raise UserError(
            f"{run_dir} has no finished cases to report",
            f"finish the run with `memprobe sweep --resume {run_dir}`",
        )
    return frame, meta


def _evidence(frame: pd.DataFrame, h: Headline, run_dir: Path) -> list[Evidence]:
    rows = headline_slice(frame)
    wanted = {k.case_id for k in h.kernels if k.ok}
    return [gather(row, run_dir) for _, row in rows.iterrows() if row["case_id"] in wanted]


def render_plots(frame: pd.DataFrame, h: Headline, evidence: list[Evidence]) -> Plots:
    kernels = list(dict.fromkeys(str(k) for k in frame["kernel"]))
    looks = kernel_looks(kernels)
    config = config_slice(frame, headline_slice(frame).iloc[0])
    traced = [e for e in evidence if e.trace is not None]
    shape = CaseShape.of(traced[0].case) if traced else None
    return Plots(
        {
            "peak_vs_tokens": plots.peak_vs(config, "tokens", looks, h),
            "peak_vs_vocab": plots.peak_vs(config, "vocab", looks, h),
            "peak_breakdown": plots.breakdown_bars([e.breakdown for e in traced if e.breakdown], h),
            "timeline": (
                timeline.timelines({e.kernel: e.trace for e in traced if e.trace}, shape, looks, h)
                if shape is not None
                else None
            ),
            "numerics": plots.numerics(frame, kernels),
        }
    )


def _figures(p: Plots, h: Headline, evidence: list[Evidence]) -> str:
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
    frame, meta = _read_run(run_dir)
    target = Path(out) if out is not None else run_dir / REPORT_NAME
    if target.is_dir():
        target = target / REPORT_NAME
    if not target.parent.is_dir():
        raise UserError(
            f"cannot write {target}: {target.parent} does not exist",
            "create it or choose another --out",
        )
    h = make_headline(frame, meta, budget_bytes=budget_bytes)
    evidence = _evidence(frame, h, run_dir)
    p = render_plots(frame, h, evidence)
    for name, path in _plot_paths(target).items():
        png = p.images[name]
        if png is not None:
            write_bytes(path, png)
        else:
            path.unlink(missing_ok=True)  # a stale plot from an earlier render would mislead
    device_name = str(meta.get("device_name") or h.device)
    title = f"memprobe report: {run_dir.name}"
    body = "\n".join(
        [
            f"<h1>{esc(title)}</h1>",
            f'<p class="sub">Peak memory of LLM log-prob kernels (logits [B,S,V] → per-token '
            f"log-probs, forward + backward) · {len(frame):,} cases · {esc(device_name)} · "
            f"{esc(_when(meta.get('started')))}</p>",
            answer(h, device_name),
            kernel_lines(h),
            _figures(p, h, evidence),
            attribution(evidence, h.fp32_bsv_bytes),
            _numerics(p),
            results_table(frame, target.parent, run_dir),
            run_metadata(meta, frame, h, run_dir),
        ]
    )
    return write_text(target, page(title, body, sortable=True))


__all__ = ["PLOT_NAMES", "REPORT_NAME", "write_report"]
