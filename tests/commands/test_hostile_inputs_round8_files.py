"""Hostile inputs, round 8 (files): snapshot pickles, run directories, gate configs and
baselines, and outputs that land on inputs. Each refusal is one line and exit 2; each
file memprobe reads is left as it was.

Why one long module: it is the whole round's table of hostile files, one section per
kind of file, and each section's fixtures serve the next (the profiled step, the run)."""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, profiled

STEP = """\
import torch
import torch.nn.functional as F
def step(device):
    w = torch.randn(256, 32, device=device, requires_grad=True)
    h = torch.randn(1, 64, 32, device=device)
    ids = torch.randint(0, 256, (1, 64), device=device)
    logits = h @ w.t()
    F.cross_entropy(logits.float().view(-1, 256), ids.view(-1)).backward()
"""


@pytest.fixture(scope="module")
def step_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profiled LM step (memprobe's labels on every entry: shape, dtype, op, phase)."""
    return profiled(tmp_path_factory.mktemp("step"), "r8_files_step", STEP)


def _relabel(snapshot: Path, to: Path, old: str, new: str) -> Path:
    data = pickle.loads(snapshot.read_bytes())
    for entry in data["device_traces"][0]:
        entry["user_metadata"] = entry.get("user_metadata", "").replace(old, new)
    to.write_bytes(pickle.dumps(data, protocol=4))
    return to


# -- snapshot labels: a recorded shape is believed only when it is the block it labels --

# A zero dimension crashed the shape reading (ZeroDivisionError: a traceback from
# attribute, diff, --what-if and --other-from); a shape of more bytes than its block was
# read as the logits' (V=512 where the step's V is 256, in a dtype no block has).
LABELS = {
    "a zero dimension": "shape=0x256",
    "every dimension zero": "shape=0x0",
    "a zero batch": "shape=1x0x256",
    "twice the block's bytes": "shape=64x512",
    "half the block's bytes": "shape=64x128",
    "the right shape, another dtype's bytes": "dtype=torch.float16 shape=64x256",
}
COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "attribute": lambda s, good: ["attribute", str(s), "--top", "1"],
    "diff": lambda s, good: ["diff", str(good), str(s), "--top", "1"],
    "--what-if": lambda s, good: ["attribute", str(s), "--top", "1", "--what-if", "local_chunked"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("label", sorted(LABELS))
def test_a_label_that_is_not_its_block_is_not_believed(
    run_cli, step_snapshot: Path, tmp_path: Path, label: str, command: str
) -> None:
    old = "dtype=torch.float32 shape=64x256" if "dtype=" in LABELS[label] else "shape=64x256"
    bad = _relabel(step_snapshot, tmp_path / "bad.pickle", old, LABELS[label])
    before = bad.read_bytes()
    code, out, err = run_cli(*COMMANDS[command](bad, step_snapshot))
    assert code == 0 and "Traceback" not in err, err
    if command == "attribute":
        # Read from the blocks' sizes, as if the file had no labels: the step's own V.
        assert "shapes: logits [N=B·S=64, V=256], float32" in out, out
        assert "memprobe's label records" not in out
    if command == "--what-if":
        assert "replaced by local_chunked at [B=1, S=64, V=256] float32" in out
    assert bad.read_bytes() == before


def test_the_labels_memprobe_writes_are_still_read(run_cli, step_snapshot: Path) -> None:
    code, out, _ = run_cli("attribute", str(step_snapshot), "--top", "1")
    assert code == 0 and "memprobe's label records [64, 256]" in out


def test_other_from_reads_around_a_zero_dimension_label(
    run_cli, step_snapshot: Path, tmp_path: Path
) -> None:
    bad = _relabel(step_snapshot, tmp_path / "bad.pickle", "shape=64x256", "shape=0x256")
    args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "local_chunked"]
    good = run_cli(*args, "--no-reserved", "--other-from", str(step_snapshot))
    code, out, err = run_cli(*args, "--no-reserved", "--other-from", str(bad))
    assert code == 0 and good[0] == 0, err
    assert out.splitlines()[0] == good[1].splitlines()[0]  # the same "other"


# -- results rows: values no sweep writes are refused where the rows are read ---------


def _tamper(made_run: Path, to: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    run = to / "run"
    shutil.copytree(made_run, run)
    data = json.loads((run / "results.json").read_text())
    for row in data["rows"]:
        edit(row)
    (run / "results.json").write_text(json.dumps(data))
    return run


GATE_TOML = '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'
ROWS = {
    "device tpu": ({"device": "tpu"}, "device 'tpu' is not one of meta, cpu, cuda"),
    "device auto": ({"device": "auto"}, "device 'auto' is not one of meta, cpu, cuda"),
    "device CUDA": ({"device": "CUDA"}, "device 'CUDA' is not one of"),
    "hidden 0": ({"hidden": 0}, "hidden 0 is not positive"),
    "floor 0": ({"floor_bytes": 0}, "floor_bytes 0 is not positive"),
}


@pytest.mark.parametrize("command", ["report", "gate", "baseline", "resume"])
@pytest.mark.parametrize("what", sorted(ROWS))
def test_a_row_no_sweep_writes_is_one_line(
    run_cli, made_run: Path, tmp_path: Path, monkeypatch, what: str, command: str
) -> None:
    edit, says = ROWS[what]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(GATE_TOML)
    run = _tamper(made_run, tmp_path, lambda row: row.update(edit))
    good = tmp_path / "good"
    shutil.copytree(made_run, good)
    args = {
        "report": ["report", str(run), "--out", "page.html"],
        "gate": ["gate", str(run)],
        "baseline": ["gate", str(good), "--baseline", str(run)],
        "resume": ["sweep", "--resume", str(run), "-q", "--no-verify"],
    }[command]
    before = (run / "results.json").read_bytes()
    err = one_line(*run_cli(*args))
    assert says in err and "row 0" in err
    assert (run / "results.json").read_bytes() == before
    assert not (tmp_path / "page.html").exists()


# -- run.json: its text reaches the page inert, its capacity only when it is one -------

_CONTROLS = "".join(map(chr, [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]))
META_TEXT = {
    "command": "memprobe sweep \x1b[2J\x07\x9b31m --out run",
    "device_name": "H100\x1b]0;owned\x07 80GB",
    "started": "\x00yesterday",
    "torch_version": "2.13\r\nFAKE: all checks passed",
    "kernel_summaries": {"unchunked": "log_softmax\x1b[31m in red\x08\x08"},
}


def test_run_json_text_reaches_the_page_without_control_characters(
    run_cli, made_run: Path, tmp_path: Path
) -> None:
    # Every field's text at once, in one page (one report drawn, not one per field).
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    meta = json.loads((run / "run.json").read_text())
    meta.update(META_TEXT)
    (run / "run.json").write_text(json.dumps(meta))
    code, _, err = run_cli("report", str(run), "--out", str(tmp_path / "page.html"))
    assert code == 0, err
    page = (tmp_path / "page.html").read_text()
    assert not set(page) & set(_CONTROLS) - {"\n", "\t", "\r"}
    for shown in ("\\x1b[2J", "H100\\x1b]0;owned", "\\x00yesterday", "\\r\\n", "\\x1b[31m in red"):
        assert shown in page, shown  # each field shown, its controls escaped as the terminal does
    assert "\r\nFAKE" not in page


def _cuda_run(made_run: Path, to: Path, capacity: object, *, rows: str = "cuda") -> Path:
    """``made_run`` as a cuda run would record it: its rows on ``rows``, run.json's GPU of
    ``capacity`` bytes."""
    run = _tamper(made_run, to, lambda row: row.update(device=rows))
    meta = json.loads((run / "run.json").read_text())
    meta.update(device="cuda", device_memory_bytes=capacity)
    for case in meta["cases"]:
        case["device"] = rows
    (run / "run.json").write_text(json.dumps(meta))
    return run


@pytest.mark.parametrize(
    "capacity",
    [-1, 0, 0.5, 10**400, "80GiB", True, float("nan")],
    ids=["-1", "0", "0.5", "10**400", "text", "true", "nan"],
)
def test_a_cuda_runs_capacity_that_is_no_size_draws_no_budget(capacity: object) -> None:
    """10**400 was a traceback (OverflowError in the plot's label); -1 drew a budget of
    -1 B that every kernel was 'over'."""
    from memprobe.report.headline import gpu_capacity

    assert gpu_capacity({"device": "cuda", "device_memory_bytes": capacity}) is None


def test_a_cuda_runs_capacity_past_any_size_renders(
    run_cli, made_run: Path, tmp_path: Path
) -> None:
    run = _cuda_run(made_run, tmp_path, 10**400)
    code, out, err = run_cli("report", str(run), "--out", str(tmp_path / "page.html"))
    assert code == 0 and "Traceback" not in err, err
    page = (tmp_path / "page.html").read_text()
    assert "budget (the GPU&#39;s capacity): none" not in page and "-1 B" not in page


def test_a_cuda_runs_real_capacity_is_still_drawn(run_cli, made_run: Path, tmp_path: Path):
    run = _cuda_run(made_run, tmp_path, 80 * 2**30)
    assert run_cli("report", str(run), "--out", str(tmp_path / "page.html"))[0] == 0
    assert "80.00 GiB" in (tmp_path / "page.html").read_text()


# -- a run.json that says cuda, with a GPU's capacity, over rows simulated on meta (edited,
# or two runs' files mixed): the page drew "the GPU's capacity" as the budget of a
# simulation. Only rows measured on cuda meet a GPU's capacity.
def test_a_gpu_capacity_over_meta_rows_draws_no_budget(
    run_cli, made_run: Path, tmp_path: Path
) -> None:
    run = _cuda_run(made_run, tmp_path, 80 * 2**30, rows="meta")
    assert run_cli("report", str(run), "--out", str(tmp_path / "page.html"))[0] == 0
    page = (tmp_path / "page.html").read_text()
    assert "80.00 GiB" not in page and "GPU&#39;s capacity" not in page


# -- gate: a case that is not ok is named for what happened to it ----------------------

HAPPENED = {
    # status, note, peak: what the FAIL line says (a failed case "did not finish" before)
    "an error with a NaN peak": (
        {"status": "error", "note": "RuntimeError: boom", "peak_bytes": float("nan")},
        "case failed with an error (status error: RuntimeError: boom)",
    ),
    "an error with its peak measured": (
        {"status": "error", "note": "numerics check failed"},
        "case failed with an error (status error: numerics check failed)",
    ),
    "an oom": ({"status": "oom", "note": "CUDA out of memory"}, "case ran out of memory"),
    "skipped": ({"status": "skipped", "note": "needs 4 ranks"}, "case was skipped"),
    "a rank went silent": (
        {"status": "error", "note": "unfinished: rank 1 went silent", "peak_bytes": None},
        "case did not finish (status error: unfinished: rank 1 went silent)",
    ),
}


@pytest.mark.parametrize("what", sorted(HAPPENED))
def test_gate_says_what_happened_to_a_case(
    run_cli, made_run: Path, tmp_path: Path, monkeypatch, what: str
) -> None:
    edit, says = HAPPENED[what]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(GATE_TOML)
    run = _tamper(made_run, tmp_path, lambda row: row.update(edit))
    code, out, err = run_cli("gate", str(run))
    assert code == 1, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  FAIL")]
    assert says in line and line.endswith("; its limits are unverified"), line
    assert ("did not finish" in line) == (what == "a rank went silent")


# -- gate config: a limit without a unit that cannot be what its writer meant ----------

UNITLESS = {
    "1.5": "max_peak 1.5 is not a whole number of bytes (a size without a unit is bytes)",
    "58": "max_peak 58 has no unit, so it is 58 B",
    '"10"': "max_peak 10 has no unit, so it is 10 B",
    "0": "max_peak 0 has no unit, so it is 0 B",
    "1048575": "max_peak 1048575 has no unit, so it is 1,024.00 KiB",
    '"1_000"': "max_peak 1_000 has no unit, so it is 1,000 B",
}


@pytest.mark.parametrize("value", sorted(UNITLESS))
def test_a_max_peak_without_a_unit_below_a_mib_is_refused(
    run_cli, made_run: Path, tmp_path: Path, monkeypatch, value: str
) -> None:
    """`max_peak = 1.5` meant 1 byte: every case failed its rule as if it had regressed."""
    monkeypatch.chdir(tmp_path)
    rule = f'[tool.memprobe.gate]\nrules = [{{ kernel = "*", max_peak = {value} }}]\n'
    (tmp_path / "pyproject.toml").write_text(rule)
    err = one_line(*run_cli("gate", str(made_run), "--junit-xml", "j.xml"))
    assert UNITLESS[value] in err and "rules[0]" in err and "GiB" in err
    assert not (tmp_path / "j.xml").exists()


@pytest.mark.parametrize("value", ['"1.5 GiB"', '"58 B"', '"0 B"', "1048576", "2e10"])
def test_a_max_peak_with_a_unit_or_of_a_plausible_size_is_read(
    run_cli, made_run: Path, tmp_path: Path, monkeypatch, value: str
) -> None:
    monkeypatch.chdir(tmp_path)
    rule = f'[tool.memprobe.gate]\nrules = [{{ kernel = "*", max_peak = {value} }}]\n'
    (tmp_path / "pyproject.toml").write_text(rule)
    code, out, err = run_cli("gate", str(made_run))
    assert code in (0, 1) and "limit" in out, err


def test_an_empty_device_list_in_a_rule_is_refused(
    run_cli, made_run: Path, tmp_path: Path, monkeypatch
) -> None:
    """`device = []` read as a filter nothing passes: 'matches no case', naming 'device='."""
    monkeypatch.chdir(tmp_path)
    rule = '[tool.memprobe.gate]\nrules = [{ kernel = "*", device = [], max_peak = "1 GiB" }]\n'
    (tmp_path / "pyproject.toml").write_text(rule)
    err = one_line(*run_cli("gate", str(made_run)))
    assert "rules[0]: 'device' is an empty list" in err


# -- gate: no report lands on a file the gate read, or on the run's own files ----------


def _snapshot_of(run: Path) -> Path:
    return sorted((run / "snapshots").glob("*.pickle"))[0]


SUMMARY_ON = {
    "results.json": lambda here, run: run / "results.json",
    "the config": lambda here, run: here / "pyproject.toml",
    "a snapshot": lambda here, run: _snapshot_of(run),
    "the baseline": lambda here, run: here / "base.json",
    "a link to results.csv": lambda here, run: _link(here / "s.md", run / "results.csv"),
    "a hard link to run.json": lambda here, run: _hard(here / "h.md", run / "run.json"),
}


def _link(path: Path, to: Path) -> Path:
    path.symlink_to(to)
    return path


def _hard(path: Path, to: Path) -> Path:
    path.hardlink_to(to)
    return path


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", sorted(SUMMARY_ON))
def test_the_step_summary_is_never_appended_to_an_input(
    run_cli, made_run: Path, tmp_path: Path, monkeypatch, where: str
) -> None:
    """GITHUB_STEP_SUMMARY naming the results appended Markdown to them: the run's
    results.json no longer read as JSON."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(GATE_TOML)
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    shutil.copy(run / "results.json", tmp_path / "base.json")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(SUMMARY_ON[where](tmp_path, run)))
    before = _tree(tmp_path)
    code, out, err = run_cli("gate", "run", "--baseline", "base.json")
    assert code == 0 and "passed" in out, err
    (warning,) = err.strip().splitlines()
    assert warning.startswith("memprobe: warning: did not append to GITHUB_STEP_SUMMARY")
    assert warning.endswith("an input of this command")
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("name", ["report.html", "timeline.png", "results.csv"])
def test_junit_never_replaces_a_file_of_the_run(
    run_cli, made_run: Path, tmp_path: Path, monkeypatch, name: str
) -> None:
    """The run's report.html was replaced by the gate's JUnit XML (only run.json, the
    results and snapshots/ were guarded)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(GATE_TOML)
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    before = _tree(run)
    for flag in ("--junit-xml", "--update-baseline"):
        err = one_line(*run_cli("gate", "run", flag, f"run/{name}"))
        assert f"would overwrite run/{name}, an input of this command" in err
    assert _tree(run) == before


# -- sweep --resume: a run's snapshots are written inside it ---------------------------


def _unfinished(made_run: Path, to: Path) -> Path:
    """A copy of the run with its one row gone: resuming it runs the case again."""
    run = to / "run"
    shutil.copytree(made_run, run)
    data = json.loads((run / "results.json").read_text())
    data["rows"] = []
    (run / "results.json").write_text(json.dumps(data))
    return run


@pytest.mark.parametrize(
    "make", ["a link to a folder outside", "a link to the run itself", "a file", "a FIFO"]
)
def test_resume_refuses_a_snapshots_folder_that_is_not_the_runs(
    run_cli, made_run: Path, tmp_path: Path, make: str
) -> None:
    """snapshots -> / made `sweep --resume` write its pickles into the root folder."""
    import os

    run = _unfinished(made_run, tmp_path)
    shutil.rmtree(run / "snapshots")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if make == "a link to a folder outside":
        (run / "snapshots").symlink_to(elsewhere)
    elif make == "a link to the run itself":
        (run / "snapshots").symlink_to(run)
    elif make == "a file":
        (run / "snapshots").write_text("x")
    else:
        os.mkfifo(run / "snapshots")
    before = _tree(run)
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert f"cannot resume {run}: {run / 'snapshots'} is" in err
    assert not list(elsewhere.iterdir()) and _tree(run) == before


def test_resume_still_makes_a_missing_snapshots_folder(
    run_cli, made_run: Path, tmp_path: Path
) -> None:
    run = _unfinished(made_run, tmp_path)
    shutil.rmtree(run / "snapshots")
    code, _, err = run_cli("sweep", "--resume", str(run), "-q", "--no-verify", "--no-report")
    assert code == 0, err
    assert len(list((run / "snapshots").glob("*.pickle"))) == 1


# The row's columns name the planned case; its case_id (and snapshot) another, or none.
IDENTITIES = {
    "another case's id": "local_chunked-b1-s64-v128-bf16-c1024-tp1-cp1-meta-00000000",
    "the right prefix, a wrong hash": "unchunked-b1-s64-v128-bf16-c1024-tp1-cp1-meta-deadbeef",
    "an id of no case": "x",
}


@pytest.mark.parametrize("what", sorted(IDENTITIES))
def test_resume_runs_again_a_row_whose_case_id_is_not_its_case(
    run_cli, made_run: Path, tmp_path: Path, what: str
) -> None:
    """It was kept as the case's row: report and gate then judged a row that may be
    another case's measurement (see the comment in sweep.open_run for why not refuse)."""
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    data = json.loads((run / "results.json").read_text())
    (row,) = data["rows"]
    right = row["case_id"]
    # A measurement of 1 byte throughout (a row that agrees with itself) marks the row kept.
    row.update(case_id=IDENTITIES[what], peak_bytes=1, forward_peak_bytes=1)
    row.update(backward_peak_bytes=1, floor_bytes=1)
    (run / "results.json").write_text(json.dumps(data))
    code, _, err = run_cli("sweep", "--resume", str(run), "-q", "--no-verify", "--no-report")
    assert code == 0, err
    (again,) = json.loads((run / "results.json").read_text())["rows"]
    assert again["case_id"] == right and again["peak_bytes"] > 1
    assert again["snapshot"] == f"snapshots/{right}.pickle"


def test_resume_keeps_a_row_whose_case_id_is_its_case(
    run_cli, made_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    before = (run / "results.json").read_bytes()
    code, _, err = run_cli("sweep", "--resume", str(run), "-q", "--no-verify", "--no-report")
    assert code == 0, err
    assert (run / "results.json").read_bytes() == before  # nothing ran again


# -- plan --other-from: snapshots of another job, and an "other" past the budget -------

PLAN = ["plan", "--budget", "1GiB", "--kernel", "local_chunked", "--no-reserved"]


@pytest.mark.parametrize("vocab", ["128", "131072", "257"])
def test_other_from_a_step_at_another_vocabulary_is_refused(
    run_cli, step_snapshot: Path, vocab: str
) -> None:
    """Read as this job's "other": the answer planned a job whose lm_head the file lacks."""
    err = one_line(*run_cli(*PLAN, "--vocab", vocab, "--other-from", str(step_snapshot)))
    assert f"its loss is over a vocabulary of 256, and this plan's --vocab is {int(vocab):,}" in err


def test_other_from_past_the_budget_names_other_from(
    run_cli, step_snapshot: Path, tmp_path: Path
) -> None:
    """It said '--other 1.00 GiB is more than --budget': a flag the user never gave."""
    data = pickle.loads(step_snapshot.read_bytes())
    data["device_traces"][0].insert(
        4, {"action": "alloc", "addr": 2**45, "size": 2**30, "stream": 0, "frames": []}
    )
    big = tmp_path / "big.pickle"
    big.write_bytes(pickle.dumps(data, protocol=4))
    for others in ([big], [big, step_snapshot]):
        paths = ",".join(map(str, others))
        err = one_line(*run_cli(*PLAN, "--vocab", "256", "--other-from", paths))
        assert "the rest of the job read from --other-from holds 1.00 GiB" in err
        assert "--other " not in err and "more than --budget 1.00 GiB" in err


def test_other_from_at_the_plans_vocabulary_still_plans(run_cli, step_snapshot: Path) -> None:
    code, out, err = run_cli(*PLAN, "--vocab", "256", "--other-from", str(step_snapshot))
    assert code == 0 and "other: 72.50 KiB, read from 1 snapshot" in out, err


# -- snapshot fields read for what they are, not for what bool() or int() makes of them --


def _edited(snapshot: Path, to: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    data = pickle.loads(snapshot.read_bytes())
    edit(data)
    to.write_bytes(pickle.dumps(data, protocol=4))
    return to


def _oom(size: int, free: object) -> Callable[[dict[str, Any]], None]:
    entry = {"action": "oom", "size": size, "device_free": free, "stream": 0, "frames": []}
    return lambda data: data["device_traces"][0].append(entry)


@pytest.mark.parametrize("free", [-1, -(2**40), "lots", 1.5, None])
def test_an_ooms_free_bytes_that_are_no_size_read_as_unknown(
    run_cli, step_snapshot: Path, tmp_path: Path, free: object
) -> None:
    """device_free -1 printed 'at that moment: -1 B free on the device'."""
    bad = _edited(step_snapshot, tmp_path / "s.pickle", _oom(2**30, free))
    code, out, err = run_cli("attribute", str(bad), "--top", "1")
    assert code == 0, err
    assert "at that moment: unknown free on the device" in out and "-1 B" not in out


@pytest.mark.parametrize("command", ["attribute", "diff", "--replay"])
def test_an_oom_of_no_bytes_is_refused(
    run_cli, step_snapshot: Path, tmp_path: Path, command: str
) -> None:
    """An OOM 'requested 0 B' got the verdict 'fragmentation: the request would have fit
    ... but no single free block was large enough'."""
    bad = _edited(step_snapshot, tmp_path / "s.pickle", _oom(0, 0))
    args = {
        "attribute": ["attribute", str(bad)],
        "diff": ["diff", str(step_snapshot), str(bad)],
        "--replay": ["attribute", str(bad), "--replay"],
    }[command]
    err = one_line(*run_cli(*args))
    assert "device_traces[0][34] (oom) requests 0 bytes" in err


@pytest.mark.parametrize("flag", ["False", "no", 1.0, [1], "True"])
def test_a_segments_expandable_flag_is_a_bool(
    run_cli, step_snapshot: Path, tmp_path: Path, flag: object
) -> None:
    """is_expandable "False" read as an expandable segment (bool("False") is True)."""
    bad = _edited(
        step_snapshot, tmp_path / "s.pickle", lambda d: d["segments"][0].update(is_expandable=flag)
    )
    code, out, err = run_cli("attribute", str(bad), "--top", "1", "--replay")
    assert code == 0, err
    assert "(0 large, 1 small, 0 expandable)" in out
    assert "default settings" in out and "expandable_segments:True" not in out


DIVISIONS = {
    "a '>' key": {">": 4, "1": 2},
    "a key of 2**70": {2**70: 1},
    "a negative count": {"1": -3},
    "a count of 3": {"1": 3},
    "a float count": {"1": 2.0},
    "a key that is no number": {"x": 2},
    "a bool count": {"1": True},
}


@pytest.mark.parametrize("what", sorted(DIVISIONS))
def test_a_divisions_table_torch_never_writes_leaves_the_defaults(
    run_cli, step_snapshot: Path, tmp_path: Path, what: str
) -> None:
    """A '>' key was a ValueError traceback from --replay."""

    def edit(data: dict[str, Any]) -> None:
        data["allocator_settings"]["roundup_power2_divisions"] = DIVISIONS[what]

    bad = _edited(step_snapshot, tmp_path / "s.pickle", edit)
    code, out, err = run_cli("attribute", str(bad), "--top", "1", "--replay")
    assert code == 0 and "Traceback" not in err, err
    assert "replay on device 0 (memprobe's caching-allocator model, default settings" in out


def test_torchs_divisions_table_is_still_read(run_cli, step_snapshot: Path, tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        table = {str(2**i): 4 for i in range(16)}
        data["allocator_settings"]["roundup_power2_divisions"] = table

    bad = _edited(step_snapshot, tmp_path / "s.pickle", edit)
    code, out, _ = run_cli("attribute", str(bad), "--top", "1", "--replay")
    assert code == 0 and "roundup_power2_divisions:" in out


@pytest.mark.parametrize("how", ["config", "flag"])
def test_a_baseline_that_is_a_folder_is_not_called_missing(
    run_cli, made_run: Path, tmp_path: Path, monkeypatch, how: str
) -> None:
    """It said the folder 'does not exist yet' and to make it with --update-baseline,
    which cannot write a folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ci").mkdir()
    config = GATE_TOML + ('baseline = "ci"\n' if how == "config" else "")
    (tmp_path / "pyproject.toml").write_text(config)
    args = ["gate", str(made_run)] + (["--baseline", "ci"] if how == "flag" else [])
    err = one_line(*run_cli(*args))
    assert "ci is a folder with no results.json in it" in err and "does not exist" not in err


@pytest.mark.parametrize(
    "conf", ["backend:cudaMallocAsync", "expandable_segments:True,backend:cudaMallocAsync"]
)
def test_a_replay_what_if_under_a_backend_memprobe_does_not_model_is_refused(
    run_cli, step_snapshot: Path, conf: str
) -> None:
    """'what-if backend:cudaMallocAsync: this job would have reserved 2.00 MiB' was the
    native allocator's figure, said of another allocator."""
    err = one_line(*run_cli("attribute", str(step_snapshot), "--replay", "--alloc-conf", conf))
    assert "not backend:cudaMallocAsync" in err


def test_an_output_under_an_input_folder_that_is_a_link_names_where_it_leads(
    run_cli, made_run: Path, tmp_path: Path, monkeypatch
) -> None:
    """snapshots -> / refused report --out p.html as 'would overwrite run/snapshots'."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    shutil.rmtree(run / "snapshots")
    (run / "snapshots").symlink_to(tmp_path)
    err = one_line(*run_cli("report", "run", "--out", "p.html"))
    assert f"--out p.html would write inside run/snapshots (a link to {tmp_path})" in err
    assert not (tmp_path / "p.html").exists()
