"""The answer a report leads with: at the largest case, which kernel, how much, and why.

Everything here is computed from the results rows and ``run.json``; the page and
the plots only format it. The "largest case" is the largest B·S·V in the run, at
the dtype, tensor- and context-parallel sizes of the first case planned at that
shape (the run's order puts the first ``--dtype`` first); where several chunk
sizes ran, each kernel is shown at its lowest peak.

No kernel registry here (it would import torch): whether a kernel consumes its
logits is read from its row (a floor of the logits alone: the gradient is written
into them), and its one-line description from ``run.json``'s ``kernel_summaries``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from memprobe.io.sizes import MAX_SIZE, format_bytes
from memprobe.records import Case
from memprobe.report.ratios import HIDDEN_REFERENCE, REFERENCE, has_ratios, with_ratios
from memprobe.results import case_of, missing, rows_of
from memprobe.results_errors import recorded_budget

# Columns that define one "configuration" besides tokens and vocab.
SLICE_KEYS = ("batch", "dtype", "tp", "cp")


@dataclass(frozen=True)
class KernelResult:
    """One kernel at the largest case, with the ratios the page quotes."""

    kernel: str
    status: str
    peak_bytes: int | None
    floor_bytes: int | None
    peak_over_floor: float | None
    saving_vs_unchunked: float | None
    big_fp32_blocks: int | None
    chunk_size: int | None
    note: str
    case_id: str
    summary: str  # the registry's one-line description, as run.json recorded it ("" if not)
    consumes_logits: bool
    fits: bool | None  # against the budget; None when there is no budget
    chunk_matters: bool = False  # several chunk sizes ran and gave different peaks
    row: dict[str, Any] | None = None  # the results row it was read from (clean values)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.peak_bytes is not None

    @property
    def name(self) -> str:
        """The kernel, with the chunk size shown where the run compared several."""
        if self.chunk_matters and self.chunk_size is not None:
            return f"{self.kernel} (chunk {self.chunk_size:,})"
        return self.kernel


@dataclass(frozen=True)
class Headline:
    batch: int
    tokens: int
    vocab: int
    dtype: str
    tp: int
    cp: int
    device: str
    budget_bytes: int | None
    budget_source: str  # "--budget", budget_words(...) with --other, "GPU capacity" or ""
    kernels: tuple[KernelResult, ...]
    case: Case  # the largest case (its first kernel): the one place its shapes are computed
    # Kernels run.json planned at this shape that have no row yet (an interrupted run).
    unfinished: tuple[str, ...] = ()

    @property
    def fp32_bsv_bytes(self) -> int:
        """One float32 [B, S, V] block on one rank."""
        return self.case.fp32_bsv_bytes

    @property
    def reference(self) -> KernelResult | None:
        return next((k for k in self.kernels if k.kernel == REFERENCE and k.ok), None)

    @property
    def lowest(self) -> KernelResult | None:
        ok = [k for k in self.kernels if k.ok]
        return min(ok, key=lambda k: k.peak_bytes or 0) if ok else None

    @property
    def lowest_keeping_logits(self) -> KernelResult | None:
        ok = [k for k in self.kernels if k.ok and not k.consumes_logits]
        return min(ok, key=lambda k: k.peak_bytes or 0) if ok else None


def _float(value: Any) -> float | None:
    return None if missing(value) else float(value)


# The parallel layouts: one answer each, since each is a different question (peaks per rank).
LAYOUT_KEYS = ("tp", "cp")


def _largest(table: pd.DataFrame) -> pd.DataFrame:
    size = (
        table["batch"].astype(float) * table["tokens"].astype(float) * table["vocab"].astype(float)
    )
    return table[size == size.max()]


def layouts(table: pd.DataFrame) -> list[tuple[int, int]]:
    """Every (tp, cp) at the largest case's shape, batch and dtype, in the run's order; the
    first is the headline's."""
    keep = _at_first_shape(table)
    return list(dict.fromkeys(zip(keep["tp"].tolist(), keep["cp"].tolist(), strict=True)))


def _at_first_shape(table: pd.DataFrame) -> pd.DataFrame:
    """The largest B·S·V, at the tokens, vocab, batch and dtype of its first row."""
    largest = _largest(table)
    if "hidden" in largest and largest["hidden"].notna().any():
        # A hidden-family run over several H: its largest case is at the largest H (the
        # answer quoted the lowest peak across H as one shape's).
        hidden = pd.to_numeric(largest["hidden"], errors="coerce")
        largest = largest[hidden == hidden.max()]
    first = largest.iloc[0]
    for key in ("tokens", "vocab", "batch", "dtype"):
        largest = largest[largest[key] == first[key]]
    return largest


def headline_slice(table: pd.DataFrame, layout: tuple[int, int] | None = None) -> pd.DataFrame:
    """Rows at the largest case (all kernels and chunk sizes), at ``layout`` (tp, cp) when
    the run has it, else at the first planned; ``table`` has the ratios."""
    keep = _at_first_shape(table)
    tp, cp = layout if layout in layouts(table) else (keep.iloc[0]["tp"], keep.iloc[0]["cp"])
    return keep[(keep["tp"] == tp) & (keep["cp"] == cp)]


def other_slices(
    table: pd.DataFrame,
    h: Headline,
    *,
    keys: tuple[str, ...] = SLICE_KEYS,
    subject: str = "This summary and the plots are",
) -> str | None:
    """A sentence naming the configurations ``subject`` leaves out, or None.

    A run over several dtypes, batches or parallel sizes is summarized at one of
    them; saying which, and what else is in the table, keeps that from being silent.
    ``keys``: the configuration columns the subject is at one value of (an answer given
    for every layout leaves out no tp or cp).
    """
    shown = {k: v for k, v in {"batch": h.batch, "dtype": h.dtype, "tp": h.tp, "cp": h.cp}.items()
             if k in keys}  # fmt: skip
    others = []
    for key in keys:
        values = [v for v in dict.fromkeys(table[key].tolist()) if v != shown[key]]
        if values:
            others.append(f"{key} {', '.join(str(v) for v in values)}")
    if not others:
        return None
    at = ", ".join(f"{k} {v}" for k, v in shown.items())
    return f"{subject} at {at}; the run also has {'; '.join(others)} (see the results table)."


def config_slice(frame: pd.DataFrame, h: Headline) -> pd.DataFrame:
    """Every row in the headline's configuration (batch, dtype, tp, cp)."""
    keep = frame
    for key in SLICE_KEYS:
        keep = keep[keep[key] == getattr(h, key)]
    return keep


def _best_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A kernel's row at its lowest peak across chunk sizes (a finished row first)."""
    ok = [r for r in rows if r["status"] == "ok" and r["peak_bytes"] is not None]
    return min(ok, key=lambda r: r["peak_bytes"]) if ok else rows[0]


def consumes_logits(row: dict[str, Any]) -> bool:
    """Whether the kernel's backward writes the gradient into the logits: its floor is
    the logits alone (README: the gradient counts 0 for the in-place kernel)."""
    floor = row.get("floor_bytes")
    return floor is not None and floor == case_of(row).logits_bytes


def budget_words(budget: int, other: int) -> str:
    """Where a budget came from, as the page names it: the --budget, or, with --other, the
    subtraction (a 60 KiB figure labelled "--budget" was the 100 KiB budget less 40 KiB)."""
    if not other:
        return "--budget"
    return f"budget {format_bytes(budget)} - other {format_bytes(other)}"


def given_budget(meta: dict[str, Any], budget_bytes: int | None) -> tuple[int | None, str]:
    """The budget to mark and its words: ``budget_bytes`` (from --budget), else the one
    run.json records (the sweep's --budget less its --other), else none."""
    if budget_bytes is not None:
        return budget_bytes, "--budget"
    recorded = recorded_budget(meta)
    if recorded is None:
        return None, ""
    return recorded[0] - recorded[1], budget_words(*recorded)


def make_headlines(
    frame: pd.DataFrame,
    meta: dict[str, Any],
    *,
    budget_bytes: int | None = None,
    budget_source: str | None = None,
) -> list[Headline]:
    """One headline per parallel layout (tp, cp) at the largest case: a run over
    ``--tp 1,2,8`` asks three questions. The first is :func:`make_headline`'s."""
    table = frame if has_ratios(frame) else with_ratios(frame)
    return [
        make_headline(
            table, meta, budget_bytes=budget_bytes, budget_source=budget_source, layout=layout
        )
        for layout in layouts(table)
    ]


def make_headline(
    frame: pd.DataFrame,
    meta: dict[str, Any],
    *,
    budget_bytes: int | None = None,
    budget_source: str | None = None,
    layout: tuple[int, int] | None = None,
) -> Headline:
    """The largest case's facts; the budget is ``budget_bytes`` (named ``budget_source``,
    "--budget" when None), else the one run.json records, else the GPU's recorded capacity.

    ``frame`` is the results table, with the ratios added (added here when absent);
    ``layout`` (tp, cp) picks one parallel layout (default: the first planned).
    """
    table = frame if has_ratios(frame) else with_ratios(frame)
    rows = rows_of(headline_slice(table, layout))
    budget_bytes, source = given_budget(meta, budget_bytes)
    source = budget_source or source
    if budget_bytes is None and all(str(r["device"]) == "cuda" for r in rows):
        # Only rows measured on the GPU meet its capacity: a run.json that says cuda over
        # meta rows (edited, or two runs' files mixed) drew "the GPU's capacity" over a
        # simulation.
        budget_bytes, source = gpu_capacity(meta), "GPU capacity"
        source = source if budget_bytes is not None else ""
    summaries = meta.get("kernel_summaries")
    summaries = summaries if isinstance(summaries, dict) else {}
    results = []
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        mine = [r for r in rows if r["kernel"] == kernel]
        row = _best_row(mine)
        peak = row["peak_bytes"]
        ok = row["status"] == "ok" and peak is not None
        if row["status"] == "oom":
            fits: bool | None = False  # it ran out of memory on the device that measured it
        elif budget_bytes is not None and ok:
            fits = peak <= budget_bytes
        else:
            fits = None
        results.append(
            KernelResult(
                kernel=str(kernel),
                status=str(row["status"]),
                peak_bytes=peak,
                floor_bytes=row["floor_bytes"],
                peak_over_floor=_float(row["peak_over_floor"]),
                saving_vs_unchunked=_float(row["saving_vs_unchunked"]),
                big_fp32_blocks=row["big_fp32_blocks"],
                chunk_size=row["chunk_size"],
                note=str(row["note"] or ""),
                case_id=str(row["case_id"]),
                summary=str(summaries.get(kernel) or ""),
                consumes_logits=consumes_logits(row),
                fits=fits,
                chunk_matters=len({r["peak_bytes"] for r in mine}) > 1,
                row=row,
            )
        )
    first = rows[0]
    ran = {k.kernel for k in results}
    unfinished = tuple(k for k in _planned_at(meta, first) if k not in ran)
    return Headline(
        batch=first["batch"],
        tokens=first["tokens"],
        vocab=first["vocab"],
        dtype=str(first["dtype"]),
        tp=first["tp"],
        cp=first["cp"],
        device=str(first["device"]),
        budget_bytes=budget_bytes,
        budget_source=source,
        kernels=tuple(results),
        case=case_of(first),
        unfinished=unfinished,
    )


def _planned_at(meta: dict[str, Any], row: dict[str, Any]) -> list[str]:
    """The kernels run.json planned at ``row``'s shape and layout, in its order."""
    cases = meta.get("cases")
    shape = ("batch", "tokens", "vocab", "dtype", "tp", "cp")
    return list(
        dict.fromkeys(
            str(c.get("kernel"))
            for c in (cases if isinstance(cases, list) else [])
            if isinstance(c, dict) and all(c.get(k) == row[k] for k in shape)
        )
    )


def gpu_capacity(meta: dict[str, Any]) -> int | None:
    """The GPU's memory as run.json recorded it (cuda runs), else None."""
    if meta.get("device") != "cuda":
        return None
    value = meta.get("device_memory_bytes")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or missing(value):
        return None
    # A size of bytes a GPU can have: a tampered -1 or 10**400 (no float holds it) is no
    # capacity at all, not a budget line every kernel is over.
    return int(value) if 1 <= value <= MAX_SIZE else None


# -- sentences ------------------------------------------------------------
def times(x: float) -> str:
    """A ratio as the page writes it: 3 significant digits, then ×."""
    return f"{x:,.3g}×" if x < 1000 else f"{x:,.0f}×"


def vs_floor(x: float) -> str:
    """'1.05× its floor', or 'at its floor' when the three digits read 1."""
    return "at its floor" if times(x) == "1×" else f"{times(x)} its floor"


def vs_reference(k: KernelResult) -> str:
    s = k.saving_vs_unchunked
    if k.kernel in (REFERENCE, HIDDEN_REFERENCE):
        return "the reference"
    # The hidden family's reference is the lm_head matmul, then unchunked.
    ref = HIDDEN_REFERENCE if (k.row or {}).get("hidden") is not None else REFERENCE
    if s is None:
        return f"no {ref} run to compare with"
    if round(s, 2) == 1.0:
        return f"the same as {ref}"
    # Peak over the reference, the direction of every ratio memprobe prints (the
    # tables' "peak vs unchunked", "1.05× its floor"): below 1× is less memory.
    return f"{peak_ratio(1 / s)} {ref}'s peak"


def peak_ratio(x: float) -> str:
    """A peak over a reference peak as the tables write it: two decimals, then ×."""
    return f"{x:,.2f}×" if x >= 0.01 else f"{x:.2g}×"


def shape_text(h: Headline) -> str:
    parts = [f"{h.tokens:,} tokens × {h.vocab:,} vocabulary", f"batch {h.batch:,}", h.dtype]
    if h.tp > 1 or h.cp > 1:
        parts.append(f"tp {h.tp}, cp {h.cp} (per-rank peaks)")
    return ", ".join(parts)


def kernel_line_parts(k: KernelResult, h: Headline) -> tuple[str, str]:
    """('local_chunked: 10.27 GiB', '0.30× unchunked's peak, 1.05× its floor (…); …')."""
    if not k.ok:
        what = {"oom": "ran out of memory", "skipped": "skipped", "error": "failed"}.get(
            k.status, k.status
        )
        return f"{k.name}: {what}", k.note
    parts = [vs_reference(k)]
    if k.peak_over_floor is not None:
        parts.append(f"{vs_floor(k.peak_over_floor)} ({format_bytes(k.floor_bytes)})")
    rest = ", ".join(parts)
    if k.big_fp32_blocks:
        plural = "s" if k.big_fp32_blocks != 1 else ""
        rest += (
            f"; {k.big_fp32_blocks} float32 [B,S,V] block{plural} "
            f"({format_bytes(h.fp32_bsv_bytes)} each) live at the peak"
        )
    elif k.big_fp32_blocks == 0:
        rest += "; no float32 [B,S,V] block at the peak"
    if k.fits is not None and h.budget_bytes is not None:
        rest += "; fits the budget" if k.fits else "; does not fit the budget"
    return f"{k.name}: {format_bytes(k.peak_bytes)}", rest


def fused_sentence(h: Headline) -> str | None:
    """The hidden family's headline: the fused route against matmul + local_chunked."""
    by = {k.kernel: k for k in h.kernels if k.ok}
    fused, unfused = by.get("fused_linear_chunked"), by.get("linear_local_chunked")
    if fused is None or unfused is None:
        return None
    return (
        f"Fused: {format_bytes(fused.peak_bytes)} for fused_linear_chunked vs "
        f"{format_bytes(unfused.peak_bytes)} for matmul + local_chunked "
        "(when the logits come from an lm_head you control, fuse them)."
    )


def recommendation(h: Headline) -> list[str]:
    """The first sentences of the page: what to use at this size, and the caveat."""
    lowest, keeping = h.lowest, h.lowest_keeping_logits
    if lowest is None:
        return ["No kernel finished at this size; see the table for each one's status."]
    fused = fused_sentence(h)
    out = [
        f"Lowest peak: {lowest.name}, {format_bytes(lowest.peak_bytes)} ({vs_reference(lowest)})."
    ]
    if lowest.consumes_logits:
        out[0] = out[0][:-1] + (
            " — its backward writes the gradient into the logits, so use it when the logits "
            "are not needed after backward."
        )
        if keeping is not None:
            floor = f", {vs_floor(keeping.peak_over_floor)}" if keeping.peak_over_floor else ""
            out.append(
                f"Keeping the logits intact: {keeping.name}, {format_bytes(keeping.peak_bytes)} "
                f"({vs_reference(keeping)}{floor})."
            )
    if fused is not None:
        out.append(fused)
    if h.unfinished:
        # An interrupted run: "lowest" is among the kernels that finished, and the page led
        # with it as the answer while a kernel planned at this size had no row (only the
        # metadata's "1 finished of 2 planned" said so, at the page's end).
        out.append(
            f"Not finished at this size: {', '.join(h.unfinished)} (planned, no result; "
            "finish the run with `memprobe sweep --resume RUN_DIR`)."
        )
    return out


def budget_sentence(h: Headline) -> str:
    if h.budget_bytes is None:
        oom = [k.kernel for k in h.kernels if k.status == "oom"]
        if oom:
            return f"Ran out of memory on the device: {', '.join(oom)}."
        return (
            "No memory budget given: re-render with "
            "`memprobe report RUN_DIR --budget 80GiB` to mark what fits."
        )
    fit = [k.kernel for k in h.kernels if k.fits]
    over = [
        f"{k.kernel} ({format_bytes(k.peak_bytes) if k.ok else k.status})"
        for k in h.kernels
        if k.fits is False
    ]
    source = {"GPU capacity": "the GPU's capacity", "--budget": ""}.get(
        h.budget_source, h.budget_source
    )
    what = f"the {format_bytes(h.budget_bytes)} budget" + (f" ({source})" if source else "")
    parts = [f"Fit {what}: {', '.join(fit) if fit else 'none'}."]
    if over:
        parts.append(f"Over it: {', '.join(over)}.")
    return " ".join(parts)


def why_sentence(h: Headline) -> str | None:
    """Name the float32 [B,S,V] blocks: the difference between the kernels."""
    with_blocks = [k for k in h.kernels if k.ok and k.big_fp32_blocks]
    without = [k.kernel for k in h.kernels if k.ok and k.big_fp32_blocks == 0]
    if not with_blocks:
        return None
    shape = f"[{h.batch:,}, {h.case.local_tokens:,}, {h.case.local_vocab:,}]"
    held = ", ".join(f"{k.big_fp32_blocks} in {k.kernel}" for k in with_blocks)
    each = format_bytes(h.fp32_bsv_bytes)
    text = f"Why: float32 {shape} blocks, {each} each, live at the peak: {held}."
    if without:
        text += f" None in {', '.join(without)} (the breakdown below shows what makes their peaks)."
    return text
