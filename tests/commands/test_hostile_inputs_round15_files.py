"""Hostile inputs, round 15, files a user hands memprobe: TOML configs, run folders and the
snapshots inside them. Each table is a variant of a defect class the pass found: one
line and exit 2 (or a page that says what it left out), never a megabyte line, a
traceback, or a number the file does not support."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

BIG = "x" * 1_000_000


def _copy(made_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    return run


# -- a config's key or value quoted whole: an unknown key, a kernel, a dtype, a device or
# a limit of a megabyte (TOML strings have no length limit) made the one line a megabyte
# long; so did a rule's kernel glob that matches no case

GATE_VALUES = {
    "an unknown key": (f'"{BIG}" = 1', "unknown key 'xxxx"),
    "an unknown section": None,
    "a dtype": (f'rules = [{{ kernel = "*", dtype = "{BIG}", max_peak = "1 GiB" }}]', "dtype 'x"),
    "a device": (f'rules = [{{ kernel = "*", device = "{BIG}", max_peak = "1 GiB" }}]', "device"),
    "a max_peak": (f'rules = [{{ kernel = "*", max_peak = "{BIG}" }}]', "is not a size"),
    "a tokens filter": (
        f'rules = [{{ kernel = "*", tokens = ["{BIG}"], max_peak = "1 GiB" }}]',
        "is not a positive whole number",
    ),
    "a max_peak_over_floor": (
        f'rules = [{{ kernel = "*", max_peak_over_floor = "{BIG}" }}]',
        "is not a positive number",
    ),
    "a max_regression": (f'max_regression = "{BIG}"', "is not a percentage"),
    "a kernel glob matching nothing": (
        f'rules = [{{ kernel = "{"x" * 1000}", max_peak = "1 GiB" }}]',
        "matches no case",
    ),
    "a sweep kernel": None,
}


def _gate_config(what: str) -> str:
    if what == "an unknown section":
        return f'[tool.memprobe."{BIG}"]\na = 1\n'
    if what == "a sweep kernel":
        return (
            f'[tool.memprobe.sweep]\ntokens = [64]\nvocab = [128]\nkernel = ["{BIG}"]\n'
            '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'
        )
    text, _ = GATE_VALUES[what]  # type: ignore[misc]
    rules = "" if "rules" in text else '\nrules = [{ kernel = "*", max_peak = "1 GiB" }]'
    return f"[tool.memprobe.gate]\n{text}{rules}\n"


@pytest.mark.parametrize("what", sorted(GATE_VALUES))
def test_a_config_value_is_quoted_short(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    (here / "g.toml").write_text(_gate_config(what))
    err = one_line(*run_cli("gate", str(made_run), "--config", "g.toml"))
    says = GATE_VALUES[what][1] if GATE_VALUES[what] else "xxxx"
    assert says in err and "..." in err and len(err) < 600, err[:600]


@pytest.mark.parametrize(
    "glob", ["x" * 1001, "*" * 1_000_000, "[a]" * 300_000], ids=["1,001", "1M stars", "classes"]
)
def test_a_kernel_glob_past_a_thousand_characters_is_refused_before_matching(
    run_cli: Any, made_run: Path, here: Path, glob: str
) -> None:
    (here / "g.toml").write_text(
        f'[tool.memprobe.gate]\nrules = [{{ kernel = "{glob}", max_peak = "1 GiB" }}]\n'
    )
    err = one_line(*run_cli("gate", str(made_run), "--config", "g.toml"))
    assert f"rules[0]: 'kernel' is a glob of {len(glob):,} characters (at most 1,000)" in err


def test_a_results_kernel_name_is_quoted_short_when_no_rule_matches(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    run = _copy(made_run, here)
    payload = json.loads((run / "results.json").read_text())
    payload["rows"] = [{**r, "kernel": BIG, "case_id": None} for r in payload["rows"]]
    (run / "results.json").write_text(json.dumps(payload))
    (here / "g.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "unchunked", max_peak = "1 GiB" }]\n'
    )
    err = one_line(*run_cli("gate", str(run / "results.json"), "--config", "g.toml"))
    assert "matches no case" in err and "present: kernel xxxx" in err and len(err) < 800, err[:800]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('"max_peek" = 1', "unknown key 'max_peek'"),
        ('rules = [{ kernel = "*", dtype = "bf17", max_peak = "1 GiB" }]', "dtype 'bf17'"),
        ('rules = [{ kernel = "*", max_peak = "１ GiB" }]', "max_peak '１ GiB' is not a size"),
        ('"\\u001b]0;t\\u0007" = 1', "unknown key '\\x1b]0;t\\x07'"),
    ],
    ids=["a short key", "a short dtype", "fullwidth digits", "an escape"],
)
def test_a_short_config_value_is_still_quoted_whole(
    run_cli: Any, made_run: Path, here: Path, text: str, says: str
) -> None:
    rules = "" if "rules" in text else '\nrules = [{ kernel = "*", max_peak = "1 GiB" }]'
    (here / "g.toml").write_text(f"[tool.memprobe.gate]\n{text}{rules}\n")
    err = one_line(*run_cli("gate", str(made_run), "--config", "g.toml"))
    assert says in err and "..." not in err, err


def test_quoted_cuts_long_values_and_says_huge_ints() -> None:
    import sys

    from memprobe.io.text import quoted

    assert quoted("abc") == "'abc'" and quoted(5) == "5"
    assert quoted("y" * 100) == "'" + "y" * 56 + "..." and len(quoted("y" * 100)) == 60
    assert quoted("\x1b[2J") == "'\\x1b[2J'"
    assert quoted(_nested(100_000)) == "(a list nested too deep to show)"
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        huge = 10**5000
    finally:
        sys.set_int_max_str_digits(limit)
    assert quoted(huge) == "(an integer of 16,610 bits)"


# -- plan --from-run of a run that timed a chunk size past 2^40 (the bound --chunk-size is
# held to; no sweep runs one): 2^62 ended the plan in torch's int64 overflow, blamed on
# the kernel with a hint to sweep it; 2^40 + 1 was planned as a chunk of 516 TiB


def _timed_run(made_run: Path, tmp_path: Path, chunks: list[int]) -> Path:
    row = json.loads((made_run / "results.json").read_text())["rows"][0]
    rows = [
        {**row, "kernel": "local_chunked", "chunk_size": c, "case_id": None,
         "device": "cpu", "snapshot": None, "fwd_time_s": 0.01, "bwd_time_s": 0.02}
        for c in chunks
    ]  # fmt: skip
    run = tmp_path / "timed"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"rows": rows}))
    return run


PLAN = ["plan", "--vocab", "128", "--budget", "1GiB", "--kernel", "local_chunked"]


@pytest.mark.parametrize(
    "chunks",
    [[64, 2**62], [2**40 + 1, 64], [2**63 - 1], [2**41, 2**42]],
    ids=["2^62", "2^40 + 1", "2^63 - 1", "two past it"],
)
def test_from_run_chunk_sizes_past_the_bound_are_refused(
    run_cli: Any, made_run: Path, tmp_path: Path, chunks: list[int]
) -> None:
    run = _timed_run(made_run, tmp_path, chunks)
    err = one_line(*run_cli(*PLAN, "--from-run", str(run)))
    past = min(c for c in chunks if c > 2**40)
    assert f"--from-run {run} timed chunk_size {past:,}, beyond the largest count" in err, err
    assert "give --chunk-size" in err


def test_from_run_chunk_sizes_at_the_bound_are_compared(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _timed_run(made_run, tmp_path, [64, 2**40])
    code, out, err = run_cli(*PLAN, "--from-run", str(run), "--no-reserved")
    assert code == 0 and "local_chunked" in out and "1099511627776" in out, err


def test_an_explicit_chunk_size_leaves_the_runs_other_sizes_alone(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _timed_run(made_run, tmp_path, [64, 128, 2**62])
    code, out, err = run_cli(
        *PLAN, "--from-run", str(run), "--chunk-size", "64,128", "--no-reserved"
    )
    assert code == 0 and "measured fastest of 2 sizes" in out, (out, err)


# -- a run whose snapshot holds blocks of more than 8 EiB together (a trace's sizes may be
# up to 2^64): the page sums live bytes in int64, and `report` ended in an OverflowError
# traceback, or two blocks of 2^62 wrapped below zero unseen


def _with_allocations(made_run: Path, tmp_path: Path, sizes: list[int]) -> Path:
    run = _copy(made_run, tmp_path)
    snap = next((run / "snapshots").glob("*.pickle"))
    data = pickle.loads(snap.read_bytes())
    trace = data["device_traces"][0]
    for k, size in enumerate(sizes):
        trace.insert(2, {**trace[1], "addr": 2**40 + k, "size": size})
    snap.write_bytes(pickle.dumps(data, protocol=4))
    return run


@pytest.mark.parametrize(
    "sizes",
    [[2**64 - 1], [2**63, 2**63], [2**62, 2**62], [2**63 - 1, 1]],
    ids=["one of 2^64 - 1", "two of 2^63", "two of 2^62 (wrapped)", "8 EiB and a byte"],
)
def test_a_snapshot_of_more_than_8_eib_is_not_drawn(
    run_cli: Any, made_run: Path, tmp_path: Path, sizes: list[int]
) -> None:
    run = _with_allocations(made_run, tmp_path, sizes)
    page = tmp_path / "page.html"
    code, out, err = run_cli("report", str(run), "--out", str(page))
    assert code == 0 and not err.strip(), err
    html = page.read_text()
    assert "snapshot not used" in html and "more than 8 EiB" in html, html[-2000:]


def test_a_snapshot_just_under_8_eib_is_still_drawn(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _with_allocations(made_run, tmp_path, [2**62, 2**61])
    page = tmp_path / "page.html"
    code, _, err = run_cli("report", str(run), "--out", str(page))
    assert code == 0 and "more than 8 EiB" not in page.read_text(), err


# -- a results value quoted whole: a peak, status, dtype, device, time or snapshot of a
# megabyte (or a note of 300,000 numbers, a kernel of a million NULs, each shown as four
# characters) made report's, gate's and resume's one line megabytes long

ROW_VALUES = {
    "a peak of text": ({"peak_bytes": BIG}, "peak_bytes 'xxxx", "is not a whole number"),
    "a status": ({"status": BIG}, "status 'xxxx", "is not one of ok"),
    "a dtype": ({"dtype": BIG}, "dtype 'xxxx", "is not one of bf16"),
    "a device": ({"device": BIG}, "device 'xxxx", "is not one of meta"),
    "a time of text": ({"fwd_time_s": BIG}, "fwd_time_s 'xxxx", "is not a number"),
    "a snapshot": ({"snapshot": BIG}, "snapshot 'xxxx", "is not a path under snapshots/"),
    "a note of numbers": ({"note": [1] * 300_000}, "note [1, 1, 1", "is not text"),
    "a kernel of NULs": ({"kernel": "\0" * 1_000_000}, "kernel '\\x00\\x00", "unprintable"),
    "a peak of 4,000 digits": ({"peak_bytes": 10**4000}, "peak_bytes 1000", "out of range"),
}


@pytest.mark.parametrize("command", ["report", "gate", "sweep --resume"])
@pytest.mark.parametrize("what", sorted(ROW_VALUES))
def test_a_results_value_is_quoted_short(
    run_cli: Any, made_run: Path, here: Path, what: str, command: str
) -> None:
    change, value, says = ROW_VALUES[what]
    run = _copy(made_run, here)
    payload = json.loads((run / "results.json").read_text())
    payload["rows"][0].update(change)
    (run / "results.json").write_text(json.dumps(payload))
    (here / "g.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'
    )
    args = {
        "report": ["report", str(run), "--out", str(here / "page.html")],
        "gate": ["gate", str(run), "--config", "g.toml"],
        "sweep --resume": ["sweep", "--resume", str(run), "-q", "--no-verify", "--no-report"],
    }[command]
    err = one_line(*run_cli(*args))
    assert f"row 0 {value}" in err and says in err and len(err) < 400, err[:600]


# -- a run.json nesting lists deeper than the page walks them (an extra key of 600 levels,
# which JSON still parses): `report` ended in a RecursionError traceback, or not, as deep
# as the stack already was


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("command", ["report", "sweep --resume"])
@pytest.mark.parametrize("depth", [64, 600, 900])
def test_a_run_json_nested_too_deep_for_the_page_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, depth: int, command: str
) -> None:
    run = _copy(made_run, tmp_path)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "x": _nested(depth)}))
    before = {name: (run / name).read_bytes() for name in ("report.html", "results.json")}
    args = ["report", str(run)] if command == "report" else ["sweep", "--resume", str(run)]
    err = one_line(*run_cli(*args))
    assert f"{run / 'run.json'} nests deeper than 64 levels; memprobe's nests 3" in err, err
    assert {name: (run / name).read_bytes() for name in before} == before


def test_nesting_is_measured_without_recursion() -> None:
    from memprobe.io.codec import nests_past

    assert not nests_past({"cases": [{"kernel": "k"}]}, 3)
    assert nests_past({"cases": [{"kernel": ["k"]}]}, 3)
    assert nests_past(_nested(1_000_000), 64) and not nests_past(_nested(63), 64)


def test_a_run_json_with_a_shallow_extra_key_is_reported(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _copy(made_run, tmp_path)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "x": _nested(20)}))
    code, out, err = run_cli("report", str(run), "--out", str(tmp_path / "page.html"))
    assert code == 0 and "report:" in out, err


# -- a byte order mark (Windows editors save one): a TOML config with one was refused as
# "Invalid statement (at line 1, column 1)" of a line that looks right, where config.json's
# is read past; and past one, a byte that is not UTF-8 was named three places on
# (config.json: "byte 0x22 at offset 18" for the 0xff at 21)

BOM = b"\xef\xbb\xbf"
RULES = b'[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'


@pytest.mark.parametrize("where", ["--config", "pyproject.toml"])
@pytest.mark.parametrize("ending", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_a_toml_config_with_a_byte_order_mark_is_read(
    run_cli: Any, made_run: Path, here: Path, where: str, ending: bytes
) -> None:
    name = "g.toml" if where == "--config" else "pyproject.toml"
    (here / name).write_bytes(BOM + RULES.replace(b"\n", ending))
    args = ["gate", str(made_run), *(["--config", name] if where == "--config" else [])]
    code, out, err = run_cli(*args)
    assert code == 0 and "passed: all 1 check(s)" in out, (out, err)


HEAD = b"[tool.memprobe.gate]\n"


@pytest.mark.parametrize(
    ("data", "offset"),
    [(BOM + HEAD + b'baseline = "b\xff"\n', 37), (HEAD + b'baseline = "b\xff"\n', 34),
     (BOM + b"\xfe", 3)],
    ids=["past a mark", "no mark", "right after a mark"],
)  # fmt: skip
def test_a_byte_that_is_not_utf8_is_named_where_it_is_in_a_toml(
    run_cli: Any, made_run: Path, here: Path, data: bytes, offset: int
) -> None:
    (here / "g.toml").write_bytes(data)
    err = one_line(*run_cli("gate", str(made_run), "--config", "g.toml"))
    assert f"not UTF-8 text (byte {data[offset]:#04x} at offset {offset:,})" in err, err
    assert data[offset] in (0xFF, 0xFE)


def test_a_byte_that_is_not_utf8_is_named_where_it_is_in_a_config_json(
    run_cli: Any, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_bytes(BOM + b'{"model_type": "ll\xffama"}')
    err = one_line(*run_cli("step", "--config", str(tmp_path / "config.json"), "--tokens", "64"))
    assert "is not UTF-8 text (byte 0xff at offset 21)" in err, err


def test_utf8_text_reads_past_a_mark_and_counts_it() -> None:
    from memprobe.io.text import utf8_text

    assert utf8_text(BOM + "é".encode()) == "é" and utf8_text(b"a") == "a"
    assert utf8_text(BOM) == "" and utf8_text(BOM + BOM) == "\ufeff"
    with pytest.raises(UnicodeDecodeError) as bad:
        utf8_text(BOM + b"ab\xff")
    assert bad.value.start == 5 and bad.value.object[bad.value.start] == 0xFF


# -- a results.json that is not one was "not a memprobe results.json (point at a run
# directory)" to a user who had given the run directory, and said neither the byte that
# is not UTF-8 nor where the JSON stops

NOT_RESULTS = {
    "a byte that is not UTF-8": (
        b'{"rows": ["\xff"]}',
        "it is not UTF-8 text (byte 0xff at offset 11)",
    ),
    "one past a mark": (
        BOM + b'{"rows": ["\xff"]}',
        "it is not UTF-8 text (byte 0xff at offset 14)",
    ),
    "cut short": (b'{"rows": [}', "it is not JSON (Expecting value at line 1 column 11)"),
    "no rows": (b'{"rowz": []}', "it holds no list of 'rows'"),
    "rows not a list": (b'{"rows": {}}', "it holds no list of 'rows'"),
    "a list": (b"[]", "it holds no list of 'rows'"),
}


@pytest.mark.parametrize("given", ["the run", "its results.json", "a file elsewhere"])
@pytest.mark.parametrize("what", sorted(NOT_RESULTS))
def test_a_results_file_that_is_not_one_says_what_is_wrong(
    run_cli: Any, made_run: Path, here: Path, what: str, given: str
) -> None:
    data, says = NOT_RESULTS[what]
    run = _copy(made_run, here)
    file = run / "results.json" if given != "a file elsewhere" else here / "base.json"
    file.write_bytes(data)
    (here / "g.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'
    )
    target = run if given == "the run" else file
    err = one_line(*run_cli("gate", str(target), "--config", "g.toml"))
    assert f"{file} is not a memprobe results.json: {says}" in err, err
    hint = "re-run the sweep" if given != "a file elsewhere" else "give a run directory or its"
    assert hint in err, err


# -- a gate config of 100,000 rules (4 MB, under the 16 MiB cap): each is checked and
# printed on every case it matches, and the gate printed for minutes


@pytest.mark.parametrize("count", [1001, 20_000])
@pytest.mark.parametrize("form", ["inline", "tables"])
def test_a_gate_config_of_too_many_rules_is_refused_as_it_is_read(
    run_cli: Any, made_run: Path, here: Path, count: int, form: str
) -> None:
    rule = 'kernel = "*", max_peak = "1 GiB"'
    text = (
        "rules = [" + ",".join([f"{{ {rule} }}"] * count) + "]\n"
        if form == "inline"
        else f"[[tool.memprobe.gate.rules]]\n{rule.replace(', ', chr(10))}\n" * count
    )
    head = "[tool.memprobe.gate]\n" if form == "inline" else ""
    (here / "g.toml").write_text(head + text)
    err = one_line(*run_cli("gate", str(made_run), "--config", "g.toml"))
    assert f"tool.memprobe.gate: {count:,} rules; a gate config holds at most 1,000" in err, err


def test_a_gate_config_of_a_thousand_rules_is_read(tmp_path: Path) -> None:
    from memprobe.config import load_config

    path = tmp_path / "g.toml"
    rule = '{ kernel = "*", max_peak = "1 GiB" }'
    path.write_text("[tool.memprobe.gate]\nrules = [" + ",".join([rule] * 1000) + "]\n")
    assert len(load_config(path).gate.rules) == 1000


# -- a rule no case of the configured sweep can meet (tokens = [99] beside a sweep of 64, a
# kernel glob of none of its kernels): `memprobe gate` ran the whole sweep (hours on a
# GPU), then refused the rule


SWEEP = '[tool.memprobe.sweep]\ntokens = [64]\nvocab = [128]\nkernel = ["unchunked", "local_chunked"]\nchunk_size = [32, 64]\ndevice = "meta"\n'  # noqa: E501
NEVER = {
    "tokens": ('tokens = [99], max_peak = "1 GiB"', "(* tokens=99)"),
    "vocab": ('vocab = [256], max_peak = "1 GiB"', "(* vocab=256)"),
    "a kernel glob": ('max_peak = "1 GiB"', "(vocab_*)"),
    "dtype": ('dtype = "fp32", max_peak = "1 GiB"', "(* dtype=fp32)"),
    "batch": ('batch = [2], max_peak = "1 GiB"', "(* batch=2)"),
    "chunk_size": ('chunk_size = [128], max_peak = "1 GiB"', "(* chunk_size=128)"),
}


@pytest.mark.parametrize("what", sorted(NEVER))
def test_a_rule_no_planned_case_meets_is_refused_before_the_sweep(
    run_cli: Any, here: Path, what: str
) -> None:
    rule, shown = NEVER[what]
    kernel = "vocab_*" if what == "a kernel glob" else "*"
    (here / "pyproject.toml").write_text(
        f'{SWEEP}[tool.memprobe.gate]\nrules = [{{ kernel = "{kernel}", {rule} }}]\n'
    )
    err = one_line(*run_cli("gate"))
    assert f"rules[0] {shown} matches no case in the cases" in err, err
    assert "[tool.memprobe.sweep] plans" in err
    assert not (here / "reports").exists()  # nothing was swept


@pytest.mark.parametrize(
    "rule",
    ['kernel = "local_*", chunk_size = [64]', 'kernel = "unchunked", chunk_size = [32]',
     'kernel = "*", tokens = [64], vocab = [128], dtype = "bf16", device = "meta"'],
    ids=["a chunked kernel's second size", "unchunked at the first size", "every filter"],
)  # fmt: skip
def test_a_rule_a_planned_case_meets_is_gated_after_the_sweep(
    run_cli: Any, here: Path, rule: str
) -> None:
    (here / "pyproject.toml").write_text(
        f'{SWEEP}[tool.memprobe.gate]\nrules = [{{ {rule}, max_peak = "1 GiB" }}]\n'
    )
    code, out, err = run_cli("gate")
    assert code == 0 and "passed" in out, (out, err)


# -- a results file or baseline that is a link leading nowhere (dangling, or a loop):
# exists() follows it, so a run's was "no results at RUN" and a baseline "does not exist
# yet; make it once with --update-baseline", where the link is there to see (round 13
# named such a pyproject.toml and config.json; the results readers did not)


@pytest.mark.parametrize("to", ["gone.json", "results.json"], ids=["dangling", "a loop"])
@pytest.mark.parametrize("command", ["gate", "report", "plan --from-run"])
def test_a_runs_results_link_to_nothing_is_named(
    run_cli: Any, made_run: Path, here: Path, to: str, command: str
) -> None:
    run = _copy(made_run, here)
    (run / "results.json").unlink()
    (run / "results.json").symlink_to(to)
    (here / "g.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'
    )
    args = {
        "gate": ["gate", str(run), "--config", "g.toml"],
        "report": ["report", str(run), "--out", str(here / "page.html")],
        "plan --from-run": [*PLAN, "--from-run", str(run)],
    }[command]
    err = one_line(*run_cli(*args))
    if command == "report" and to == "results.json":
        # report checks its inputs before reading them, and names a loop as such.
        assert f"{run / 'results.json'} cannot be followed: a loop of links" in err, err
    else:
        assert f"{run / 'results.json'} is a link to {to}, which leads to no file" in err, err


@pytest.mark.parametrize("where", ["--baseline", "the config"])
def test_a_baseline_link_to_nothing_is_named_not_called_missing(
    run_cli: Any, made_run: Path, here: Path, where: str
) -> None:
    (here / "base.json").symlink_to("nowhere.json")
    args = ["gate", str(made_run)]
    if where == "--baseline":
        args += ["--baseline", "base.json"]
    else:
        (here / "g.toml").write_text('[tool.memprobe.gate]\nbaseline = "base.json"\n')
        args += ["--config", "g.toml"]
    err = one_line(*run_cli(*args))
    assert "base.json is a link to nowhere.json, which leads to no file" in err, err
    assert "does not exist yet" not in err


def test_a_baseline_link_to_a_results_file_is_read(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    # To a copy: a link to the gated run's own results is refused (it compares nothing).
    (here / "base.json").symlink_to(shutil.copy(made_run / "results.json", here / "copy.json"))
    code, out, err = run_cli("gate", str(made_run), "--baseline", "base.json")
    assert code == 0 and "passed" in out, (out, err)
