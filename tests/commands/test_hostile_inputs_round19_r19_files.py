"""Hostile inputs, round 19, files a user hands memprobe: snapshots written by other tools
or versions (a trace whose clock runs backwards, a file recorded without history set
beside one with it) and run folders whose run.json parses but is not the run record
memprobe writes. Each table is a variant of a defect class the pass found: a sane answer
whose every number the file supports, or one line and exit 2 that names what is wrong,
never a negative time, a peak that "vanished", or "no readable run.json" of a file that
read."""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

ADDR = 0x7F00_0000_0000
MIB = 1 << 20


def _entry(action: str, addr: int, size: int, t: int | None) -> dict[str, Any]:
    e: dict[str, Any] = {"action": action, "addr": addr, "size": size, "stream": 0}
    e["frames"] = [{"filename": "train.py", "line": 7, "name": "step"}]
    if t is not None:
        e["time_us"] = t
    return e


def _trace(times: list[int | None]) -> list[dict[str, Any]]:
    """Two blocks, each made and freed: four entries timed by ``times``."""
    a, b = ADDR, ADDR + MIB
    steps = [("alloc", a), ("alloc", b), ("free_completed", a), ("free_completed", b)]
    return [_entry(act, addr, MIB, t) for (act, addr), t in zip(steps, times, strict=True)]


def _snapshot(tmp_path: Path, trace: list[dict[str, Any]], name: str = "s.pickle") -> str:
    path = tmp_path / name
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    return str(path)


# -- a trace whose clock runs backwards (an edited file, another tool's clock): every
# moment and lifetime is a difference of two times, and attribute printed "t=+-23 us" and
# "lived -46 us". Its times are now left out, with a note why; moments are entry numbers.

BACKWARDS = {
    "every entry earlier than the one before": [4_000, 3_000, 2_000, 1_000],
    "one step back in the middle": [1_000, 2_000, 1_500, 3_000],
    "one microsecond back": [1_000, 1_000, 999, 2_000],
    "back past zero": [10, 20, -5, 30],
    "an untimed entry between": [1_000, None, 500, 2_000],
}


@pytest.mark.parametrize("times", BACKWARDS.values(), ids=BACKWARDS.keys())
def test_a_clock_running_backwards_shows_no_time(
    run_cli: Any, tmp_path: Path, times: list[int | None]
) -> None:
    code, out, err = run_cli("attribute", _snapshot(tmp_path, _trace(times)))
    assert code == 0, err
    assert "peak allocated: 2.00 MiB at entry #1" in out, out
    assert "t=+" not in out and "lived" not in out, out
    assert "the trace's clock runs backwards" in out, out


@pytest.mark.parametrize(
    "times", [[1_000, 2_000, 3_000, 4_000], [5, 5, 5, 5]], ids=["rising", "standing still"]
)
def test_a_clock_that_never_runs_backwards_still_times_the_trace(
    run_cli: Any, tmp_path: Path, times: list[int]
) -> None:
    code, out, err = run_cli("attribute", _snapshot(tmp_path, _trace(times)))
    assert code == 0 and "(t=+" in out and "clock runs backwards" not in out, (out, err)


# -- diff of a snapshot with a trace against one recorded without history (segments only,
# or torch.cuda.memory_snapshot()'s list of segments): what the segments held when the
# file was written was set beside the trace's peak as a peak, "peak: 516.76 KiB -> 0 B".
# Both must have a trace, or neither.


def _segments_only(tmp_path: Path, name: str, live: bool) -> str:
    block = {"address": ADDR, "size": 2 * MIB, "requested_size": 2 * MIB}
    block["state"] = "active_allocated" if live else "inactive"
    segment = {"device": 0, "address": ADDR, "total_size": 2 * MIB, "stream": 0}
    segment["blocks"] = [block]
    path = tmp_path / name
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [[]]}, protocol=4))
    return str(path)


def _list_of_segments(tmp_path: Path, name: str, live: bool) -> str:
    path = tmp_path / name
    data = pickle.loads(Path(_segments_only(tmp_path, name, live)).read_bytes())
    path.write_bytes(pickle.dumps(data["segments"], protocol=4))
    return str(path)


UNTRACED: dict[str, Callable[[Path, str, bool], str]] = {
    "segments, no trace": _segments_only,
    "a list of segments (torch.cuda.memory_snapshot())": _list_of_segments,
}


@pytest.mark.parametrize("live", [False, True], ids=["nothing live", "a block live"])
@pytest.mark.parametrize("side", ["A", "B"])
@pytest.mark.parametrize("make", UNTRACED.values(), ids=UNTRACED.keys())
def test_a_snapshot_without_history_is_not_diffed_against_a_trace(
    run_cli: Any, tmp_path: Path, make: Callable[[Path, str, bool], str], side: str, live: bool
) -> None:
    traced = _snapshot(tmp_path, _trace([1, 2, 3, 4]))
    untraced = make(tmp_path, "u.pickle", live)
    a, b = (untraced, traced) if side == "A" else (traced, untraced)
    err = one_line(*run_cli("diff", a, b))
    assert f"{side} ({untraced}) records no trace" in err, err
    assert "_record_memory_history()" in err, err


def test_two_snapshots_without_history_are_still_diffed(run_cli: Any, tmp_path: Path) -> None:
    a = _segments_only(tmp_path, "a.pickle", live=False)
    b = _segments_only(tmp_path, "b.pickle", live=True)
    code, out, err = run_cli("diff", a, b)
    assert code == 0 and "peak: 0 B -> 2.00 MiB" in out, (out, err)


# -- a run.json that parses but is not memprobe's run record: a JSON array, null or string,
# or an object without its list of cases, was "not a memprobe run (no readable run.json)"
# of a file that read; a case with a key memprobe does not write was "a case memprobe
# cannot read (case 0)" without the key; a case without its device was refused as "a case
# its run.json did not plan". Each now names what the file holds.


def _cases(change: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict], Any]:
    return lambda m: {**m, "cases": [change(dict(c)) for c in m["cases"]]}


def _without(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda c: {k: v for k, v in c.items() if k not in keys}


RUN_JSON: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "a JSON array": (lambda m: [m], "run.json holds a JSON array, not memprobe's run record"),
    "null": (lambda m: None, "run.json holds a JSON null, not"),
    "a string": (lambda m: "run", "run.json holds a JSON string, not"),
    "a number": (lambda m: 3, "run.json holds a JSON number, not"),
    "no cases": (_without("cases"), "run.json has no 'cases', where memprobe's run.json lists"),
    "cases as an object": (lambda m: {**m, "cases": {}}, "has 'cases' that is an object"),
    "a case that is a string": (
        lambda m: {**m, "cases": ["unchunked"]},
        "run.json: case 0 is a string, not an object",
    ),
    "a case with a key of a newer version": (
        _cases(lambda c: {**c, "zeta": 1}),
        "run.json: case 0 has keys memprobe does not write: 'zeta'",
    ),
    "a case with a megabyte key": (
        _cases(lambda c: {**c, "k" * 1_000_000: 1}),
        "case 0 has keys memprobe does not write: 'kkkk",
    ),
    "a case with no device": (_cases(_without("device")), "run.json: case 0 has no 'device'"),
    "a case with no tp and cp": (_cases(_without("tp", "cp")), "case 0 has no 'cp', 'tp'"),
}


def _run_with(made_run: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(edit(meta)))
    return run


@pytest.mark.parametrize("command", ["report", "resume"])
@pytest.mark.parametrize("edit, says", RUN_JSON.values(), ids=RUN_JSON.keys())
def test_a_run_json_that_is_not_the_run_record_is_named(
    run_cli: Any,
    made_run: Path,
    tmp_path: Path,
    edit: Callable[[dict[str, Any]], Any],
    says: str,
    command: str,
) -> None:
    run = _run_with(made_run, tmp_path, edit)
    args = {
        "report": ["report", str(run), "--out", str(tmp_path / "page.html")],
        "resume": ["sweep", "--resume", str(run), "-q", "--no-verify"],
    }[command]
    err = one_line(*run_cli(*args))
    assert says in err and "no readable run.json" not in err, err
    assert len(err) < 1_000, len(err)


def test_a_run_json_of_a_run_made_before_the_hidden_family_is_still_read(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _run_with(made_run, tmp_path, _cases(_without("hidden")))
    code, out, err = run_cli("report", str(run), "--out", str(tmp_path / "page.html"))
    assert code == 0 and (tmp_path / "page.html").exists(), (out, err)


# -- one of --tokens/--batch that does not divide the logits' N = B·S rows of a snapshot
# that records no case (torch's own, or a profiled step): it was dropped without a word,
# the shapes line read N alone and asked to "pass --vocab/--tokens/--batch to settle it"
# (the flag given), and --what-if simulated the loss at the file's sizes. --vocab that
# does not fit was already refused; one of these is now too. (B = 1, S = 64 here.)

LM_STEP = (
    "import torch\n"
    "def step(device):\n"
    "    emb = torch.zeros(512, 32, device=device, dtype=torch.bfloat16, requires_grad=True)\n"
    "    ids = torch.zeros(1, 64, dtype=torch.long, device=device)\n"
    "    logits = emb[ids] @ emb.t()\n"
    "    lp = torch.log_softmax(logits.float(), -1)\n"
    "    (-lp.gather(-1, ids.unsqueeze(-1)).mean()).backward()\n"
)

NOT_DIVIDING = {
    "--tokens past N": ["--tokens", "128"],
    "--tokens that is no divisor": ["--tokens", "48"],
    "--batch that is no divisor": ["--batch", "3"],
    "--batch past N": ["--batch", "128"],
    "--tokens with --what-if": ["--tokens", "100", "--what-if", "local_chunked"],
    "--batch with --vocab": ["--batch", "7", "--vocab", "512"],
}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profiled step's snapshot (its blocks labelled, no case recorded): [1, 64, 512]."""
    import sys

    from hostile import user_module

    from memprobe import cli

    here = tmp_path_factory.mktemp("lm")
    sys.path.insert(0, str(here))
    argv = sys.argv
    try:
        name = user_module(here, "lm_step", LM_STEP)
        sys.argv = ["memprobe", "profile", f"{name}:step", "--device", "meta"]
        sys.argv += ["--out", str(here / "s.pickle")]
        with pytest.raises(SystemExit) as done:
            cli.main()
        assert not done.value.code
    finally:
        sys.argv = argv
        sys.path.remove(str(here))
    return here / "s.pickle"


@pytest.mark.parametrize("flags", NOT_DIVIDING.values(), ids=NOT_DIVIDING.keys())
def test_a_size_that_does_not_divide_the_logits_rows_is_refused(
    run_cli: Any, profiled: Path, flags: list[str]
) -> None:
    err = one_line(*run_cli("attribute", str(profiled), *flags))
    assert f"{flags[0]} {int(flags[1]):,} does not divide the 64 token rows" in err, err


@pytest.mark.parametrize(
    "flags, shape",
    [
        (["--tokens", "32"], "[B=2, S=32, V=512]"),
        (["--batch", "4"], "[B=4, S=16, V=512]"),
        (["--tokens", "128", "--batch", "1"], "[B=1, S=128, V=512]"),
    ],
    ids=["a dividing --tokens", "a dividing --batch", "both (a chunked loss)"],
)
def test_sizes_that_fit_the_logits_rows_are_still_read(
    run_cli: Any, profiled: Path, flags: list[str], shape: str
) -> None:
    code, out, err = run_cli("attribute", str(profiled), *flags)
    assert code == 0 and f"shapes: logits {shape}" in out, (out, err)


# -- JSON cut inside a string (a results.json read while it was written, a config.json
# saved half): json's message ends in "at" ("Unterminated string starting at"), and the
# one line read "starting at at line 74". So did a control character in a string.

CUT_JSON = {
    "cut inside a string": ('{"rows": [{"kernel": "unch', "Unterminated string starting at line 1"),
    "a control character in a string": (
        '{"rows": ["a\x01b"]}',
        "Invalid control character at line 1 column 13",
    ),
}


@pytest.mark.parametrize("where", ["results", "baseline", "config.json"])
@pytest.mark.parametrize("text, says", CUT_JSON.values(), ids=CUT_JSON.keys())
def test_a_json_cut_inside_a_string_says_where_once(
    run_cli: Any, made_run: Path, tmp_path: Path, text: str, says: str, where: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    args = {
        "results": ["gate", str(bad), "--baseline", str(made_run)],
        "baseline": ["gate", str(made_run), "--baseline", str(bad)],
        "config.json": ["step", "--config", str(bad), "--tokens", "64"],
    }[where]
    err = one_line(*run_cli(*args))
    assert says in err and "at at" not in err, err
