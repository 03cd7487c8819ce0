"""Hostile inputs, round 14, files a user hands memprobe that are each valid alone but do
not belong together. Each table is a variant of a defect class the pass found: one line
and exit 2, never a page that mixes two runs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, swept

Rows = list[dict[str, Any]]


def _copy(made_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    return run


def _edit_rows(run: Path, edit: Callable[[Rows], Rows]) -> None:
    payload = json.loads((run / "results.json").read_text())
    payload["rows"] = edit(payload["rows"])
    (run / "results.json").write_text(json.dumps(payload))


def _edit_cases(run: Path, edit: Callable[[Rows], Rows]) -> None:
    meta = json.loads((run / "run.json").read_text())
    meta["cases"] = edit(meta["cases"])
    (run / "run.json").write_text(json.dumps(meta))


def _another(rows: Rows, **change: Any) -> Rows:
    return [{**row, **change, "case_id": None} for row in rows]


# -- a results.json from another run beside this run.json: the page headed the other run's
# rows with this run.json's device, GPU capacity (the default --budget), command and date,
# where `sweep --resume` of the same folder refuses them


MIXED: dict[str, tuple[Callable[[Path], None], str]] = {
    "rows of another vocabulary": (
        lambda run: _edit_rows(run, lambda rows: _another(rows, vocab=256)),
        "results row 0 is a case its run.json did not plan (1 such row(s))",
    ),
    "a row more, of another kernel": (
        lambda run: _edit_rows(run, lambda rows: rows + _another(rows, kernel="local_chunked")),
        "results row 1 is a case its run.json did not plan (1 such row(s))",
    ),
    "rows measured on another device": (
        lambda run: _edit_rows(run, lambda rows: _another(rows, device="cpu")),
        "results row 0 is a case its run.json did not plan",
    ),
    "a run.json planning other tokens": (
        lambda run: _edit_cases(run, lambda cases: [{**c, "tokens": 128} for c in cases]),
        "results row 0 is a case its run.json did not plan",
    ),
    "a run.json planning nothing": (
        lambda run: _edit_cases(run, lambda cases: []),
        "results row 0 is a case its run.json did not plan",
    ),
}


@pytest.mark.parametrize("what", sorted(MIXED))
def test_report_refuses_results_its_run_json_did_not_plan(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str
) -> None:
    mix, says = MIXED[what]
    run = _copy(made_run, tmp_path)
    mix(run)
    before = (run / "report.html").read_bytes()
    err = one_line(*run_cli("report", str(run)))
    assert f"cannot report {run}: {says}" in err and "another run's device" in err, err
    assert (run / "report.html").read_bytes() == before  # the earlier page is kept


@pytest.mark.parametrize(
    "edit",
    [
        lambda run: _edit_rows(run, lambda rows: rows[::-1]),
        lambda run: _edit_cases(
            run, lambda cases: cases + [{**cases[0], "kernel": "local_chunked"}]
        ),  # a case planned, not yet run: an unfinished run is still reported
    ],
    ids=["rows reordered", "a planned case not run yet"],
)
def test_report_reads_rows_its_run_json_planned(
    run_cli: Any, made_run: Path, tmp_path: Path, edit: Callable[[Path], None]
) -> None:
    run = _copy(made_run, tmp_path)
    edit(run)
    code, out, err = run_cli("report", str(run), "--out", str(tmp_path / "page.html"))
    assert code == 0 and out.strip() == f"report: {tmp_path / 'page.html'}", err


# -- a baseline whose case_id disagrees with its columns (cases matched by their columns,
# failures explained by id): two rows' ids swapped told unchunked's regression with
# local_chunked's snapshot and line, and a case that disappeared was explained by the
# snapshot of the row of these results that bears its id


@pytest.fixture(scope="module")
def two_kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return swept(
        tmp_path_factory.mktemp("two") / "run",
        *("--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked,local_chunked"),
        *("--device", "meta", "-q", "--no-verify", "--no-report"),
    )


def _baseline(run: Path, tmp_path: Path, edit: Callable[[Rows], Rows]) -> str:
    payload = json.loads((run / "results.json").read_text())
    # 512 B less at every peak, so the baseline's rows still agree with themselves.
    less = ("peak_bytes", "forward_peak_bytes", "backward_peak_bytes")
    payload["rows"] = edit([{**r, **{k: r[k] - 512 for k in less}} for r in payload["rows"]])
    path = tmp_path / "base.json"
    path.write_text(json.dumps(payload))
    return str(path)


def _swap_ids(rows: Rows) -> Rows:
    rows[0]["case_id"], rows[1]["case_id"] = rows[1]["case_id"], rows[0]["case_id"]
    return rows


IDS: dict[str, Callable[[Rows], Rows]] = {
    "two rows' ids swapped": _swap_ids,
    "an id of no case": lambda rows: [{**r, "case_id": f"old-{i}"} for i, r in enumerate(rows)],
    "no id": lambda rows: [{k: v for k, v in r.items() if k != "case_id"} for r in rows],
}


@pytest.mark.parametrize("what", sorted(IDS))
def test_a_regression_is_explained_by_its_own_snapshot(
    run_cli: Any, two_kernels: Path, here: Path, what: str
) -> None:
    base = _baseline(two_kernels, here, IDS[what])
    code, out, err = run_cli("gate", str(two_kernels), "--baseline", base)
    assert code == 1 and "FAILED: 2 of 2" in out, (out, err)
    notes = {
        line.split("note: ")[1].split(":")[0]: line for line in out.splitlines() if "note: " in line
    }
    unchunked = notes["unchunked b1 s64 v128 bf16 c1024 meta"]
    local = notes["local_chunked b1 s64 v128 bf16 c1024 meta"]
    assert "autograd_reference.py" in unchunked and "snapshots/unchunked-" in unchunked
    assert "local_chunked.py" in local and "snapshots/local_chunked-" in local


def test_a_case_that_disappeared_is_not_explained_by_another(
    run_cli: Any, two_kernels: Path, here: Path
) -> None:
    # The local_chunked row at another chunk size, its id left as this run's case's.
    base = _baseline(two_kernels, here, lambda rows: [{**rows[1], "chunk_size": 2048}])
    code, out, err = run_cli("gate", str(two_kernels), "--baseline", base)
    assert code == 1 and "disappeared  local_chunked b1 s64 v128 bf16 c2048 meta" in out, (
        out,
        err,
    )
    assert "c2048 meta:" not in out and "snapshot " not in out, out


@pytest.mark.parametrize("chunk", [2048, 1, None])
def test_a_kernel_that_ignores_the_chunk_size_is_compared_across_chunk_sizes(
    run_cli: Any, two_kernels: Path, here: Path, chunk: int | None
) -> None:
    # A baseline swept with another --chunk-size: unchunked ran the same case (its row
    # records the first size given), local_chunked did not.
    def other_size(rows: Rows) -> Rows:
        return [{**r, "chunk_size": chunk, "case_id": f"old-{i}"} for i, r in enumerate(rows)]

    code, out, err = run_cli(
        "gate", str(two_kernels), "--baseline", _baseline(two_kernels, here, other_size)
    )
    assert code == 1 and "FAILED: 2 of 2" in out, (out, err)
    assert (
        f"disappeared  local_chunked b1 s64 v128 bf16 c{'none' if chunk is None else chunk} meta"
        in out
    )
    assert "disappeared  unchunked" not in out and "regression" in out, out
    assert "not in the baseline" in out, out  # local_chunked at c1024 is new


# -- plan --other-from of a snapshot whose loss step cannot be found: the refusal was
# --what-if's, word for word ("--what-if cuts exactly one"), to a user who never gave it


def _trace_of(run: Path, kernel: str) -> dict[str, Any]:
    import pickle

    rows = json.loads((run / "results.json").read_text())["rows"]
    row = next(r for r in rows if r["kernel"] == kernel)
    return pickle.loads((run / row["snapshot"]).read_bytes())


def _twice(run: Path, first: str, second: str) -> dict[str, Any]:
    one, two = _trace_of(run, first), _trace_of(run, second)
    later = [e for e in two["device_traces"][0] if e["action"] != "segment_alloc"]
    return {**one, "device_traces": [one["device_traces"][0] + later]}


def _small(run: Path) -> dict[str, Any]:
    snap = _trace_of(run, "unchunked")
    trace = snap["device_traces"][0]
    small = [{**e, "size": 512} if "segment" not in e["action"] else e for e in trace]
    return {**snap, "device_traces": [small]}


NO_STEP: dict[str, tuple[Callable[[Path], dict[str, Any]], str, str]] = {
    "two unchunked steps": (
        lambda run: _twice(run, "unchunked", "unchunked"),
        "the trace holds several loss steps (2 candidates): --other-from reads beside exactly one",
        "--what-if cuts exactly one",
    ),
    "two steps of memprobe's kernels": (
        lambda run: _twice(run, "local_chunked", "unchunked"),
        "(autograd_reference, local_chunked): --other-from reads beside exactly one",
        "--what-if cuts exactly one",
    ),
    "no [N, V] block": (
        _small,
        "no loss over [N, V] logits found in the snapshot: nothing to read beside (--other-from "
        "needs a step whose loss materializes the logits)",
        "nothing to replace (--what-if needs a step",
    ),
}


@pytest.mark.parametrize("what", sorted(NO_STEP))
def test_other_from_refusals_speak_of_other_from(
    run_cli: Any, two_kernels: Path, tmp_path: Path, what: str
) -> None:
    import pickle

    make, other_from_says, what_if_says = NO_STEP[what]
    snap = tmp_path / "step.pickle"
    snap.write_bytes(pickle.dumps(make(two_kernels)))
    plan = ["plan", "--vocab", "128", "--budget", "1MiB", "--kernel", "local_chunked"]
    err = one_line(*run_cli(*plan, "--other-from", str(snap)))
    assert f"--other-from {snap}: " in err and other_from_says in err, err
    assert "--what-if" not in err and "replace" not in err, err
    # --what-if itself still says what it does with the step.
    err = one_line(*run_cli("attribute", str(snap), "--what-if", "local_chunked"))
    assert what_if_says in err, err
