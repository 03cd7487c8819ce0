"""The page model: built once from a run's rows, run.json and snapshots; never simulates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memprobe.records import Case
from memprobe.render import write_report
from memprobe.report.evidence import NO_SNAPSHOT
from memprobe.report.page import build_page
from memprobe.snapshot.allocator import could_hold
from memprobe.sweep import plan_cases, run_sweep

KERNELS = ["unchunked", "local_chunked", "local_chunked_inplace"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("page") / "run"
    cases = plan_cases(tokens=[1024], vocab=[4096], kernel=KERNELS, ladder=False)
    run_sweep(cases, run_dir, verify=False)
    return run_dir


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any measuring or simulating while the report is built fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the report simulated a case")

    import memprobe.measure
    import memprobe.measure.meta_backend

    monkeypatch.setattr(memprobe.measure.meta_backend, "simulate_tracker", refuse)
    monkeypatch.setattr(memprobe.measure, "measure", refuse)


def test_evidence_comes_from_the_runs_snapshots(run: Path, no_simulation: None) -> None:
    p = build_page(run)
    assert [e.kernel for e in p.evidence] == KERNELS
    for e in p.evidence:
        assert e.snapshot == f"snapshots/{e.case.case_id}.pickle"
        assert e.trace is not None and e.breakdown is not None and e.findings is not None
        row = next(k.row for k in p.headline.kernels if k.kernel == e.kernel)
        assert row is not None and e.trace.peak_bytes == row["peak_bytes"]
        assert e.breakdown.fp32_bsv_count == row["big_fp32_blocks"]


def test_a_case_without_a_snapshot_has_no_trace_and_the_page_says_so(
    run: Path, tmp_path: Path, no_simulation: None
) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(run, bare)
    shutil.rmtree(bare / "snapshots")
    payload = json.loads((bare / "results.json").read_text())
    for row in payload["rows"]:
        row["snapshot"] = None
    (bare / "results.json").write_text(json.dumps(payload))
    p = build_page(bare)
    assert all(e.trace is None and e.problems == (NO_SNAPSHOT,) for e in p.evidence)
    text = write_report(bare).read_text(encoding="utf-8")
    assert "No trace at the largest case: no timeline." in text
    assert f"unchunked: {NO_SNAPSHOT}" in text
    assert not (bare / "timeline.png").exists()


def test_kernel_facts_come_from_the_rows_and_run_json(run: Path, tmp_path: Path) -> None:
    by_name = {k.kernel: k for k in build_page(run).headline.kernels}
    # The in-place kernel's floor is the logits alone: it consumes them.
    assert [k for k, r in by_name.items() if r.consumes_logits] == ["local_chunked_inplace"]
    assert by_name["unchunked"].summary.startswith("log_softmax(logits.float())")
    older = tmp_path / "older"
    shutil.copytree(run, older)
    meta = json.loads((older / "run.json").read_text())
    del meta["kernel_summaries"]  # a run from before summaries were recorded
    (older / "run.json").write_text(json.dumps(meta))
    assert all(k.summary == "" for k in build_page(older).headline.kernels)


def test_one_float32_bsv_test() -> None:
    case = Case("unchunked", 2, 1024, 4096, "bf16", tp=2, cp=2)
    size = case.fp32_bsv_bytes
    assert size == 2 * 512 * 2048 * 4
    assert case.is_fp32_bsv(size, "float32") and case.is_fp32_bsv(size, "torch.float32")
    assert not case.is_fp32_bsv(size, "torch.bfloat16")
    assert not case.is_fp32_bsv(size + 512, "float32")
    assert case.is_fp32_bsv(size, None) and not case.is_fp32_bsv(size + 512, None)
    assert case.is_fp32_bsv(size + 512, None, holds=could_hold)  # the allocator's rounding


def test_style_and_script_are_package_data_inlined_in_the_page() -> None:
    from importlib import resources

    from memprobe.render.templating import environment

    assets = resources.files("memprobe.render").joinpath("templates", "assets")
    css = assets.joinpath("report.css").read_text(encoding="utf-8")
    js = assets.joinpath("sort_table.js").read_text(encoding="utf-8")
    child = environment().from_string(
        '{% extends "base.html" %}{% block body %}<p>{{ x }}</p>{% endblock %}'
    )
    text = child.render(title="<t>", sortable=True, x="<b>")
    assert css.strip() in text and js.strip() in text
    assert "<title>&lt;t&gt;</title>" in text and "<p>&lt;b&gt;</p>" in text  # autoescaped
    assert "default-src 'none'" in text
    assert "<script>" not in child.render(title="t", x="")
