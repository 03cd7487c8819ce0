"""The closing answer covers every parallel layout of the largest case, terminal and report.

A run over ``--tp 1,2,8`` used to answer for tp 1 alone and leave the rest to the table.
"""

from __future__ import annotations

import pytest

from memprobe.records import Case, Run
from memprobe.render.terminal import answer_lines
from memprobe.report.headline import layouts, make_headlines
from memprobe.results import frame_of

S, V = 4096, 32768


def _rows(pairs: list[tuple[int, int]], kernels=("distributed", "chunked_distributed")):
    rows = []
    for tp, cp in pairs:
        for i, kernel in enumerate(kernels):
            for tokens in (S // 2, S):  # a smaller shape that must not get an answer
                case = Case(kernel, 1, tokens, V, "bf16", 1024, tp, cp, "meta")
                peak = (3 - i) * case.logits_bytes  # per rank: shrinks with tp and cp
                rows.append(Run(case, "ok", peak_bytes=peak, floor_bytes=case.logits_bytes).row())
    return frame_of(rows)


LAYOUTS = {
    "tp 1,2,8": [(1, 1), (2, 1), (8, 1)],
    "tp 2,4": [(2, 1), (4, 1)],
    "cp 1,2": [(1, 1), (1, 2)],
    "tp x cp": [(1, 1), (2, 1), (1, 4), (2, 4)],
    "one layout": [(4, 2)],
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_gets_its_answer(name: str) -> None:
    pairs = LAYOUTS[name]
    frame = _rows(pairs)
    assert layouts(frame) == pairs
    lines = answer_lines(frame, {}, budget_bytes=2**30)
    heads = [line for line in lines if line.startswith("At ")]
    assert len(heads) == len(pairs)
    for head, (tp, cp) in zip(heads, pairs, strict=True):
        assert head.startswith(f"At {S:,} tokens x {V:,} vocabulary (bf16")
        assert (f", tp {tp}" in head) == (tp != 1) and (f", cp {cp}" in head) == (cp != 1)
    for h in make_headlines(frame, {}, budget_bytes=2**30):
        best = min(k.peak_bytes or 0 for k in h.kernels)
        local = Case("x", 1, S, V, "bf16", 1024, h.tp, h.cp, "meta").logits_bytes
        assert best == 2 * local  # each layout's answer is read off its own rows
    # No layout is left to "the run also has": the answer names them all.
    assert not any("the run also has tp" in line or "also has cp" in line for line in lines)


def test_one_layout_keeps_its_sentence_about_other_dtypes() -> None:
    frame = _rows([(1, 1)])
    extra = Case("distributed", 1, S, V, "fp32", 1024, 1, 1, "meta")
    rows = [*frame.to_dict(orient="records"), Run(extra, "ok", peak_bytes=10).row()]
    lines = answer_lines(frame_of(rows), {}, budget_bytes=None)
    assert lines[-1] == (
        "  This answer is at batch 1, dtype bf16, tp 1, cp 1; the run also has dtype fp32 "
        "(see the results table)."
    )


def test_several_layouts_leave_only_other_dtypes_unsaid() -> None:
    frame = _rows([(1, 1), (2, 1)])
    extra = Case("distributed", 1, S, V, "fp32", 1024, 2, 1, "meta")
    rows = [*frame.to_dict(orient="records"), Run(extra, "ok", peak_bytes=10).row()]
    lines = answer_lines(frame_of(rows), {}, budget_bytes=None)
    assert lines[-1] == (
        "  This answer is at batch 1, dtype bf16; the run also has dtype fp32 "
        "(see the results table)."
    )


def test_the_report_answers_every_layout(tmp_path) -> None:
    from memprobe.render.html import PLOT_NAMES, report_html
    from memprobe.render.png import Plots
    from memprobe.report.page import build_page
    from memprobe.results import case_of, create_run_dir, rows_of, write_results

    rows = rows_of(_rows(LAYOUTS["tp 1,2,8"]))
    run = create_run_dir(tmp_path / "run", [case_of(r) for r in rows], {"device": "meta"})
    write_results(run, rows)
    page = build_page(run, budget_bytes=2**30)
    assert [(h.tp, h.cp) for h in page.other_layouts] == [(2, 1), (8, 1)]
    # The page without its plots (drawing them is what costs time here).
    html = report_html(page, Plots(dict.fromkeys(PLOT_NAMES)), run / "report.html")
    for h in page.other_layouts:
        assert f"tp {h.tp}, cp 1 (per-rank peaks)</b>: Lowest peak: chunked_distributed" in html
    assert "The plots and the kernel-by-kernel lines are at" in html
