"""One direction for the peak-vs-unchunked ratio everywhere: this peak over unchunked's.

The terminal table said ``peak vs unchunked 0.36x`` while the answer above it said
``2.8× below unchunked``; terminal and HTML now read the same way (the Markdown step
summary and JUnit carry the gate's checks, no ratio to unchunked).
"""

from __future__ import annotations

import re
from html import unescape

import pytest

from memprobe.records import Case, Run
from memprobe.render.console import plain_lines
from memprobe.render.terminal import answer_lines, sweep_table
from memprobe.report.headline import make_headline, peak_ratio, vs_reference
from memprobe.results import frame_of

REF = 100 * 2**20


def _frame(peaks: dict[str, int]):
    rows = []
    for kernel, peak in peaks.items():
        case = Case(kernel, 1, 2048, 8192, "bf16", 256, 1, 1, "meta")
        rows.append(Run(case, "ok", peak_bytes=peak, floor_bytes=case.logits_bytes).row())
    return frame_of(rows)


@pytest.mark.parametrize(
    ("peak", "said"),
    [
        (REF * 30 // 100, "0.30×"),  # less memory: below 1
        (REF * 36 // 100, "0.36×"),
        (REF * 120 // 100, "1.20×"),  # more memory: above 1
        (REF * 5, "5.00×"),
        (REF // 1000, "0.001×"),
    ],
)
def test_terminal_table_answer_and_html_agree(tmp_path, peak, said):
    frame = _frame({"unchunked": REF, "local_chunked": peak})
    h = make_headline(frame, {})
    (k,) = [k for k in h.kernels if k.kernel == "local_chunked"]
    assert (
        vs_reference(k)
        == f"{said} unchunked's peak"
        == f"{peak_ratio(peak / REF)} unchunked's peak"
    )
    table = "\n".join(line for part in sweep_table(frame) for line in plain_lines(part))
    row = next(line for line in table.splitlines() if line.startswith("local_chunked"))
    assert f" {said.replace('×', 'x')} " in f"{row} " or said == "0.001×"
    answer = "\n".join(answer_lines(frame, {}, budget_bytes=None))
    if peak < REF:
        assert f"({said} unchunked's peak)" in answer
    assert not re.search(r"× (below|above) ", answer)


def test_html_uses_the_same_direction(tmp_path):
    from memprobe.render.html import PLOT_NAMES, report_html
    from memprobe.render.png import Plots
    from memprobe.report.page import build_page
    from memprobe.results import case_of, create_run_dir, rows_of, write_results

    rows = rows_of(_frame({"unchunked": REF, "local_chunked": REF * 36 // 100}))
    run = create_run_dir(tmp_path / "run", [case_of(r) for r in rows], {"device": "meta"})
    write_results(run, rows)
    page = report_html(build_page(run), Plots(dict.fromkeys(PLOT_NAMES)), run / "report.html")
    html = unescape(page)
    assert "0.36× unchunked's peak" in html and "0.36×</td>" in html
    assert not re.search(r"× (below|above) ", html) and "unchunked / peak" not in html
