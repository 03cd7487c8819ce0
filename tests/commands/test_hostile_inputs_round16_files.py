"""Hostile inputs, round 16, files a user hands memprobe: values each valid alone that
contradict each other, and files other tools (or other versions) write. Each table is a
variant of a defect class the pass found: one line and exit 2, never a number the file
does not support, and a good file of an unusual shape still read."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

GATE_TOML = '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'


def _tampered(made_run: Path, to: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    run = to / "run"
    shutil.copytree(made_run, run)
    data = json.loads((run / "results.json").read_text())
    for row in data["rows"]:
        edit(row)
    (run / "results.json").write_text(json.dumps(data))
    return run


def _args(command: str, run: Path, good: Path) -> list[str]:
    return {
        "report": ["report", str(run), "--out", "page.html"],
        "gate": ["gate", str(run)],
        "baseline": ["gate", str(good), "--baseline", str(run)],
        "resume": ["sweep", "--resume", str(run), "-q", "--no-verify"],
        "plan": ["plan", "--from-run", str(run), "--budget", "1GiB", "--vocab", "128"],
    }[command]


# -- a results row whose values, each valid, contradict each other: a peak below its own
# floor passed `max_peak_over_floor` at a ratio under 1 (and drew one on the page); a
# phase's peak above the step's peak was drawn as it was; a meta row with times (a meta
# run simulates and times nothing) made `plan --from-run` pick a chunk "measured fastest
# ... on meta"


def _peak_times(row: dict[str, Any], factor: float, key: str) -> None:
    row[key] = int(row["peak_bytes"] * factor)


CONTRADICTIONS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "a floor above the peak": (
        lambda r: _peak_times(r, 2, "floor_bytes"),
        "floor_bytes 229,888 is above its peak_bytes 114,944",
    ),
    "a floor one byte above": (
        lambda r: r.update(floor_bytes=r["peak_bytes"] + 1),
        "floor_bytes 114,945 is above its peak_bytes 114,944",
    ),
    "a forward peak above": (
        lambda r: _peak_times(r, 1.5, "forward_peak_bytes"),
        "forward_peak_bytes 172,416 is above its peak_bytes",
    ),
    "a backward peak above": (
        lambda r: r.update(backward_peak_bytes=2**62),
        "backward_peak_bytes 4,611,686,018,427,387,904 is above",
    ),
    "a peak of 1 byte": (lambda r: r.update(peak_bytes=1), "is above its peak_bytes 1"),
    "a meta row with times": (
        lambda r: r.update(fwd_time_s=0.01, bwd_time_s=0.02),
        "is on meta but has fwd_time_s and bwd_time_s",
    ),
    "a meta row with a backward time": (
        lambda r: r.update(bwd_time_s=0.0),
        "is on meta but has bwd_time_s (a meta run",
    ),
}


@pytest.mark.parametrize("command", ["report", "gate", "baseline", "resume"])
@pytest.mark.parametrize("what", sorted(CONTRADICTIONS))
def test_a_row_that_contradicts_itself_is_one_line(
    run_cli: Any, made_run: Path, here: Path, what: str, command: str
) -> None:
    edit, says = CONTRADICTIONS[what]
    (here / "pyproject.toml").write_text(GATE_TOML)
    run = _tampered(made_run, here, edit)
    good = here / "good"
    shutil.copytree(made_run, good)
    before = (run / "results.json").read_bytes()
    err = one_line(*run_cli(*_args(command, run, good)))
    assert says in err and "row 0" in err, err
    assert (run / "results.json").read_bytes() == before
    assert not (here / "page.html").exists()


def test_a_meta_row_with_times_is_not_a_measured_chunk(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    def timed(row: dict[str, Any]) -> None:
        row.update(kernel="local_chunked", case_id=None, fwd_time_s=0.01, bwd_time_s=0.02)

    run = _tampered(made_run, here, timed)
    err = one_line(*run_cli(*_args("plan", run, run), "--kernel", "local_chunked"))
    assert "is on meta but has fwd_time_s and bwd_time_s" in err


AGREEING: dict[str, Callable[[dict[str, Any]], None]] = {
    "a floor equal to the peak": lambda r: r.update(floor_bytes=r["peak_bytes"]),
    "phase peaks equal to the peak": lambda r: r.update(
        forward_peak_bytes=r["peak_bytes"], backward_peak_bytes=r["peak_bytes"]
    ),
    "no phase peaks, no floor": lambda r: r.update(
        forward_peak_bytes=None, backward_peak_bytes=None, floor_bytes=None
    ),
    "an oom with a floor and no peak": lambda r: r.update(
        status="oom", peak_bytes=None, forward_peak_bytes=None, backward_peak_bytes=None
    ),
    "a cpu row with times": lambda r: r.update(
        device="cpu", case_id=None, snapshot=None, fwd_time_s=0.01, bwd_time_s=0.0
    ),
    "a meta row with errors (the check runs on cpu)": lambda r: r.update(
        max_abs_err_fwd=0.0, max_abs_err_bwd=1e-3
    ),
}


@pytest.mark.parametrize("what", sorted(AGREEING))
def test_a_row_that_agrees_with_itself_is_still_read(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    (here / "pyproject.toml").write_text(GATE_TOML)
    run = _tampered(made_run, here, AGREEING[what])
    good = here / "good"
    shutil.copytree(made_run, good)
    (good / "results.json").write_bytes((run / "results.json").read_bytes())
    code, out, err = run_cli("gate", str(run / "results.json"))
    assert code in (0, 1) and "case(s) from" in out, err


# -- a file of another kind handed where memprobe reads text: a snapshot (or a gzip or zip
# file) given as results, a baseline, a gate config or a model's config.json was "not
# UTF-8 text (byte 0x80 at offset 0)", with the hint to save it as UTF-8

BINARY = {
    "a snapshot pickle": (None, "a pickle (a memory snapshot?)"),
    "a gzip file": (b"\x1f\x8b\x08\x00" + bytes(range(256)), "gzip-compressed"),
    "a zip file": (b"PK\x03\x04" + bytes(range(256)), "a zip archive"),
}


def _binary(made_run: Path, here: Path, what: str) -> Path:
    data, _ = BINARY[what]
    if data is None:
        (snapshot,) = (made_run / "snapshots").iterdir()
        data = snapshot.read_bytes()
    file = here / "file.bin"
    file.write_bytes(data)
    return file


@pytest.mark.parametrize("reader", ["results", "baseline", "from-run", "gate config", "step"])
@pytest.mark.parametrize("what", sorted(BINARY))
def test_a_binary_file_handed_as_text_is_named_for_what_it_is(
    run_cli: Any, made_run: Path, here: Path, what: str, reader: str
) -> None:
    file = _binary(made_run, here, what)
    (here / "pyproject.toml").write_text(GATE_TOML)
    args = {
        "results": ["gate", str(file)],
        "baseline": ["gate", str(made_run), "--baseline", str(file)],
        "from-run": ["plan", "--from-run", str(file), "--budget", "1GiB", "--vocab", "128"],
        "gate config": ["gate", str(made_run), "--config", str(file)],
        "step": ["step", "--config", str(file), "--tokens", "32"],
    }[reader]
    err = one_line(*run_cli(*args))
    kind = BINARY[what][1]
    assert f"is {kind}, not" in err and "UTF-8" not in err, err


@pytest.mark.parametrize(
    ("reader", "says"),
    [
        ("gate config", "is not UTF-8 text (byte 0xff at offset 0)"),
        ("step", "is not UTF-8 text (byte 0xff at offset 0)"),
        ("results", "case(s) from"),
    ],
)
def test_text_in_another_encoding_is_still_said_so_or_read(
    run_cli: Any, made_run: Path, here: Path, reader: str, says: str
) -> None:
    """UTF-16 text is no binary kind: TOML and config.json stay UTF-8 only (the hint says
    to save it so); a results.json in UTF-16 is JSON, which json reads."""
    (here / "pyproject.toml").write_text(GATE_TOML)
    if reader == "results":
        run = here / "run"
        shutil.copytree(made_run, run)
        text = (run / "results.json").read_text()
        (run / "results.json").write_bytes(text.encode("utf-16"))
        code, out, err = run_cli("gate", str(run))
        assert code == 0 and says in out, err
        return
    file = here / "file.txt"
    if reader == "step":
        file.write_bytes('{"model_type": "llama"}'.encode("utf-16"))
        err = one_line(*run_cli("step", "--config", str(file), "--tokens", "32"))
    else:
        file.write_bytes(GATE_TOML.encode("utf-16"))
        err = one_line(*run_cli("gate", str(made_run), "--config", str(file)))
    assert says in err and "save" in err, err
