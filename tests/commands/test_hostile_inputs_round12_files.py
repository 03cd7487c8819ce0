"""Hostile inputs, round 12 (the confirming pass), files a user hands memprobe: results
files, run folders, baselines. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line
from small_config import SMALL


def _edited(made_run: Path, tmp_path: Path, name: str, **row: Any) -> Path:
    run = tmp_path / name
    shutil.copytree(made_run, run)
    payload = json.loads((run / "results.json").read_text())
    payload["rows"][0].update(row)
    (run / "results.json").write_text(json.dumps(payload))
    return run


# -- a row whose peak is 0 B: no step holds nothing (the logits alone are in every peak),
# yet it was read as a measurement: the gate passed it as the lowest peak there is, a
# baseline of 0 failed every later run, and the report's log axis warned on stderr


@pytest.mark.parametrize("status", ["ok", "error"])
@pytest.mark.parametrize("command", ["report", "gate", "gate --baseline", "plan --from-run"])
def test_a_peak_of_zero_bytes_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, status: str, command: str
) -> None:
    bad = _edited(made_run, tmp_path, "bad", peak_bytes=0, status=status)
    args = {
        "report": ["report", str(bad), "--out", str(tmp_path / "page.html")],
        "gate": ["gate", str(bad), "--baseline", str(made_run)],
        "gate --baseline": ["gate", str(made_run), "--baseline", str(bad)],
        "plan --from-run": ["plan", "--vocab", "128", "--budget", "1GiB", "--from-run", str(bad)],
    }[command]
    err = one_line(*run_cli(*args))
    assert "row 0 peak_bytes 0 is not positive" in err, err
    assert not (tmp_path / "page.html").exists()


def test_a_peak_of_one_byte_is_still_read(run_cli: Any, made_run: Path, tmp_path: Path) -> None:
    # The guard is for 0 only: a small peak is a number the gate can judge (here, a pass).
    one = {k: 1 for k in ("peak_bytes", "forward_peak_bytes", "backward_peak_bytes", "floor_bytes")}
    small = _edited(made_run, tmp_path, "small", **one)
    config = tmp_path / "gate.toml"
    config.write_text("[tool.memprobe.gate]\n")
    code, out, err = run_cli(
        "gate", str(small), "--baseline", str(made_run), "--config", str(config)
    )
    assert code == 0 and "passed" in out + err, (code, out, err)


# -- a run.json whose planned cases a sweep would refuse (edited, or mixed from another
# run): resume measured them as something else under their own names (unchunked at tp 2
# ran on half the vocabulary and wrote half the peak; a logits kernel with a hidden size
# wrote a hidden-family row holding the logits kernel's figures)


def _planning(made_run: Path, tmp_path: Path, **case: Any) -> Path:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    meta = json.loads((run / "run.json").read_text())
    meta["cases"].append({**meta["cases"][0], **case})
    (run / "run.json").write_text(json.dumps(meta))
    return run


REFUSED_CASES = [
    ({"hidden": 64}, "takes logits, not hidden states"),
    ({"kernel": "linear_unchunked"}, "takes hidden states and the lm_head weight"),
    ({"tp": 2}, "--tp 2 shards the vocabulary, which it cannot do"),
    ({"kernel": "chunked_distributed", "tp": 3}, "--tp 3 does not divide the vocabulary 128"),
    ({"cp": 3}, "--cp 3 does not divide the tokens 64"),
    ({"kernel": "no_such_kernel"}, "unknown kernel 'no_such_kernel'"),
]


@pytest.mark.parametrize(("case", "why"), REFUSED_CASES, ids=[str(c) for c, _ in REFUSED_CASES])
def test_resume_refuses_a_planned_case_no_sweep_runs(
    run_cli: Any, made_run: Path, tmp_path: Path, case: dict[str, Any], why: str
) -> None:
    run = _planning(made_run, tmp_path, **case)
    before = (run / "results.json").read_bytes()
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-report"))
    assert f"cannot resume {run}: its run.json plans " in err and why in err, err
    assert (run / "results.json").read_bytes() == before


def test_resume_still_runs_a_planned_case_a_sweep_runs(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _planning(made_run, tmp_path, kernel="local_chunked")
    code, _, err = run_cli("sweep", "--resume", str(run), "-q", "--no-report", "--no-verify")
    assert code == 0, err
    rows = json.loads((run / "results.json").read_text())["rows"]
    assert [r["kernel"] for r in rows] == ["unchunked", "local_chunked"]


# -- a config that was read but whose text is not TOML memprobe can parse (not UTF-8, or
# nested past Python's recursion limit): the line said "check the path and permissions",
# where neither is wrong


BAD_TEXT = {
    "latin-1 comment": (b"[tool.memprobe.gate]\n# caf\xe9\n", "is not UTF-8 text (byte 0xe9"),
    "UTF-16": (
        "[tool.memprobe.gate]\n".encode("utf-16"),
        "is not UTF-8 text (byte 0xff at offset 0)",
    ),
    "NUL-free binary": (b"\x80\x04\x95", "is a pickle (a memory snapshot?), not"),
    "deep arrays": (
        b"x = " + b"[" * 50_000 + b"]" * 50_000 + b"\n",
        "nests arrays or tables too deep",
    ),
    "deep inline tables": (b"x = " + b"{a = " * 50_000 + b"1" + b"}" * 50_000 + b"\n", "too deep"),
}


@pytest.mark.parametrize("text", list(BAD_TEXT))
@pytest.mark.parametrize("where", ["gate --config", "gate, nearest pyproject.toml"])
def test_a_config_that_is_not_readable_toml_says_what_is_wrong(
    run_cli: Any, made_run: Path, here: Path, text: str, where: str
) -> None:
    data, why = BAD_TEXT[text]
    if where == "gate --config":
        (here / "g.toml").write_bytes(data)
        args = ["gate", str(made_run), "--config", "g.toml"]
    else:
        (here / "pyproject.toml").write_bytes(data)
        args = ["gate"]  # its own sweep, planned from the file's [tool.memprobe.sweep]
    err = one_line(*run_cli(*args))
    assert why in err and "permissions" not in err, err
    assert not (here / "reports").exists()


# -- an output path that can never be written (a folder, a FIFO, a device) was refused
# only when the command wrote, after its work: a step simulated, a user's step run, a
# plan searched, then one line; now the same line comes before any of it


def _special(tmp_path: Path, kind: str) -> Path:
    if kind == "device":
        return Path("/dev/null")
    path = tmp_path / f"out.{kind}"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    return path


def _must_not_run(*_: Any, **__: Any) -> None:
    raise AssertionError("the work ran before its output was checked")


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
@pytest.mark.parametrize("command", ["step --out", "profile --out", "profile --html"])
def test_an_unwritable_output_file_is_refused_before_the_work(
    run_cli: Any, here: Path, monkeypatch: pytest.MonkeyPatch, kind: str, command: str
) -> None:
    import memprobe.profile.step

    special = _special(here, kind)
    monkeypatch.setattr(memprobe.profile.step, "simulate_step", _must_not_run)
    (here / "config.json").write_text(json.dumps(SMALL))
    (here / "r12_step.py").write_text(
        "from pathlib import Path\ndef step(device):\n    Path('ran').touch()\n"
    )
    flag = command.split()[1]
    args = {
        "step": ["step", "--config", "config.json", "--tokens", "64", "--out", str(special)],
        "profile": ["profile", "r12_step:step", flag, str(special)],
    }[command.split()[0]]
    err = one_line(*run_cli(*args))
    what = "HTML page" if flag == "--html" else "snapshot"
    assert f"cannot write {what} {special}: it is a" in err and "not a regular file" in err, err
    assert not (here / "ran").exists()


@pytest.mark.parametrize("kind", ["folder", "fifo"])
@pytest.mark.parametrize("name", ["plan.html", "plan.png", "plan.json"])
def test_plan_refuses_an_unwritable_page_before_the_search(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, name: str
) -> None:
    import memprobe.plan

    monkeypatch.setattr(memprobe.plan, "run_plan_job", _must_not_run)
    out = tmp_path / "p"
    out.mkdir()
    (out / name).mkdir() if kind == "folder" else os.mkfifo(out / name)
    err = one_line(*run_cli("plan", "--vocab", "256", "--budget", "1GiB", "--out", str(out)))
    assert f"{out / name}: it is a" in err and "not a regular file" in err, err


# -- plan --out into a folder holding a plan.html, plan.png or plan.json of the user's own:
# replaced without a word, where report --out leaves a user's page and plots alone


FOREIGN = {
    "plan.html": b"<html><title>our capacity plan</title></html>",
    "plan.png": b"\x89PNG\r\n\x1a\n not ours",
    "plan.json": b'{"mine": 1}',
    "plan.json as rows of another tool": b'[{"kernel": "x"}]',
}


@pytest.mark.parametrize("which", list(FOREIGN))
def test_plan_leaves_a_users_own_plan_file_alone(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    import memprobe.plan

    monkeypatch.setattr(memprobe.plan, "run_plan_job", _must_not_run)
    out = tmp_path / "p"
    out.mkdir()
    mine = out / which.split()[0]
    mine.write_bytes(FOREIGN[which])
    err = one_line(*run_cli("plan", "--vocab", "256", "--budget", "1GiB", "--out", str(out)))
    assert f"{mine} exists and was not written by memprobe; the plan would replace it" in err
    assert mine.read_bytes() == FOREIGN[which]
    assert sorted(p.name for p in out.iterdir()) == [mine.name]


def test_plan_replaces_its_own_files(run_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "p"
    args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "unchunked"]
    args += ["--out", str(out)]
    assert run_cli(*args)[0] == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = run_cli(*args)
    assert code == 0, err
    assert sorted(first) == ["plan.html", "plan.json", "plan.png"]
    assert (out / "plan.json").read_bytes() == first["plan.json"]
