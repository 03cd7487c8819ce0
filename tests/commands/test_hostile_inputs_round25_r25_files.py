"""Hostile inputs, round 25 (r25_files), files a user hands memprobe: results and
baselines whose rows are each well formed but lie (a finished case with no peak),
snapshots whose trace contradicts itself or stops at an OOM outside the loss step, and
model config.json files whose architecture's defaults do not fit their own sizes. Each
table is a variant of a defect class the pass found: one line and exit 2 that names what
is wrong, or an answer whose every word the file supports."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line


def _rows_edited(made_run: Path, to: Path, edit: Any) -> Path:
    run = Path(shutil.copytree(made_run, to))
    payload = json.loads((run / "results.json").read_text())
    for row in payload["rows"]:
        edit(row)
    (run / "results.json").write_text(json.dumps(payload))
    return run


def _gate_config(here: Path) -> str:
    (here / "pyproject.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{kernel = "*", max_peak = "1GiB"}]\n'
    )
    return str(here / "pyproject.toml")


# -- a row that finished ("ok") with no peak: both backends write an ok case's peak, so
# such a row is another tool's or version's (a renamed column) or a damaged file. As a
# baseline, every regression check FAILed "no peak_bytes to compare", exit 1: the user's
# run blamed for the baseline's gap. It is refused as the row's other contradictions are.

NO_PEAK = {
    "peak_bytes null": lambda r: r.update(peak_bytes=None, forward_peak_bytes=None),
    "peak_bytes NaN": lambda r: r.update(peak_bytes=float("nan"), backward_peak_bytes=None),
    "peak_bytes renamed (another version)": lambda r: r.update(
        peak_allocated_bytes=r.pop("peak_bytes"), forward_peak_bytes=None
    ),
}


@pytest.mark.parametrize("what", sorted(NO_PEAK))
def test_a_finished_baseline_row_without_a_peak_is_one_line(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    base = _rows_edited(made_run, here / "base", NO_PEAK[what])
    args = ["gate", str(made_run), "--baseline", str(base), "--config", _gate_config(here)]
    err = one_line(*run_cli(*args))
    assert "row 0 is ok but has no peak_bytes" in err and str(base / "results.json") in err, err


@pytest.mark.parametrize("command", ["report", "gate"])
def test_a_finished_row_without_a_peak_in_the_run_is_one_line(
    run_cli: Any, made_run: Path, here: Path, command: str
) -> None:
    run = _rows_edited(made_run, here / "run", NO_PEAK["peak_bytes null"])
    extra = ["--config", _gate_config(here)] if command == "gate" else []
    err = one_line(*run_cli(command, str(run), *extra))
    assert "is ok but has no peak_bytes" in err, err


def test_a_row_without_a_peak_that_did_not_finish_is_still_read(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    def skipped(row: dict[str, Any]) -> None:
        row.update(status="skipped", peak_bytes=None, forward_peak_bytes=None)
        row.update(backward_peak_bytes=None, note="needs CUDA")

    base = _rows_edited(made_run, here / "base", skipped)
    args = ["gate", str(made_run), "--baseline", str(base), "--config", _gate_config(here)]
    code, out, err = run_cli(*args)
    assert code == 0 and "baseline status skipped, now ok" in out, (out, err)


def _snapshot_of(made_run: Path, kernel: str = "unchunked") -> dict[str, Any]:
    (path,) = (made_run / "snapshots").glob(f"{kernel}-*.pickle")
    return pickle.loads(path.read_bytes())


def _written(snap: dict[str, Any], here: Path, name: str = "s.pickle") -> str:
    (here / name).write_bytes(pickle.dumps(snap, protocol=4))
    return str(here / name)


# -- a snapshot that holds an OOM outside the loss step (torch dumps one at the OOM: a
# request in the optimizer, before the step, or caught and retried): --what-if left the
# failed request out of its prediction and said "fits", even of the capacity read off that
# very OOM (reserved + the device's free bytes), where no logprob kernel changes the
# request. The request now counts: "does not fit" when it cannot, said either way.

GiB = 1 << 30
OOM = {"action": "oom", "size": 100 * GiB, "device_free": GiB, "stream": 0, "frames": []}
WHERE = {"after the step": -1, "before the step": 1}
BUDGETS = {
    "the OOM's capacity": ([], "does not fit 1.00 GiB (reserved + the device's free bytes"),
    "a smaller --budget": (["--budget", "80GiB"], "does not fit 80.00 GiB (--budget)"),
    "a larger --budget": (["--budget", "200GiB"], "fits 200.00 GiB (--budget)"),
}


@pytest.mark.parametrize("budget", sorted(BUDGETS))
@pytest.mark.parametrize("where", sorted(WHERE))
def test_what_if_counts_an_oom_outside_the_loss_step(
    run_cli: Any, made_run: Path, here: Path, where: str, budget: str
) -> None:
    snap = _snapshot_of(made_run)
    trace = snap["device_traces"][0]
    at = len(trace) if WHERE[where] < 0 else WHERE[where]
    trace.insert(at, dict(OOM))
    flags, verdict = BUDGETS[budget]
    code, out, err = run_cli(
        "attribute", _written(snap, here), "--what-if", "local_chunked", *flags
    )
    (line,) = [x for x in out.splitlines() if x.startswith("  with local_chunked:")]
    assert code == 0 and verdict in line, (line, err)
    assert f"failed a request of 100.00 GiB at entry #{at}, outside the loss step" in line, line


def test_what_if_json_names_the_oom_outside_the_loss_step(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    snap = _snapshot_of(made_run)
    snap["device_traces"][0].append(dict(OOM))
    code, out, err = run_cli(
        "attribute", _written(snap, here), "--what-if", "local_chunked", "--json"
    )
    what_if = json.loads(out)["what_if"]
    assert code == 0 and what_if["fits"] is False, err
    assert what_if["unmet_request_bytes"] == 100 * GiB, what_if
    assert what_if["unmet_needed_bytes"] >= 100 * GiB, what_if


def test_what_if_without_an_oom_names_none(run_cli: Any, made_run: Path, here: Path) -> None:
    snap = _written(_snapshot_of(made_run), here)
    code, out, err = run_cli("attribute", snap, "--what-if", "local_chunked", "--json")
    what_if = json.loads(out)["what_if"]
    assert code == 0 and what_if["unmet_request_bytes"] is None, err


# -- a trace that allocates more than its segments reserve (an alloc's size edited, or
# another device's entries mixed in): torch allocates inside segments, yet attribute read
# "peak allocated 1.00 GiB ... peak reserved 2.00 MiB", "0 B of it not allocated", with no
# word that the file contradicts itself. A note now says the sizes disagree.


def _grown(snap: dict[str, Any], which: int, size: int) -> None:
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    targets = allocs if which < 0 else [allocs[which]]
    for e in targets:
        for same in snap["device_traces"][0]:
            if same.get("addr") == e["addr"] and same["action"] != "segment_alloc":
                same["size"] = size


GROWN = {
    "the input's alloc at 1 GiB": (0, GiB),
    "a forward alloc at 3 MiB": (1, 3 << 20),
    "every alloc at 1 MiB": (-1, 1 << 20),
}


@pytest.mark.parametrize("flags", [[], ["--replay"]], ids=["attribute", "--replay"])
@pytest.mark.parametrize("what", sorted(GROWN))
def test_a_trace_holding_more_than_its_segments_is_noted(
    run_cli: Any, made_run: Path, here: Path, what: str, flags: list[str]
) -> None:
    snap = _snapshot_of(made_run)
    _grown(snap, *GROWN[what])
    code, out, err = run_cli("attribute", _written(snap, here), *flags)
    assert code == 0, err
    assert "allocation and segment sizes disagree, so reserved bytes are a lower bound" in out


def test_a_trace_within_its_segments_has_no_such_note(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    code, out, err = run_cli("attribute", _written(_snapshot_of(made_run), here))
    assert code == 0 and "sizes disagree" not in out, err


# -- rows that record no device (a results file written without the column, or null):
# the gate compared nothing and said so as "the baseline was measured on None", and a
# rule's hint listed "device None": Python's word for a value the file does not give.

NO_DEVICE = {
    "no device column": lambda r: [r.pop("device"), r.update(case_id="")],
    "device null": lambda r: r.update(device=None, case_id=""),
}


@pytest.mark.parametrize("side", ["baseline", "results"])
@pytest.mark.parametrize("what", sorted(NO_DEVICE))
def test_rows_without_a_device_are_said_so(
    run_cli: Any, made_run: Path, here: Path, what: str, side: str
) -> None:
    edited = str(_rows_edited(made_run, here / "edited", NO_DEVICE[what]))
    results, base = (made_run, edited) if side == "baseline" else (edited, made_run)
    args = ["gate", str(results), "--baseline", str(base), "--config", _gate_config(here)]
    err = one_line(*run_cli(*args))
    said = "an unrecorded device (rows that name none)"
    assert said in err and "None" not in err and "nothing to compare" in err, err


def test_a_rule_hint_names_rows_without_a_device(run_cli: Any, made_run: Path, here: Path) -> None:
    edited = _rows_edited(made_run, here / "edited", NO_DEVICE["device null"])
    config = here / "pyproject.toml"
    config.write_text(
        '[tool.memprobe.gate]\nrules = [{kernel = "*", device = "meta", max_peak = "1GiB"}]\n'
    )
    err = one_line(*run_cli("gate", str(edited), "--config", str(config)))
    assert "device (none recorded)" in err and "None" not in err, err


@pytest.mark.parametrize("how", ["null", "null in an unfinished row too"])
def test_a_resume_of_a_case_without_a_device_is_one_line(
    run_cli: Any, made_run: Path, here: Path, how: str
) -> None:
    # A run.json case with a null device was measured on "unknown device None".
    run = Path(shutil.copytree(made_run, here / "run"))
    meta = json.loads((run / "run.json").read_text())
    meta["cases"][0]["device"] = None
    (run / "run.json").write_text(json.dumps(meta))
    payload = json.loads((run / "results.json").read_text())
    payload["rows"] = [] if how == "null" else [{**payload["rows"][0], "status": "error"}]
    if how != "null":
        payload["rows"][0].update(device=None, case_id="", note="unfinished: rank 1 went silent")
    (run / "results.json").write_text(json.dumps(payload))
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert "which no sweep runs (no device (meta, cpu or cuda))" in err, err
