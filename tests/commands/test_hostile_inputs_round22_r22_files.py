"""Hostile inputs, round 22 (r22_files), files a user hands memprobe: JSON that gives one
key twice (a model's config.json, a run's results.json or run.json), and a resumed or
re-rendered run whose page or plots are not memprobe's to replace. Each table is a
variant of a defect class the pass found: one line and exit 2 that names what is wrong,
before any work is done, and nothing of the user's lost."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line
from small_config import SMALL


def _copy(made_run: Path, to: Path) -> Path:
    shutil.copytree(made_run, to)
    return to


def _drop_last_row(run: Path) -> None:
    """One planned case left to run: what a resume writes."""
    payload = json.loads((run / "results.json").read_text())
    payload["rows"] = payload["rows"][:-1]
    (run / "results.json").write_text(json.dumps(payload))


def _twice(text: str, key: str, value: Any) -> str:
    """``text``'s first ``"key": ...`` followed by the same key again with ``value``:
    what an appended line or two merged files make."""
    at = text.index(f'"{key}":')
    return f'{text[:at]}"{key}": {json.dumps(value)}, {text[at:]}'


# -- JSON that gives one key twice: json keeps the last without a word, so a config.json
# with "hidden_size": 64 and then "hidden_size": 4096 built a 141.58M-parameter model (the
# 64 passed over), and a results row's second peak_bytes was read as its peak (caught only
# where another column happened to contradict it).

CONFIG_TWICE = {
    "a size at the top level": ("hidden_size", 4096, None),
    "a count at the top level": ("num_hidden_layers", 1, None),
    "the model type": ("model_type", "mistral", None),
    "a key nested in rope_scaling": ("factor", 8.0, {"rope_type": "linear", "factor": 2.0}),
}


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(CONFIG_TWICE))
def test_a_config_json_giving_a_key_twice_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    key, value, rope = CONFIG_TWICE[what]
    config = {**SMALL, **({"rope_scaling": rope} if rope else {})}
    (tmp_path / "config.json").write_text(_twice(json.dumps(config), key, value))
    args = {
        "step": ["step", "--config", str(tmp_path), "--tokens", "16"],
        "plan --step": ["plan", "--step", "--config", str(tmp_path), "--budget", "1GiB"],
    }[command]
    err = one_line(*run_cli(*args))
    assert f"gives the key '{key}' twice" in err and "config.json" in err, err


def test_a_config_json_with_each_key_once_is_built(run_cli: Any, tmp_path: Path) -> None:
    # The same key in two different objects is no duplicate.
    config = {**SMALL, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "factor": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = run_cli("step", "--config", str(tmp_path), "--tokens", "16")
    assert code == 0 and "llama" in out, err


RUN_TWICE = {
    "results.json: a row's peak": ("results.json", "peak_bytes", 5),
    "results.json: a row's status": ("results.json", "status", "oom"),
    "results.json: its rows": ("results.json", "rows", []),
    "run.json: its device": ("run.json", "device", "cuda"),
    "run.json: its cases": ("run.json", "cases", []),
}


@pytest.mark.parametrize("command", ["report", "gate", "resume"])
@pytest.mark.parametrize("what", sorted(RUN_TWICE))
def test_a_run_file_giving_a_key_twice_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str, command: str
) -> None:
    name, key, value = RUN_TWICE[what]
    # (A resume reads the run's files whether or not a case is left to run.)
    run = _copy(made_run, tmp_path / "run")
    path = run / name
    path.write_text(_twice(path.read_text(), key, value))
    before = path.read_bytes()
    (tmp_path / "g.toml").write_text(
        '[tool.memprobe.gate]\nrules=[{kernel="*", max_peak="1TiB"}]\n'
    )
    args = {
        "report": ["report", str(run)],
        "gate": ["gate", str(run), "--config", str(tmp_path / "g.toml")],
        "resume": ["sweep", "--resume", str(run), "-q", "--no-verify"],
    }[command]
    code, out, err = run_cli(*args)
    if command == "gate" and name == "run.json":
        # gate reads a run's results alone: its run.json is not read.
        assert code == 0, err
        return
    err = one_line(code, out, err)
    assert f"gives the key '{key}' twice" in err and name in err, err
    assert path.read_bytes() == before


def test_a_baseline_giving_a_key_twice_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    base = tmp_path / "base.json"
    base.write_text(_twice((made_run / "results.json").read_text(), "peak_bytes", 1))
    (tmp_path / "g.toml").write_text('[tool.memprobe.gate]\nbaseline = "base.json"\n')
    err = one_line(*run_cli("gate", str(made_run), "--config", str(tmp_path / "g.toml")))
    assert "gives the key 'peak_bytes' twice" in err and "base.json" in err, err


# -- a resume whose page or plots are not memprobe's to replace (the user's own
# report.html, a folder named timeline.png): the page was refused only as it was written,
# after every case had run and its rows were written, exit 2. It is refused before any case
# runs, and `--no-report` still resumes.

PAGE_FILES = ["report.html", "timeline.png", "peak_breakdown.png"]


def _users(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "a folder":
        path.mkdir()
    else:
        path.write_text("the user's own\n")


@pytest.mark.parametrize("kind", ["a folder", "a file of the user's"])
@pytest.mark.parametrize("name", PAGE_FILES)
def test_a_resume_whose_page_is_not_memprobes_runs_nothing(
    run_cli: Any, made_run: Path, tmp_path: Path, name: str, kind: str
) -> None:
    run = _copy(made_run, tmp_path / "run")
    _drop_last_row(run)
    _users(run / name, kind)
    results = (run / "results.json").read_bytes()
    snapshots = sorted(p.name for p in (run / "snapshots").iterdir())
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert f"{run / name} exists and was not written by memprobe" in err, err
    assert "--no-report" in err, err
    assert (run / "results.json").read_bytes() == results  # no case ran
    assert sorted(p.name for p in (run / "snapshots").iterdir()) == snapshots


def test_a_resume_without_its_page_leaves_the_users_file(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _copy(made_run, tmp_path / "run")
    _drop_last_row(run)
    _users(run / "timeline.png", "a file of the user's")
    code, _, err = run_cli("sweep", "--resume", str(run), "-q", "--no-verify", "--no-report")
    assert code == 0, err
    assert (run / "timeline.png").read_text() == "the user's own\n"


# -- a run whose own report.html is a folder: `report RUN` (and a resume) took it for a
# folder to write the page into, as --out FOLDER is, and wrote run/report.html/report.html
# with its plots beside it. Only --out names a folder for the page.


@pytest.mark.parametrize("command", ["report", "resume"])
def test_a_runs_report_html_that_is_a_folder_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, command: str
) -> None:
    run = _copy(made_run, tmp_path / "run")
    _users(run / "report.html", "a folder")
    if command == "resume":
        _drop_last_row(run)
        args = ["sweep", "--resume", str(run), "-q", "--no-verify"]
    else:
        args = ["report", str(run)]
    err = one_line(*run_cli(*args))
    assert f"{run / 'report.html'} exists and was not written by memprobe" in err, err
    assert not any((run / "report.html").iterdir())


def test_report_out_naming_a_folder_still_writes_into_it(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    (tmp_path / "pages").mkdir()
    code, out, err = run_cli("report", str(made_run), "--out", str(tmp_path / "pages"))
    assert code == 0 and (tmp_path / "pages" / "report.html").is_file(), err


# -- a resume whose case left to run has its snapshot path taken already by a link out of
# the run (a run tracked by DVC, whose files are links into its cache) or by a folder: the
# write went through the link and replaced the file it names, exit 0; a folder failed the
# case after it ran. Round 21 refused a linked snapshots/ folder and linked results files;
# each snapshot the resume writes is now held to the same rule, before any case runs.


def _snapshot_left(run: Path) -> Path:
    """The snapshot path of the case a resume runs (its row dropped, its file kept)."""
    payload = json.loads((run / "results.json").read_text())
    path = run / payload["rows"][-1]["snapshot"]
    payload["rows"] = payload["rows"][:-1]
    (run / "results.json").write_text(json.dumps(payload))
    return path


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_a_resume_never_writes_a_snapshot_through_a_link_out_of_the_run(
    run_cli: Any, made_run: Path, tmp_path: Path, how: str
) -> None:
    run = _copy(made_run, tmp_path / "run")
    snapshot = _snapshot_left(run)
    cached = tmp_path / "cache" / "ab12"
    cached.parent.mkdir()
    cached.write_bytes(snapshot.read_bytes())
    snapshot.unlink()
    snapshot.symlink_to(cached if how == "absolute" else Path("..", "..", "cache", "ab12"))
    before = cached.read_bytes()
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert f"{snapshot} is a link" in err and "leads out of the run" in err, err
    assert cached.read_bytes() == before and snapshot.is_symlink()


def test_a_resume_whose_snapshot_path_is_a_folder_runs_nothing(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _copy(made_run, tmp_path / "run")
    snapshot = _snapshot_left(run)
    snapshot.unlink()
    snapshot.mkdir()
    results = (run / "results.json").read_bytes()
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert f"{snapshot} is not a file the run can write" in err, err
    assert (run / "results.json").read_bytes() == results


def test_a_resume_writes_a_snapshot_through_a_link_inside_the_run(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _copy(made_run, tmp_path / "run")
    snapshot = _snapshot_left(run)
    snapshot.rename(run / "kept.pickle")
    snapshot.symlink_to(Path("..", "kept.pickle"))
    code, _, err = run_cli("sweep", "--resume", str(run), "-q", "--no-verify")
    assert code == 0, err
    assert (
        snapshot.is_symlink() and len(json.loads((run / "results.json").read_text())["rows"]) == 1
    )
