"""Hostile and mistaken inputs, table-driven: each gets one line on stderr and exit 2.

A row here is a defect class seen once (a traceback, a silent default, a wrong
number). Add the next hostile input of the same class as one more row.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from memprobe.errors import UserError
from memprobe.io.sizes import parse_size
from memprobe.records import Case
from memprobe.results import create_run_dir, read_rows

GOOD_ROW = {
    "case_id": "x",
    "kernel": "local_chunked",
    "batch": 1,
    "tokens": 4096,
    "vocab": 32768,
    "dtype": "bf16",
    "chunk_size": 1024,
    "tp": 1,
    "cp": 1,
    "device": "meta",
    "status": "ok",
    "peak_bytes": 1000,
    "floor_bytes": 500,
}


def results_file(tmp_path: Path, rows: object) -> Path:
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"rows": rows}), encoding="utf-8")
    return path


# -- sizes: a decimal comma, NaN and inf are refused, not misread ---------------


@pytest.mark.parametrize("text", ["1,5 MiB", "1,5GiB", "2,25 GB", "nan", "inf GiB", "1,0000 B"])
def test_size_refuses(text: str) -> None:
    with pytest.raises(UserError):
        parse_size(text)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1])
def test_size_refuses_numbers(value: float) -> None:
    with pytest.raises(UserError):
        parse_size(value)


@pytest.mark.parametrize("command", [["sweep", "--tokens", "1024", "--vocab", "1024"],
                                     ["plan", "--vocab", "1024"]])  # fmt: skip
def test_a_negative_budget_reads_the_same_everywhere(run_cli, command: list[str]) -> None:
    code, out, err = run_cli(*command, "--budget", "-1GiB")
    assert code == 2 and not out
    assert err.strip() == (
        "memprobe: error: --budget '-1GiB' is negative "
        "(give a size of more than 0 bytes, e.g. 80GiB)"
    )


def test_size_keeps_thousands_separators() -> None:
    assert parse_size("1,000 MB") == 10**9
    assert parse_size("1_000") == 1000
    assert parse_size("10.3 GiB") == int(10.3 * 2**30)


# -- the command line: one line, exit 2, nothing silently defaulted -------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sweep", "--tokens", ""], "--tokens ''"),
        (["sweep", "--kernel", ",,"], "--kernel ',,' has an empty item"),
        (["sweep", "--dtype", ","], "--dtype ',' has an empty item"),
        (["sweep", "--budget", "0"], "--budget '0' must be more than 0 bytes"),
        (["sweep", "--budget", "1,5GiB"], "a comma is not a decimal point"),
        (["sweep", "--tokns", "5"], "No such option: --tokns"),
        (["sweep", "--tokens", "x"], "'x' is not a whole number"),
        (["sweep", "--chunk-size", "2.5"], "'2.5' is not a whole number"),
    ],
)
def test_cli_mistakes_are_one_line(run_cli, args: list[str], expected: str) -> None:
    code, out, err = run_cli(*args)
    assert code == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "flags",
    [
        ["--device", "cpu"],
        ["--dtype", "fp32"],
        ["--batch", "2"],
        ["--chunk-size", "512"],
        ["--tp", "2"],
        ["--cp", "2"],
        ["--grid"],
        ["--no-ladder"],
    ],
)
def test_resume_refuses_every_shaping_flag(run_cli, tmp_path: Path, flags: list[str]) -> None:
    run = tmp_path / "run"
    code, _, err = run_cli(
        "sweep", "--no-report",
        "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
        "--device", "meta", "--out", str(run), "-q", "--no-verify",
    )  # fmt: skip
    assert code == 0, err
    code, _, err = run_cli("sweep", "--resume", str(run), *flags)
    assert code == 2 and "would be ignored" in err and flags[0] in err


def test_outputs_never_overwrite_inputs(run_cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert run_cli(
        "sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
        "--device", "meta", "--out", str(run), "-q", "--no-verify",
    )[0] == 0  # fmt: skip
    before = (run / "results.json").read_bytes()
    for args in (
        ["report", str(run), "--out", str(run / "results.json")],
        ["report", str(run), "--out", str(run / "snapshots" / "x.html")],
        ["gate", str(run), "--junit-xml", str(run / "results.json")],
    ):
        code, _, err = run_cli(*args)
        assert code == 2 and "an input of this command" in err, args
    assert (run / "results.json").read_bytes() == before


# -- results files: a tampered row is one line, never a traceback ---------------


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ("not a list", "not a memprobe results.json"),
        ([1, 2], "row 0 is a int, not an object"),
        ([{**GOOD_ROW, "peak_bytes": "lots"}], "peak_bytes 'lots' is not a whole number"),
        ([{**GOOD_ROW, "peak_bytes": -5}], "peak_bytes -5 is out of range"),
        ([{**GOOD_ROW, "peak_bytes": 10**30}], "out of range"),
        ([{k: v for k, v in GOOD_ROW.items() if k != "kernel"}], "has no kernel"),
        ([{**GOOD_ROW, "kernel": ""}], "empty kernel name"),
        ([{**GOOD_ROW, "status": "great"}], "status 'great'"),
        ([{**GOOD_ROW, "tokens": 0}], "tokens 0 is not a positive"),
        ([{**GOOD_ROW, "dtype": "int8"}], "dtype 'int8'"),
        ([{**GOOD_ROW, "fwd_time_s": "fast"}], "fwd_time_s 'fast' is not a number"),
    ],
)
def test_tampered_results_are_user_errors(tmp_path: Path, rows: object, expected: str) -> None:
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        read_rows(results_file(tmp_path, rows))


def test_a_row_without_case_id_is_still_identified(tmp_path: Path) -> None:
    row = {k: v for k, v in GOOD_ROW.items() if k != "case_id"}
    (clean,) = read_rows(results_file(tmp_path, [row]))
    assert clean["case_id"].startswith("local_chunked-b1-s4096")


def test_nan_in_results_reads_as_missing(tmp_path: Path) -> None:
    # An oom row: an ok one without its peak is refused (round 25).
    path = results_file(tmp_path, [{**GOOD_ROW, "status": "oom"}])
    path.write_text(path.read_text().replace('"peak_bytes": 1000', '"peak_bytes": NaN'))
    assert read_rows(path)[0]["peak_bytes"] is None


# -- config: NaN limits and nested lists ---------------------------------------


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("max_peak_over_floor = nan", "is not a positive number"),
        ("max_peak_over_floor = inf", "is not a positive number"),
        ("max_peak = nan", "is not a finite size"),
        ('max_peak = "1,5 MiB"', "a comma is not a decimal point"),
        ('dtype = [["bf16"]]\nmax_peak = 1', "unknown dtype"),
        ('device = [["meta"]]\nmax_peak = 1', "unknown device"),
    ],
)
def test_config_refuses(tmp_path: Path, rule: str, expected: str) -> None:
    from memprobe.config import load_config

    path = tmp_path / "pyproject.toml"
    path.write_text(
        f'[tool.memprobe.gate]\nrules = [{{ kernel = "x", {rule.replace(chr(10), ", ")} }}]\n'
    )
    with pytest.raises(UserError, match=expected):
        load_config(path)


def test_config_refuses_nested_kernel_list(tmp_path: Path) -> None:
    from memprobe.config import load_config

    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.memprobe.sweep]\ntokens = [8]\nvocab = [8]\nkernel = [["x"]]\n')
    with pytest.raises(UserError, match="unknown kernel"):
        load_config(path)


# -- run directories: of two sweeps started together, one gets the directory ----


def test_run_directory_is_claimed_exclusively(tmp_path: Path) -> None:
    target = tmp_path / "run"
    cases = [Case("unchunked", 1, 8, 8)]
    outcomes: list[str] = []
    start = threading.Barrier(8)

    def claim() -> None:
        start.wait()
        try:
            create_run_dir(target, cases, {})
            outcomes.append("won")
        except UserError:
            outcomes.append("refused")

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * 7 + ["won"]


# -- kernels: a wrong type is a ValueError like every other bad input ----------


@pytest.mark.parametrize("name", ["unchunked", "local_chunked", "local_chunked_inplace"])
@pytest.mark.parametrize("bad", [2.5, "8", True, 0])
def test_kernels_refuse_non_integer_chunk_sizes(name: str, bad: object) -> None:
    import torch

    from memprobe.kernels import get_kernel

    logits = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="chunk_size"):
        get_kernel(name)(logits, torch.zeros(1, 4, dtype=torch.long), chunk_size=bad)


@pytest.mark.parametrize(
    "name", ["unchunked", "local_chunked", "local_chunked_inplace", "local_tiled"]
)
def test_kernels_refuse_a_python_list(name: str) -> None:
    import torch

    from memprobe.kernels import get_kernel

    with pytest.raises(ValueError, match="torch tensors"):
        get_kernel(name)([[[1.0, 2.0]]], torch.zeros(1, 1, dtype=torch.long))


# -- snapshots: shared references that expand, NaN times ------------------------


def test_snapshot_of_repeated_references_is_refused_not_expanded(tmp_path: Path) -> None:
    import pickle

    from memprobe.snapshot.load import MAX_FRAMES, load_snapshot

    frames = [{"name": "f", "filename": "x.py", "line": 1}] * 1000
    entry = {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "frames": frames}
    # Pickle memoizes the one entry: a small file standing for 10^9 frames.
    trace = [entry] * (MAX_FRAMES // 1000 + 10)
    path = tmp_path / "bomb.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    assert path.stat().st_size < 2_000_000
    with pytest.raises(UserError, match="beyond the"):
        load_snapshot(path)


@pytest.mark.parametrize("t", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_times_are_dropped(t: float) -> None:
    from memprobe.snapshot.load import normalize_snapshot

    entry = {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "time_us": t}
    snap = normalize_snapshot({"segments": [], "device_traces": [[entry]]})
    assert "time_us" not in snap["device_traces"][0][0]


def test_junit_holds_control_characters(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    from memprobe.gate import Check, Verdict
    from memprobe.render.junit import write_junit

    note = "CUDA error: \x1b[31mout of memory\x1b[0m\x07"
    check = Check("rules[0]", "status", "k", "k-1", passed=False, reason=note)
    write_junit(tmp_path / "j.xml", Verdict((check,), "r", 1))
    root = ET.parse(tmp_path / "j.xml").getroot()  # parses: no raw control characters
    assert "\\x1b[31m" in ET.tostring(root, encoding="unicode")


def test_report_links_only_to_snapshot_paths(tmp_path: Path) -> None:
    row = {**GOOD_ROW, "snapshot": "javascript:alert(1)"}
    with pytest.raises(UserError, match="is not a path under snapshots/"):
        read_rows(results_file(tmp_path, [row]))
    from memprobe.render.templating import relative_href

    assert relative_href(tmp_path / "javascript:x", tmp_path) == "./javascript:x"


def test_report_leaves_a_users_own_png_alone(run_cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert run_cli(
        "sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
        "--device", "meta", "--out", str(run), "-q", "--no-verify",
    )[0] == 0  # fmt: skip
    mine = tmp_path / "pages" / "numerics.png"
    mine.parent.mkdir()
    mine.write_bytes(b"\x89PNG\r\n\x1a\n my own plot")
    code, _, err = run_cli("report", str(run), "--out", str(tmp_path / "pages" / "report.html"))
    assert code == 0, err
    assert mine.read_bytes() == b"\x89PNG\r\n\x1a\n my own plot"


# -- snapshots: a frame whose name or filename is not a string reads as "??" ----

_SENTINEL = "MEMPROBE_TEST_FRAME_SENTINEL"


def _nested_list_opcodes(depth: int) -> bytes:
    # MARK ... LIST, nested: [[[...]]] built without recursion, by pickle opcodes.
    return b"(" * depth + b"l" * depth


def _odd_frame_snapshot(tmp_path: Path, field: str, value: object) -> Path:
    import pickle
    import struct

    user = {"name": "train_step", "filename": "/home/me/train.py", "line": 61}
    odd = {**user, field: _SENTINEL if value == "deep" else value}
    frames = [{"name": "at::_ops::mm::call", "filename": "??", "line": 0}, odd, user]
    trace = []
    for i, size in enumerate((1 << 20, 2 << 20, 3 << 20)):
        addr = 0x7F00_0000_0000 + i * (4 << 20)
        trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                      "time_us": 10 + i, "frames": frames})  # fmt: skip
    trace.append({"action": "free_completed", "addr": trace[0]["addr"], "size": 1 << 20,
                  "stream": 0, "time_us": 20, "frames": frames})  # fmt: skip
    # Protocol 2 has no frames whose lengths the splice below would break.
    protocol = 2 if value == "deep" else 4
    data = pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=protocol)
    if value == "deep":  # a list nested far past the recursion limit, where a name was
        text = _SENTINEL.encode()
        data = data.replace(b"X" + struct.pack("<I", len(text)) + text, _nested_list_opcodes(5000))
    path = tmp_path / "odd.pickle"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("field", ["name", "filename"])
@pytest.mark.parametrize("value", ["deep", 7, None, [1, [2]], {"a": 1}, b"bytes", 1.5])
def test_frames_that_are_not_strings_read_as_unknown(
    run_cli, tmp_path: Path, field: str, value: object
) -> None:
    path = _odd_frame_snapshot(tmp_path, field, value)
    code, out, err = run_cli("attribute", str(path), "--top", "3")
    assert code == 0, err
    assert "peak allocated: 6.00 MiB" in out
    if field == "name":
        assert "train.py:61 in ??" in out
    code, out, err = run_cli("attribute", str(path), "--json")
    assert code == 0, err
    json.loads(out)
    if value in ("deep", None):  # the page reads the frames the text and JSON read
        assert run_cli("attribute", str(path), "--html", str(tmp_path / "odd.html"))[0] == 0
    code, out, err = run_cli("diff", str(path), str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["peak_a_bytes"] == 6 << 20


def test_gate_names_a_missing_results_path_first(run_cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no pyproject.toml here: the path is still the first problem
    code, _, err = run_cli("gate", str(tmp_path / "nosuchdir"))
    assert code == 2 and "no results at" in err
