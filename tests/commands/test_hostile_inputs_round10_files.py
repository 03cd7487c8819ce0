"""Hostile inputs, round 10 (files): snapshot pickles and run directories of legal but
strange structure. Each row is a variant of a defect class the pass found: one line and
exit 2, or a sane answer, never a number the file does not support."""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line


def _snapshot(made_run: Path) -> Path:
    return next((made_run / "snapshots").glob("*.pickle"))


def _tampered(made_run: Path, to: Path, change: Callable[[dict[str, Any]], Any]) -> Path:
    data = pickle.loads(_snapshot(made_run).read_bytes())
    change(data)
    to.write_bytes(pickle.dumps(data, protocol=4))
    return to


def _no_control_characters(text: str) -> None:
    assert not [c for c in text if ord(c) < 32 and c != "\n"], repr(text)


# -- segments that share addresses: a segment listed twice (or two files' segments merged)
# was counted twice, "peak reserved: 4.00 MiB" where the device held 2.00 MiB


def _seg(address: int, size: int = 2 << 20, device: int = 0) -> dict[str, Any]:
    block = {"address": address, "size": size, "requested_size": size, "state": "inactive"}
    return {"device": device, "address": address, "total_size": size, "blocks": [block]}


OVERLAPS: list[tuple[str, Callable[[int], list[dict[str, Any]]], int, int]] = [
    ("the same segment twice", lambda a: [_seg(a)], 1, 0),
    ("one starting inside it", lambda a: [_seg(a + 512)], 1, 0),
    ("one ending inside it", lambda a: [_seg(a - (1 << 20))], 0, 1),
    ("one inside a larger one listed first", lambda a: [_seg(a - (1 << 20), 8 << 20)], 0, 1),
]


@pytest.mark.parametrize("command", [["attribute"], ["attribute", "--replay"], ["diff"]])
@pytest.mark.parametrize(
    ("what", "extra", "later", "earlier"), OVERLAPS, ids=[o[0] for o in OVERLAPS]
)
def test_segments_that_share_addresses_are_refused(
    run_cli: Any, made_run: Path, tmp_path: Path, command: list[str],
    what: str, extra: Callable[[int], list[dict[str, Any]]], later: int, earlier: int,
) -> None:  # fmt: skip
    def change(data: dict[str, Any]) -> None:
        data["segments"] += extra(data["segments"][0]["address"])

    bad = _tampered(made_run, tmp_path / "s.pickle", change)
    args = (
        [*command, str(bad)]
        if command != ["diff"]
        else ["diff", str(_snapshot(made_run)), str(bad)]
    )
    err = one_line(*run_cli(*args))
    assert f"segments[{later}] overlaps segments[{earlier}] on device 0" in err, err


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(lambda a, size: [_seg(a + size)], id="one right after it"),
        pytest.param(lambda a, size: [_seg(a, device=1)], id="the same address on another device"),
    ],
)
def test_segments_apart_are_still_read(
    run_cli: Any, made_run: Path, tmp_path: Path, extra: Callable[[int, int], list[dict]]
) -> None:
    def change(data: dict[str, Any]) -> None:
        first = data["segments"][0]
        data["segments"] += extra(first["address"], first["total_size"])

    good = _tampered(made_run, tmp_path / "s.pickle", change)
    code, out, err = run_cli("attribute", str(good), "--device", "0")
    assert code == 0 and "peak reserved" in out, (out, err)


# -- a trace of actions memprobe does not know: each is skipped (a newer torch may add
# some), so a trace of nothing else read as a step that allocated 0 B


@pytest.mark.parametrize(
    "rename",
    [
        pytest.param(str.upper, id="upper case"),
        pytest.param(lambda a: a + " ", id="a trailing space"),
        pytest.param(lambda a: "\x1b[31m" + a, id="an escape sequence"),
        pytest.param(lambda a: a.replace("a", "\u0430").replace("e", "\u0435"), id="Cyrillic a, e"),
        pytest.param(lambda a: {"alloc": "malloc"}.get(a, "x_" + a), id="other words"),
    ],
)
@pytest.mark.parametrize("command", ["attribute", "diff", "--what-if"])
def test_a_trace_of_no_known_action_is_refused(
    run_cli: Any, made_run: Path, tmp_path: Path, rename: Callable[[str], str], command: str
) -> None:
    def change(data: dict[str, Any]) -> None:
        for entry in data["device_traces"][0]:
            entry["action"] = rename(entry["action"])

    bad = str(_tampered(made_run, tmp_path / "s.pickle", change))
    args = {
        "attribute": ["attribute", bad],
        "diff": ["diff", str(_snapshot(made_run)), bad],
        "--what-if": ["attribute", bad, "--what-if", "local_chunked"],
    }[command]
    err = one_line(*run_cli(*args))
    assert "device_traces[0] has " in err and "none is an action memprobe reads" in err, err
    _no_control_characters(err)


def test_a_trace_with_some_unknown_actions_still_reads(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    def change(data: dict[str, Any]) -> None:
        trace = data["device_traces"][0]
        trace[1:1] = [{"action": "checkpoint_marker", "stream": 0, "frames": []}] * 3

    good = _tampered(made_run, tmp_path / "s.pickle", change)
    plain = run_cli("attribute", str(_snapshot(made_run)))
    code, out, err = run_cli("attribute", str(good))
    assert code == 0, err
    peak = next(line for line in out.splitlines() if line.startswith("peak allocated"))
    assert peak.split(" at ")[0] in plain[1], (peak, plain[1])


# -- many OOMs: each was detailed by walking the trace after it (the allocator at that
# moment): 8,000 OOMs took 25 s, 50,000 over a minute, from a 3 MB file


@pytest.mark.parametrize("count", [21, 2_000])
def test_many_ooms_are_counted_and_the_first_detailed(
    made_run: Path, tmp_path: Path, count: int
) -> None:
    from memprobe.attribute.findings import MAX_OOMS_DETAILED, attribute_file

    def change(data: dict[str, Any]) -> None:
        data["device_traces"][0] += [
            {"action": "oom", "size": (1 << 30) + i, "device_free": 0, "stream": 0, "frames": []}
            for i in range(count)
        ]

    f = attribute_file(_tampered(made_run, tmp_path / "s.pickle", change))
    assert len(f.ooms) == MAX_OOMS_DETAILED and f.more_ooms == count - MAX_OOMS_DETAILED
    assert [o.requested_bytes for o in f.ooms] == [(1 << 30) + i for i in range(len(f.ooms))]
    assert any(f"{count:,} OOMs in the trace: the first 20 are detailed" in n for n in f.notes)


def test_a_few_ooms_are_each_detailed(made_run: Path, tmp_path: Path) -> None:
    from memprobe.attribute.findings import MAX_OOMS_DETAILED, attribute_file

    def change(data: dict[str, Any]) -> None:
        data["device_traces"][0] += [
            {"action": "oom", "size": 1 << 30, "device_free": 0, "stream": 0, "frames": []}
        ] * MAX_OOMS_DETAILED

    f = attribute_file(_tampered(made_run, tmp_path / "s.pickle", change))
    assert len(f.ooms) == MAX_OOMS_DETAILED and f.more_ooms == 0
    assert not any("OOMs in the trace" in n for n in f.notes)


@pytest.mark.parametrize("flag", [[], ["--json"]])
def test_many_ooms_in_the_output(
    run_cli: Any, made_run: Path, tmp_path: Path, flag: list[str]
) -> None:
    def change(data: dict[str, Any]) -> None:
        data["device_traces"][0] += [
            {"action": "oom", "size": 1 << 30, "device_free": 0, "stream": 0, "frames": []}
        ] * 500

    snap = _tampered(made_run, tmp_path / "s.pickle", change)
    code, out, err = run_cli("attribute", str(snap), *flag)
    assert code == 0 and "500 OOMs in the trace: the first 20 are detailed" in out, err
    if flag:
        lead = json.loads(out)
        assert len(lead["ooms"]) == 20 and lead["more_ooms"] == 480, lead.keys()
    else:
        assert "OOM #20 " in out and "OOM #21 " not in out


# -- a peak before the trace's first entry (blocks freed that the trace never made) read
# "at entry #-1" in the what-if and "at trace entry -1" on the page


def _frees_first(data: dict[str, Any]) -> None:
    trace = data["device_traces"][0]
    frees = [e for e in trace if e["action"].startswith("free")]
    data["device_traces"][0] = frees + [e for e in trace if not e["action"].startswith("free")]


def test_a_peak_before_the_trace_is_said_so_in_the_what_if(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    snap = _tampered(made_run, tmp_path / "s.pickle", _frees_first)
    code, out, err = run_cli("attribute", str(snap), "--what-if", "local_chunked")
    assert code == 0, err
    assert "#-1" not in out and "predicted (saves 0 B), at the start of the recorded trace" in out


def test_a_peak_before_the_trace_is_said_so_on_the_page(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    snap = _tampered(made_run, tmp_path / "s.pickle", _frees_first)
    page = tmp_path / "page.html"
    code, _, err = run_cli("attribute", str(snap), "--html", str(page))
    assert code == 0, err
    html = page.read_text()
    assert "entry -1" not in html and "at the start of the recorded trace" in html


# -- allocator_settings as recorded: its text reached the terminal raw (an OSC title, a
# screen clear, a newline forging a line of its own)


@pytest.mark.parametrize(
    ("settings", "shown"),
    [
        ({"PYTORCH_ALLOC_CONF": "\x1b]0;owned\x07"}, "PYTORCH_ALLOC_CONF=\\x1b]0;owned\\x07"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "a\nFAKE: ok"}, "PYTORCH_CUDA_ALLOC_CONF=a\\nFAKE: ok"),
        ({"max_split_size": "\x1b[2J"}, "max_split_size=\\x1b[2J"),
        ({"odd\rkey": 1}, "odd\\rkey=1"),
        ({"roundup_power2_divisions": {"\x1b[1m": 4}}, "{'\\x1b[1m': 4}"),
    ],
)
def test_allocator_settings_print_inert(
    run_cli: Any, made_run: Path, tmp_path: Path, settings: dict[str, Any], shown: str
) -> None:
    def change(data: dict[str, Any]) -> None:
        data["allocator_settings"] = settings

    code, out, err = run_cli("attribute", str(_tampered(made_run, tmp_path / "s.pickle", change)))
    assert code == 0, err
    _no_control_characters(out + err)
    assert shown in out, out


# -- a kernel name of a million characters (a tampered results.json): the legend grew the
# figure past any memory, and `report` ended in a MemoryError traceback after a minute


def test_figure_text_is_cut_to_a_label() -> None:
    from memprobe.render.canvas import MAX_LABEL, clean_text

    assert clean_text("local_chunked") == "local_chunked"
    assert clean_text("k" * MAX_LABEL) == "k" * MAX_LABEL
    cut = clean_text("k" * 10**6)
    assert len(cut) == MAX_LABEL and cut.endswith("…")
    assert clean_text("a\ud800b") == "a?b"


@pytest.mark.parametrize("length", [200, 1_000_000])
def test_a_long_kernel_name_in_results_draws(
    run_cli: Any, made_run: Path, tmp_path: Path, length: int
) -> None:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    data = json.loads((run / "results.json").read_text())
    data["rows"][0]["kernel"] = "k" * length
    (run / "results.json").write_text(json.dumps(data))
    meta = json.loads((run / "run.json").read_text())  # planned, as the report requires
    meta["cases"][0]["kernel"] = "k" * length
    (run / "run.json").write_text(json.dumps(meta))
    code, out, err = run_cli("report", str(run), "--out", str(tmp_path / "page.html"))
    assert code == 0 and "Traceback" not in err, err
    assert (tmp_path / "page.html").stat().st_size < 20 * length + 2_000_000


# -- a name the file system refuses to look at (a part past 255 bytes, a path past 4096):
# pathlib's exists() and is_dir() raise OSError(ENAMETOOLONG), and nine commands ended in
# a traceback, exit 1


def _long_paths(made_run: Path) -> list[tuple[str, Callable[[str], list[str]]]]:
    run = str(made_run)
    budget = ["--vocab", "256", "--budget", "1GiB"]
    return [
        ("report RUN_DIR", lambda p: ["report", p]),
        ("report --out", lambda p: ["report", run, "--out", p + ".html"]),
        ("gate --baseline", lambda p: ["gate", run, "--baseline", p + ".json"]),
        ("gate --config", lambda p: ["gate", run, "--config", p + ".toml"]),
        ("sweep --resume", lambda p: ["sweep", "--resume", p]),
        ("sweep --out", lambda p: ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder",
                                   "--kernel", "unchunked", "--no-verify", "-q", "--out", p]),
        ("plan --from-run", lambda p: ["plan", *budget, "--from-run", p]),
        ("plan --out", lambda p: ["plan", *budget, "--kernel", "unchunked", "--out", p]),
        ("step --config", lambda p: ["step", "--config", p, "--tokens", "64"]),
    ]  # fmt: skip


LONG_NAMES = {
    "a 300-byte name": "q" * 300,
    "a 4,500-byte path": "/".join(["d" * 200] * 22),
    "a 300-byte name in UTF-8": "é" * 150,
}


@pytest.mark.parametrize("long", list(LONG_NAMES), ids=list(LONG_NAMES))
@pytest.mark.parametrize("index", range(9), ids=lambda i: str(i))
def test_a_name_too_long_for_the_file_system_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    long: str, index: int,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    what, args = _long_paths(made_run)[index]
    err = one_line(*run_cli(*args(LONG_NAMES[long])))
    assert "File name too long" in err, (what, err)
    assert list(tmp_path.iterdir()) == [], "nothing is written"


# -- a row naming another case's snapshot (an edited row, a file copied over): the page drew
# that case's trace and breakdown as this one's, and a failing gate named its largest block


def _as_cuda(run: Path) -> None:
    """``run``'s cases and rows said to have run on cuda, whose snapshots are torch's."""
    meta = json.loads((run / "run.json").read_text())
    meta["device"] = "cuda"
    for case in meta["cases"]:
        case["device"] = "cuda"
    (run / "run.json").write_text(json.dumps(meta))
    payload = json.loads((run / "results.json").read_text())
    for row in payload["rows"]:
        row["device"] = "cuda"
    (run / "results.json").write_text(json.dumps(payload))


def _relabelled(made_run: Path, tmp_path: Path, case: str | None) -> Path:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    snap = _snapshot(run)
    data = pickle.loads(snap.read_bytes())
    if case is None:
        del data["memprobe"]  # as torch writes it (a cuda run's snapshot)
        _as_cuda(run)  # a meta case's snapshot is always memprobe's (round 33, M1)
    else:
        data["memprobe"]["case"] = case
    snap.write_bytes(pickle.dumps(data, protocol=4))
    return run


OTHER_CASES = [
    "local_chunked-b1-s64-v128-bf16-c1024-tp1-cp1-meta-00000000",
    "unchunked-b1-s128-v128-bf16-c1024-tp1-cp1-meta-51b5030b",
    "\x1b[2Jx",
]


@pytest.mark.parametrize("case", OTHER_CASES)
def test_a_snapshot_of_another_case_is_not_drawn_as_this_one(
    run_cli: Any, made_run: Path, tmp_path: Path, case: str
) -> None:
    run = _relabelled(made_run, tmp_path, case)
    page = tmp_path / "page.html"
    code, _, err = run_cli("report", str(run), "--out", str(page))
    assert code == 0, err
    from memprobe.io.text import printable

    html = page.read_text()
    assert "snapshot not used" in html and "was recorded for case" in html
    assert printable(case).replace("[", "") in html.replace("[", "")


@pytest.mark.parametrize("case", OTHER_CASES)
def test_a_failing_gate_does_not_explain_with_another_cases_snapshot(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.chdir(tmp_path)
    run = _relabelled(made_run, tmp_path, case)
    base = json.loads((run / "results.json").read_text())
    # A baseline of 1 byte throughout (one that agrees with itself: no phase above it).
    base["rows"][0].update(peak_bytes=1, forward_peak_bytes=1, backward_peak_bytes=1)
    base["rows"][0].update(floor_bytes=1)
    (tmp_path / "b.json").write_text(json.dumps(base))
    code, out, err = run_cli("gate", str(run), "--baseline", str(tmp_path / "b.json"))
    assert code == 1, (out, err)
    assert "was recorded for case" in out and "largest block" not in out, out
    _no_control_characters(out)


@pytest.mark.parametrize("case", ["own", None], ids=["its own case", "no case (torch's own)"])
def test_a_snapshot_of_its_own_case_or_of_none_is_still_read(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    case: str | None,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    own = _snapshot(made_run).stem
    run = _relabelled(made_run, tmp_path, own if case == "own" else None)
    base = json.loads((run / "results.json").read_text())
    # A baseline of 1 byte throughout (one that agrees with itself: no phase above it).
    base["rows"][0].update(peak_bytes=1, forward_peak_bytes=1, backward_peak_bytes=1)
    base["rows"][0].update(floor_bytes=1)
    (tmp_path / "b.json").write_text(json.dumps(base))
    code, out, err = run_cli("gate", str(run), "--baseline", str(tmp_path / "b.json"))
    assert code == 1 and "largest block live at the peak" in out, (out, err)
    code, _, err = run_cli("report", str(run), "--out", str(tmp_path / "page.html"))
    assert code == 0 and "snapshot not used" not in (tmp_path / "page.html").read_text()


# -- a path named on the command line reached the terminal raw in what a command says it
# read or wrote ("page: a" and a line "b.html" of its own; an escape sequence run)

# Every odd character in one name: each command echoes it once (4 names x 6 commands was
# 24 runs of the same escaping).
ODD = "a\nFAKE: passed b\x1b[2J c\rd e\u2028f"


def _echoes(made_run: Path, here: Path, odd: str) -> list[tuple[str, list[str]]]:
    run = here / f"run{odd}"
    shutil.copytree(made_run, run)
    snap = str(_snapshot(run))
    budget = ["--vocab", "256", "--budget", "8MiB", "--kernel", "local_chunked", "--no-reserved"]
    return [
        ("attribute", ["attribute", snap, "--html", str(here / f"{odd}.html")]),
        ("diff", ["diff", snap, snap]),
        ("report", ["report", str(run), "--out", str(here / f"{odd}.html")]),
        # (the baseline is the run it was copied from: the run itself is refused)
        ("gate", ["gate", str(run), "--baseline", str(made_run), "--junit-xml", str(here / odd),
                  "--update-baseline", str(here / f"{odd}.json")]),
        ("plan", ["plan", *budget, "--out", str(here / odd)]),
        # (no page: the report command above echoes a page's path)
        ("sweep", ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel",
                   "unchunked", "--no-verify", "--no-report", "--out", str(here / f"sweep{odd}")]),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "index", range(6), ids=["attribute", "diff", "report", "gate", "plan", "sweep"]
)
def test_a_path_is_echoed_inert(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: int
) -> None:
    odd = ODD
    monkeypatch.chdir(tmp_path)
    what, args = _echoes(made_run, tmp_path, odd)[index]
    code, out, err = run_cli(*args)
    assert code == 0, (what, err)
    _no_control_characters(out + err)
    assert "\u2028" not in out + err
    from memprobe.io.text import printable

    assert printable(odd) in out + err, (what, out, err)


# -- more rows (or planned cases) than any run holds: report drew 50,000 rows for over five
# minutes; a sweep refuses to plan past MAX_CASES, so no run of memprobe's holds them


def _rows(made_run: Path, count: int) -> dict[str, Any]:
    data = json.loads((made_run / "results.json").read_text())
    row = data["rows"][0]
    data["rows"] = [dict(row, tokens=64 + i, case_id="", snapshot=None) for i in range(count)]
    return data


@pytest.mark.parametrize("command", ["report", "gate", "gate --baseline", "plan --from-run"])
def test_more_rows_than_a_run_holds_are_refused(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    from memprobe.results import MAX_CASES

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    (run / "results.json").write_text(json.dumps(_rows(made_run, MAX_CASES + 1)))
    args = {
        "report": ["report", str(run), "--out", str(tmp_path / "page.html")],
        "gate": ["gate", str(run), "--baseline", str(made_run)],
        "gate --baseline": ["gate", str(made_run), "--baseline", str(run)],
        "plan --from-run": ["plan", "--vocab", "256", "--budget", "1GiB", "--from-run", str(run)],
    }[command]
    err = one_line(*run_cli(*args))
    assert f"holds {MAX_CASES + 1:,} rows; a run holds at most {MAX_CASES:,} cases" in err


def test_a_plan_of_more_cases_than_a_run_holds_is_not_resumed(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    from memprobe.results import MAX_CASES

    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    meta = json.loads((run / "run.json").read_text())
    case = meta["cases"][0]
    meta["cases"] = [dict(case, tokens=64 + i) for i in range(MAX_CASES + 1)]
    (run / "run.json").write_text(json.dumps(meta))
    err = one_line(*run_cli("sweep", "--resume", str(run), "--no-verify", "-q"))
    assert f"holds {MAX_CASES + 1:,} cases; a run holds at most {MAX_CASES:,} cases" in err


def test_a_run_of_as_many_rows_as_it_may_hold_is_read(made_run: Path, tmp_path: Path) -> None:
    from memprobe.results import MAX_CASES, read_rows

    (tmp_path / "results.json").write_text(json.dumps(_rows(made_run, MAX_CASES)))
    assert len(read_rows(tmp_path)) == MAX_CASES
