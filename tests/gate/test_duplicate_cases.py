"""A case appears once in results: duplicates (tampered, merged) are one error line, and
``--resume`` refuses rows its run.json never planned.

Before, the gate's baseline lookup kept the last duplicate: a copy with 50x the peak
ahead of the original passed, and a resumed run kept foreign rows for its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memprobe.errors import UserError
from memprobe.gate import evaluate
from memprobe.records import Case, Run
from memprobe.results import check_unique_cases, read_rows
from memprobe.sweep import plan_cases, run_sweep

PEAK = 11_022_795_008


def row(kernel: str = "local_chunked", tokens: int = 20000, peak: int = PEAK, **kw: Any):
    chunk = kw.pop("chunk_size", 1024)
    case = Case(kernel, 1, tokens, 131072, "bf16", chunk, 1, 1, kw.pop("device", "meta"))
    return Run(case, kw.pop("status", "ok"), peak_bytes=peak, big_fp32_blocks=0, **kw).row()


def results(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"memprobe_version": "test", "rows": rows}), encoding="utf-8")
    return path


GOOD = [row(), row("unchunked", peak=36_700_240_000), row(tokens=4096, peak=2_684_391_424)]
DUPLICATED = {
    # name: (rows, the indexes the error names)
    "50x copy ahead of the original": ([row(peak=50 * PEAK), *GOOD], (0, 1)),
    "copy after the original": ([*GOOD, row(peak=PEAK // 2)], (0, 3)),
    "same case, other status": ([*GOOD, row(status="oom", peak=None)], (0, 3)),
    "same case, other note": ([*GOOD[:2], row(note="edited"), *GOOD[2:]], (0, 2)),
    "three copies": ([row(), row(), row(), GOOD[1]], (0, 1)),
    "whole file twice": ([*GOOD, *GOOD], (0, 3)),
}


@pytest.mark.parametrize("name", DUPLICATED)
def test_duplicated_cases_in_a_results_file_are_an_error(tmp_path: Path, name: str) -> None:
    rows, (first, second) = DUPLICATED[name]
    file = results(tmp_path / "results.json", rows)
    with pytest.raises(UserError, match=rf"rows {first} and {second} are the same case"):
        read_rows(file)


@pytest.mark.parametrize(
    "rows",
    [
        [row(), row(chunk_size=512)],  # another chunk size is another case
        [row(), row(device="cpu")],
        [row(), row(tokens=20001)],
        [row(), row("local_chunked_inplace")],
    ],
)
def test_cases_differing_in_any_key_are_not_duplicates(tmp_path: Path, rows) -> None:
    assert len(read_rows(results(tmp_path / "results.json", rows))) == 2


@pytest.mark.parametrize("where", ["baseline", "results"])
@pytest.mark.parametrize("name", ["50x copy ahead of the original", "copy after the original"])
def test_gate_refuses_duplicates_in_results_or_baseline(
    tmp_path: Path, monkeypatch, run_cli, where: str, name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n", encoding="utf-8")
    tampered = DUPLICATED[name][0]
    results(tmp_path / "base.json", tampered if where == "baseline" else GOOD)
    results(tmp_path / "run" / "results.json", tampered if where == "results" else GOOD)
    code, out, err = run_cli("gate", "run", "--baseline", "base.json")
    assert code == 2 and out == ""
    assert "are the same case" in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_evaluate_refuses_duplicates_from_library_callers() -> None:
    with pytest.raises(UserError, match="the baseline: rows 0 and 1 are the same case"):
        evaluate(GOOD, (), results="r", baseline=[row(peak=50 * PEAK), *GOOD])
    with pytest.raises(UserError, match="r: rows 0 and 3"):
        evaluate([*GOOD, row()], (), results="r")
    check_unique_cases(GOOD, "fine")  # no error


# -- resume ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "run"
    cases = plan_cases(
        tokens=[256], vocab=[1024], kernel=["unchunked", "local_chunked"], chunk_size=[64],
        device="meta", ladder=False,
    )  # fmt: skip
    run_sweep(cases, out, verify=False, snapshots=False)
    return out


def _tamper(run: Path, dst: Path, edit) -> Path:
    import shutil

    shutil.copytree(run, dst)
    payload = json.loads((dst / "results.json").read_text())
    payload["rows"] = edit(payload["rows"])
    (dst / "results.json").write_text(json.dumps(payload))
    return dst


def _other(rows: list[dict[str, Any]], **change: Any) -> list[dict[str, Any]]:
    return [*rows, {**rows[0], **change, "case_id": None}]


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda rows: [*rows, rows[0]], "rows 0 and 2 are the same case"),
        (lambda rows: [rows[1], *rows], "rows 0 and 2 are the same case"),
        (lambda rows: _other(rows, tokens=512), "row 2 is a case its run.json did not plan"),
        (lambda rows: _other(rows, device="cpu"), "row 2 is a case its run.json did not plan"),
        (lambda rows: _other(rows, kernel="filtered"), "row 2 is a case its run.json did not"),
        (lambda rows: [{**rows[0], "vocab": 2048}], "row 0 is a case its run.json did not plan"),
    ],
)
def test_resume_refuses_duplicates_and_unplanned_rows(
    finished_run: Path, tmp_path: Path, run_cli, edit, says: str
) -> None:
    run = _tamper(finished_run, tmp_path / "run", edit)
    before = (run / "results.json").read_bytes()
    code, out, err = run_cli("sweep", "--resume", str(run), "--quiet")
    assert code == 2, out
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (run / "results.json").read_bytes() == before  # nothing rewritten


def test_resume_of_an_untouched_run_still_works(finished_run: Path, tmp_path: Path) -> None:
    run = _tamper(finished_run, tmp_path / "run", lambda rows: rows[:1])
    frame = run_sweep([], run, resume=True, verify=False, snapshots=False)
    assert len(frame) == 2 and frame["case_id"].is_unique
