"""The page model: everything a sweep report shows, computed once from a run directory.

Built from the results rows, ``run.json`` and the snapshot of each headline case
(:mod:`memprobe.report.evidence`); the HTML page and every PNG read it and
compute nothing of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from memprobe.errors import UserError
from memprobe.io.text import printable, shell_word
from memprobe.report.evidence import Evidence, gather
from memprobe.report.headline import Headline, config_slice, make_headlines
from memprobe.report.ratios import with_ratios
from memprobe.results import (
    RUN_META,
    frame_of,
    planned_cases,
    read_rows,
    read_run_meta,
    unplanned_rows,
)


@dataclass(frozen=True)
class Page:
    run_dir: Path
    meta: dict[str, Any]
    table: pd.DataFrame  # every finished row, with peak_over_floor and saving_vs_unchunked
    headline: Headline
    evidence: tuple[Evidence, ...]  # one per finished kernel at the largest case
    kernels: tuple[str, ...]  # every kernel, in the run's order (each keeps one look)
    # The headline's answer at every other parallel layout (tp, cp) of the largest case.
    other_layouts: tuple[Headline, ...] = ()

    @property
    def config(self) -> pd.DataFrame:
        """The rows in the headline's configuration (batch, dtype, tp, cp): the growth plots."""
        return config_slice(self.table, self.headline)

    @property
    def traced(self) -> tuple[Evidence, ...]:
        return tuple(e for e in self.evidence if e.trace is not None)

    @property
    def device_name(self) -> str:
        return str(self.meta.get("device_name") or self.headline.device)


def read_run(run_dir: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    if not run_dir.is_dir():
        raise UserError(
            f"{run_dir} is not a directory", "give a run directory made by `memprobe sweep`"
        )
    meta = _inert(read_run_meta(run_dir))  # read_run_meta bounds how deep this walks
    rows = read_rows(run_dir)
    _check_planned(run_dir, rows)
    frame = frame_of(rows)
    if frame.empty:
        raise UserError(
            f"{run_dir} has no finished cases to report",
            f"finish the run with `memprobe sweep --resume {shell_word(run_dir)}`",
        )
    return frame, meta


def _check_planned(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Rows of cases run.json never planned: a results.json copied in from another run.
    The page would head them with this run.json's device, GPU capacity (the default
    budget), command and date, the other run's, as --resume refuses to keep them."""
    stray = unplanned_rows(rows, planned_cases(run_dir))
    if stray:
        raise UserError(
            f"cannot report {run_dir}: results row {stray[0]} is a case its {RUN_META} "
            f"did not plan ({len(stray)} such row(s)), so the page would show another "
            "run's device, command and date for it",
            "the run directory was edited or mixed with another: report the run directory "
            "each file came from, or re-run the sweep",
        )


def _inert(value: Any) -> Any:
    """run.json's text made safe to show: every control character of every string (the
    command, the device's name, a kernel's summary) replaced by its visible escape, as
    the terminal shows them. HTML escaping alone keeps ESC, BEL and NUL in the page."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_inert(k): _inert(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_inert(v) for v in value]
    return value


def build_page(
    run_dir: Path, *, budget_bytes: int | None = None, budget_source: str | None = None
) -> Page:
    """Read a run and compute the page: ratios, the headline, each headline kernel's evidence."""
    frame, meta = read_run(run_dir)
    table = with_ratios(frame)
    headline, *others = make_headlines(
        table, meta, budget_bytes=budget_bytes, budget_source=budget_source
    )
    evidence = tuple(gather(k.row, run_dir) for k in headline.kernels if k.ok and k.row)
    return Page(
        run_dir=run_dir,
        meta=meta,
        table=table,
        headline=headline,
        evidence=evidence,
        kernels=tuple(dict.fromkeys(str(k) for k in frame["kernel"])),
        other_layouts=tuple(others),
    )
