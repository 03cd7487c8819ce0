from __future__ import annotations

import base64
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes
from memprobe.kernels import get_spec
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.records import Case
from memprobe.render import write_report
from memprobe.render.attribute_page import write_attribute_page
from memprobe.render.png import PLOT_NAMES
from memprobe.report.breakdown import CATEGORIES, FP32_BSV, breakdown
from memprobe.report.headline import make_headline, peak_ratio, times, vs_reference
from memprobe.report.trace import from_snapshot
from memprobe.results import read_results, read_run_meta
from memprobe.sweep import plan_cases, run_sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE = "<script>alert(1)</script>"
BUDGET = 3 * 2**30


class _Page(HTMLParser):
    """Collects what a page references and its visible text."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.scripts += tag == "script"
        self.refs += [v or "" for k, v in attrs if k in ("src", "href", "action", "srcset")]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real sweep on meta: 3 token counts × 2 vocabularies × every kernel."""
    run_dir = tmp_path_factory.mktemp("report") / "run"
    run_sweep(
        plan_cases(tokens=[4096], vocab=[32768], ladder=True),
        run_dir,
        command="memprobe sweep --tokens 4096",
    )
    return run_dir


@pytest.fixture(scope="module")
def page(run: Path) -> str:
    return write_report(run, budget_bytes=BUDGET).read_text(encoding="utf-8")


def largest(run: Path) -> dict[str, dict]:
    frame = read_results(run)
    top = frame[
        (frame["tokens"] == frame["tokens"].max()) & (frame["vocab"] == frame["vocab"].max())
    ]
    return {r["kernel"]: r for r in top.to_dict(orient="records")}


# -- the page ----------------------------------------------------------------
def test_page_parses_and_references_nothing_external(page: str) -> None:
    parsed = parse(page)
    assert parsed.tags[:3] == ["html", "head", "meta"]
    for ref in parsed.refs:
        assert not re.match(r"^\s*(https?:)?//", ref, re.I), ref
        assert ref.startswith(("data:image/png;base64,", "snapshots/")) or not ref, ref
    assert "@import" not in page and "url(" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert parsed.scripts == 1  # the inline table sorter, nothing else
    assert "default-src 'none'" in page  # the browser itself refuses any fetch


def test_page_leads_with_the_headline_numbers(run: Path, page: str) -> None:
    rows = largest(run)
    text = " ".join(parse(page).text)
    answer = text[: text.index("What this means")]
    lowest = min(rows.values(), key=lambda r: r["peak_bytes"])
    assert f"Lowest peak: {lowest['kernel']}, {format_bytes(lowest['peak_bytes'])}" in answer
    ratio = lowest["peak_bytes"] / rows["unchunked"]["peak_bytes"]
    assert f"{peak_ratio(ratio)} unchunked's peak" in answer
    # The in-place kernel consumes the logits: the answer names the best one that does not.
    intact = [k for k in rows if not get_spec(k).consumes_logits]
    best = min(intact, key=lambda k: rows[k]["peak_bytes"])
    keep = rows[best]
    assert f"Keeping the logits intact: {best}, {format_bytes(keep['peak_bytes'])}" in answer
    over = [k for k, r in rows.items() if r["peak_bytes"] > BUDGET]
    fit = [k for k, r in rows.items() if r["peak_bytes"] <= BUDGET]
    assert f"Fit the {format_bytes(BUDGET)} budget: {', '.join(fit)}." in answer
    assert all(f"{k} (" in answer for k in over)
    for kernel, r in rows.items():
        floor = r["peak_bytes"] / r["floor_bytes"]
        assert f"{kernel}: {format_bytes(r['peak_bytes'])}" in text
        assert f"{times(floor)} its floor ({format_bytes(r['floor_bytes'])})" in text


def test_page_shows_results_metadata_and_attribution(run: Path, page: str) -> None:
    meta = read_run_meta(run)
    text = " ".join(parse(page).text)
    assert meta["command"] in text and meta["torch_version"] in text
    assert f"{len(read_results(run)):,} finished of {len(meta['cases']):,} planned" in text
    assert "Attribution at the largest case" in text
    rows = largest(run)
    unchunked = rows["unchunked"]
    shape = f"float32 [{unchunked['batch']}, {unchunked['tokens']:,}, {unchunked['vocab']:,}]"
    assert shape in text  # attribution names the float32 [B,S,V] blocks
    assert page.count("<tr") > len(read_results(run))  # every case in the table


def test_every_plot_is_a_real_png_on_disk_and_in_the_page(run: Path, page: str) -> None:
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(embedded) == len(PLOT_NAMES)
    on_disk = {}
    for name in PLOT_NAMES:
        data = (run / f"{name}.png").read_bytes()
        assert data[:8] == PNG_MAGIC
        pixels = matplotlib.image.imread(run / f"{name}.png")
        assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 400
        colours = np.unique(pixels.reshape(-1, pixels.shape[2])[::7], axis=0)
        assert len(colours) > 20, name  # drawn on, not one flat colour
        on_disk[data] = name
    assert {base64.b64decode(e) for e in embedded} == set(on_disk)


# -- hostile data ------------------------------------------------------------
def test_hostile_kernel_frame_and_command_show_as_text(run: Path, tmp_path: Path) -> None:
    from memprobe.snapshot.synthesize import synthesize_snapshot
    from memprobe.snapshot.write import write_snapshot

    hostile = tmp_path / "run"
    hostile.mkdir()
    meta = read_run_meta(run)
    meta["command"] = f"memprobe sweep --kernel '{HOSTILE}'"
    (hostile / "run.json").write_text(json.dumps(meta))
    payload = json.loads((run / "results.json").read_text())
    # Two kernels' rows beside the hostile ones: a third of the page to draw.
    payload["rows"] = [r for r in payload["rows"] if r["kernel"] in ("unchunked", "local_chunked")]
    top = max(payload["rows"], key=lambda r: (r["tokens"] * r["vocab"], r["kernel"] == "unchunked"))
    # A snapshot whose every frame is a hostile user frame, used for the unchunked case.
    case = Case(
        top["kernel"], top["batch"], top["tokens"], top["vocab"], top["dtype"], top["chunk_size"]
    )
    snap = synthesize_snapshot(simulate_tracker(case).events, case=case)
    for entry in snap["device_traces"][0]:
        entry["frames"] = [{"name": HOSTILE, "filename": "C:\\jobs\\train&<i>.py", "line": 7}]
    write_snapshot(snap, hostile / "snapshots" / "x.pickle")
    top["snapshot"] = "snapshots/x.pickle"
    payload["rows"].append(
        {**top, "case_id": "hostile", "kernel": HOSTILE, "note": HOSTILE, "snapshot": None}
    )
    # A "$" pair in a name would be mathtext to matplotlib, and a bad formula raises.
    payload["rows"].append({**top, "case_id": "mathtext", "kernel": "k $\\frac$", "snapshot": None})
    (hostile / "results.json").write_text(json.dumps(payload))
    # run.json plans every row's case, as a sweep's does (the report refuses rows it did not).
    from memprobe.results import KEY_COLUMNS

    meta["cases"] = [{k: row[k] for k in KEY_COLUMNS} for row in payload["rows"]]
    (hostile / "run.json").write_text(json.dumps(meta))

    text = write_report(hostile).read_text(encoding="utf-8")
    assert HOSTILE not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert parse(text).scripts == 1
    visible = " ".join(parse(text).text)
    assert f"train&<i>.py:7 in {HOSTILE}" in visible  # the frame, from the snapshot, as text
    assert "train&<i>" not in text
    assert (
        "Traces from the run's allocator snapshots (snapshots/, one per case) for unchunked"
        in visible
    )
    # A case without a snapshot has no trace: the page says so (the report never simulates).
    assert f"{HOSTILE}: no snapshot in the run for this case" in visible


# -- the CLI -----------------------------------------------------------------
def _two_kernels(run: Path, dest: Path) -> Path:
    """A copy of ``run`` holding two kernels' cases and rows: a page a third as costly to draw."""
    shutil.copytree(run, dest)
    kept = {"unchunked", "local_chunked"}
    for name, key in (("run.json", "cases"), ("results.json", "rows")):
        record = json.loads((dest / name).read_text())
        record[key] = [item for item in record[key] if item["kernel"] in kept]
        (dest / name).write_text(json.dumps(record))
    return dest


def test_cli_rerenders_a_run(run: Path, run_cli, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere.html"
    run = _two_kernels(run, tmp_path / "run")
    code, stdout, stderr = run_cli("report", str(run), "--out", str(out), "--budget", "80GiB")
    assert code == 0, stderr
    assert stdout.strip() == f"report: {out}"
    assert "Fit the 80.00 GiB budget" in out.read_text(encoding="utf-8")
    assert all((tmp_path / f"elsewhere-{name}.png").exists() for name in PLOT_NAMES)


@pytest.mark.parametrize(
    "args, says",
    [
        (["{missing}"], "is not a directory"),
        (["{empty}"], "is not a memprobe run"),
        (["{run}", "--budget", "lots"], "is not a size"),
        (["{run}", "--out", "{missing}/page.html"], "does not exist"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    run: Path, run_cli, tmp_path: Path, args, says
) -> None:
    fill = {"missing": tmp_path / "nope", "empty": tmp_path, "run": run}
    code, stdout, stderr = run_cli("report", *[a.format(**fill) for a in args])
    assert code == 2
    assert stderr.count("\n") == 1 and stderr.startswith("memprobe: error: ") and says in stderr
    assert "Traceback" not in stderr


def test_write_report_refuses_a_run_without_rows(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"cases": []}))
    (run_dir / "results.json").write_text(json.dumps({"columns": [], "rows": []}))
    with pytest.raises(UserError, match="no finished cases"):
        write_report(run_dir)


def test_a_narrow_run_says_what_it_cannot_draw(tmp_path: Path) -> None:
    cases = plan_cases(
        tokens=[1024, 2048], vocab=[4096], kernel=["unchunked", "local_chunked"], ladder=False
    )
    run_dir = tmp_path / "run"
    run_sweep(cases, run_dir, verify=False)
    # A plot an earlier render wrote (memprobe tags its PNGs), now stale.
    from matplotlib.figure import Figure

    from memprobe.render.canvas import to_png

    (run_dir / "peak_vs_vocab.png").write_bytes(to_png(Figure()))
    text = write_report(run_dir).read_text(encoding="utf-8")
    assert "Only one vocabulary size in this run" in text
    assert "No numerics in this run" in text
    assert "No memory budget given" in text
    assert not (run_dir / "peak_vs_vocab.png").exists()  # a stale plot is not left behind
    assert (run_dir / "peak_vs_tokens.png").read_bytes()[:8] == PNG_MAGIC


# -- the pieces --------------------------------------------------------------
@pytest.mark.parametrize(
    "kernel", ["unchunked", "naive_chunked", "local_chunked", "local_chunked_inplace"]
)
def test_breakdown_accounts_for_the_whole_peak(kernel: str) -> None:
    case = Case(kernel, 1, 2048, 32768, "bf16", 512)
    from memprobe.snapshot.synthesize import synthesize_snapshot

    tracker = simulate_tracker(case, capture_frames=False)
    b = breakdown(kernel, from_snapshot(synthesize_snapshot(tracker.events, case=case)), case)
    assert set(b.parts) == set(CATEGORIES)
    assert b.peak_bytes == tracker.peak_bytes == sum(b.parts.values())
    assert b.parts["input logits"] == case.logits_bytes
    big = sum(
        1
        for e in tracker.live_at_peak()
        if e.dtype == "torch.float32" and e.nbytes == case.fp32_bsv_bytes
    )
    assert b.fp32_bsv_count == big and b.parts[FP32_BSV] == big * case.fp32_bsv_bytes
    if kernel == "local_chunked":
        assert b.parts["gradient"] == case.logits_bytes
        assert b.parts["chunk workspace"] == 4 * 512 * 32768  # one float32 chunk


def test_the_trace_is_the_snapshot_replay_over_the_step() -> None:
    from memprobe.snapshot.replay import replay
    from memprobe.snapshot.synthesize import synthesize_snapshot

    case = Case("unchunked", 1, 1024, 8192, "bf16", 256)
    tracker = simulate_tracker(case)
    snapshot = synthesize_snapshot(tracker.events, case=case)
    trace = from_snapshot(snapshot)
    rep = replay(snapshot)
    assert trace.peak_bytes == tracker.peak_bytes == rep.peak_allocated_bytes
    assert {p for p in trace.phases} == {"setup", "forward", "backward"}
    # One lifetime per block, the replay's: the blocks live at the peak are its blocks.
    live = trace.live_at_peak()
    assert sum(b.nbytes for b in live) == trace.peak_bytes
    lives = {(b.addr, b.alloc_pos, b.free_pos) for b in rep.live_at(rep.peak_pos)}
    assert {(b.source.addr, b.source.alloc_pos, b.source.free_pos) for b in live} == lives
    assert len(trace.blocks) == len(rep.blocks)
    assert breakdown("u", trace, case).peak_bytes == tracker.peak_bytes


def test_ratios_read_as_sentences(run: Path) -> None:
    h = make_headline(read_results(run), read_run_meta(run))
    by_name = {k.kernel: k for k in h.kernels}
    assert vs_reference(by_name["unchunked"]) == "the reference"
    assert vs_reference(by_name["local_chunked"]).startswith("0.")
    assert vs_reference(by_name["filtered"]).endswith("× unchunked's peak")
    assert not vs_reference(by_name["filtered"]).startswith("0.")
    assert times(3.3295) == "3.33×" and times(1.05) == "1.05×" and times(12345) == "12,345×"
    assert h.budget_bytes is None  # a meta run has no GPU capacity to fall back on


def test_findings_page_is_self_contained(tmp_path: Path) -> None:
    from memprobe.attribute import attribute
    from memprobe.snapshot.synthesize import synthesize_snapshot

    case = Case("unchunked", 1, 1024, 8192, "bf16", 256)
    findings = attribute(
        synthesize_snapshot(simulate_tracker(case).events, case=case), vocab=8192, tokens=1024
    )
    out = write_attribute_page((findings,), tmp_path / "f.html", title=f"snapshot {HOSTILE}")
    text = out.read_text(encoding="utf-8")
    assert HOSTILE not in text and "&lt;script&gt;" in text
    parsed = parse(text)
    visible = " ".join(parsed.text)
    assert "float32 [1, 1024, 8192]" in visible
    assert f"Peak {format_bytes(findings.peak_allocated_bytes)} allocated" in visible
    assert "default-src 'none'" in text and parsed.scripts == 0
    assert not any(r.startswith(("http:", "https:", "//")) for r in parse(text).refs)


def _cuda_like(case: Case) -> tuple[dict, int]:
    """A synthesized snapshot made to look like a cuda run's: labels carry only case and
    phase, the inputs are unlabelled and made from a float32 randn temporary first."""
    from memprobe.snapshot.labels import format_label, parse_label
    from memprobe.snapshot.synthesize import synthesize_snapshot

    tracker = simulate_tracker(case)
    snap = synthesize_snapshot(tracker.events, case=case)
    trace = snap["device_traces"][0]
    for entry in trace:
        phase = parse_label(entry.pop("user_metadata", "")).get("phase")
        if phase in ("forward", "backward"):
            entry["user_metadata"] = format_label(case=case.case_id, phase=phase)
    temp = {"addr": 1 << 40, "size": case.fp32_bsv_bytes, "stream": 0, "frames": []}
    snap["device_traces"][0] = [
        {**temp, "action": "alloc"},
        {**temp, "action": "free_requested"},
        {**temp, "action": "free_completed"},
        *trace,
    ]
    return snap, tracker.peak_bytes


@pytest.mark.parametrize("kernel", ["unchunked", "local_chunked_inplace"])
def test_a_cuda_style_snapshot_reads_like_the_simulation(kernel: str) -> None:
    """Size alone finds the float32 [B,S,V] blocks and the logits, and the inputs'
    float32 temporary (bigger than the in-place kernel's whole step) is not the peak."""
    case = Case(kernel, 1, 1024, 8192, "bf16", 256)
    snap, peak = _cuda_like(case)
    trace = from_snapshot(snap)
    assert trace.peak_bytes == peak
    assert set(trace.phases) <= {"forward", "backward"}
    b = breakdown(kernel, trace, case)
    assert b.parts["input logits"] == case.logits_bytes
    assert b.fp32_bsv_count == (3 if kernel == "unchunked" else 0)


def test_a_cuda_run_uses_the_recorded_gpu_capacity_as_its_budget(run: Path) -> None:
    frame, meta = read_results(run), read_run_meta(run)
    capacity = 80 * 2**30
    cuda = {**meta, "device": "cuda", "device_memory_bytes": capacity}
    h = make_headline(frame.assign(device="cuda"), cuda)
    assert (h.budget_bytes, h.budget_source) == (capacity, "GPU capacity")
    # A run.json that says cuda over rows simulated on meta: no GPU's capacity to draw.
    simulated = make_headline(frame, cuda)
    assert (simulated.budget_bytes, simulated.budget_source) == (None, "")
    given = make_headline(frame.assign(device="cuda"), cuda, budget_bytes=2**30)
    assert (given.budget_bytes, given.budget_source) == (2**30, "--budget")


def test_every_kernel_has_its_own_look_in_the_plots() -> None:
    """The sweep's default kernels each have a colour of their own (unchunked and
    filtered_chunked once shared black); past twelve kernels the colours repeat, and
    marker and line keep the looks apart."""
    from memprobe.plan.targets import default_kernels
    from memprobe.render.style import FLOOR_STYLE, kernel_looks

    looks = kernel_looks([f"k{i}" for i in range(24)])
    assert len(set(looks.values())) == 24
    for kernels in (default_kernels([1]), default_kernels([2]), default_kernels([1], 64)):
        looks = kernel_looks(kernels)
        assert len({look.color for look in looks.values()}) == len(kernels)
    assert all(look.color != FLOOR_STYLE["color"] for look in looks.values())
