"""The one owner of a run directory: ``run.json``, ``results.csv``/``results.json``, snapshots.

A run directory holds ``run.json`` (versions, device, command, the planned cases),
``results.csv`` and ``results.json`` (one row per finished case) and
``snapshots/<case_id>.pickle``. Rows are rewritten by atomic replace after every case, so
an interrupt or a crash loses nothing finished.

Everything that reads results goes through :func:`read_rows`, which validates each row: a
tampered or foreign file is one :class:`UserError`, never a traceback further down. No
torch import here: reading results must stay cheap.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pandas as pd

from memprobe import __version__
from memprobe.allocator import AllocConf, parse_alloc_conf
from memprobe.errors import UserError
from memprobe.io.codec import nests_past
from memprobe.io.files import leads_out, read_regular, refuse_non_folder, write_atomic
from memprobe.io.text import printable, quoted, shell_word, unique_keys
from memprobe.records import DEVICES, DTYPES, RESULT_COLUMNS, STATUSES, Case, Run
from memprobe.results_errors import (
    contradiction,
    link_to_nothing,
    not_a_run_record,
    not_results,
    twice_in,
    unreadable_case,
)

RUN_META = "run.json"
RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
SNAPSHOTS = "snapshots"
# A sweep of thousands of cases writes a few MB; the cap stops /dev/zero, not real runs.
MAX_JSON_BYTES = 256 * 2**20
MAX_FLOAT = 1e100
# Cases one run holds at most: each finished case rewrites the results files whole (so
# that nothing finished is lost), which costs about 1 s per case at 20,000 rows. A
# results file or plan of more is none a sweep wrote, and report and gate would read and
# draw it for minutes (50,000 rows: over five).
MAX_CASES = 10_000

# What identifies a case across runs (resume, gate baselines, the report). Not
# case_id: its hash changes whenever Case grows a field, which would make every
# case of an older baseline "disappear".
KEY_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Case))
CaseKey = tuple[Any, ...]
Row = Mapping[str, Any]

# Whole-number columns: pandas turns them into floats when a value is missing.
INT_COLUMNS = frozenset(f.name for f in (*fields(Case), *fields(Run)) if str(f.type)[:3] == "int")
_FLOAT_COLUMNS = frozenset(f.name for f in fields(Run) if f.type == "float | None")
_POSITIVE = ("batch", "tokens", "vocab", "tp", "cp")
# What the sweep writes in a row's snapshot column; anything else (a URL, "..") is tampering.
_SNAPSHOT_PATH = re.compile(rf"{SNAPSHOTS}/[A-Za-z0-9._-]+\.pickle")


def case_key(row: Row) -> CaseKey:
    """The stable identity of a row's case (see :data:`KEY_COLUMNS`)."""
    return tuple(row.get(k) for k in KEY_COLUMNS)


# The note of a row recorded for a case that never finished (a ``--shard`` rank went
# silent on it): ``--resume`` runs such a case again instead of keeping the row.
UNFINISHED = "unfinished: "


def unfinished(row: Row) -> bool:
    return row.get("status") == "error" and str(row.get("note") or "").startswith(UNFINISHED)


def missing(value: Any) -> bool:
    """The one test for "no value": None, NaN, pandas NA."""
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and math.isnan(value)


def clean_value(key: str, value: Any) -> Any:
    """A table cell as a plain Python value: NaN/inf → None, whole-number columns as int."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalar → Python
    if missing(value) or (isinstance(value, float) and not math.isfinite(value)):
        return None
    if key in INT_COLUMNS and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def frame_of(rows: Iterable[Row]) -> pd.DataFrame:
    """Rows → the results table, columns in :data:`RESULT_COLUMNS` order."""
    return pd.DataFrame(list(rows), columns=list(RESULT_COLUMNS))


def rows_of(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The table's rows as plain Python values (see :func:`clean_value`)."""
    return [
        {str(k): clean_value(str(k), v) for k, v in record.items()}
        for record in frame.to_dict(orient="records")
    ]


# -- validation ----------------------------------------------------------------


def _bad(file: Path, index: int, what: str) -> UserError:
    return UserError(
        f"{file}: row {index} {what}", "the file is damaged or not memprobe's; re-run the sweep"
    )


def validate_row(row: Any, index: int, file: Path) -> dict[str, Any]:
    """One row of a results file, checked: types, ranges, a known status."""
    if not isinstance(row, dict):
        raise _bad(file, index, f"is a {type(row).__name__}, not an object")
    absent = [c for c in ("kernel", *_POSITIVE, "dtype", "status") if c not in row]
    if absent:
        raise _bad(file, index, f"has no {', '.join(absent)}")
    clean: dict[str, Any] = {}
    for key in RESULT_COLUMNS:
        if isinstance(row.get(key), float) and math.isinf(row[key]):  # else read as empty
            raise _bad(file, index, f"{key} is infinite (Infinity, or past a float: 1e400)")
        value = clean_value(key, row.get(key))
        if value is None:
            clean[key] = None
            continue
        if key in INT_COLUMNS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad(file, index, f"{key} {quoted(value)} is not a whole number")
            if value < 0 or value >= 2**63:
                raise _bad(file, index, f"{key} {quoted(value)} is out of range")
        elif key in _FLOAT_COLUMNS:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _bad(file, index, f"{key} {quoted(value)} is not a number")
            # Times and errors are far below this; past it, arithmetic on them overflows.
            if not abs(value) < MAX_FLOAT:
                shown = f"{value:g}" if isinstance(value, float) else f"of {len(str(value))} digits"
                raise _bad(file, index, f"{key} {shown} is out of range")
            # A time or an absolute error below zero: what the page and the plan's
            # chunk pick would read is no measurement.
            if value < 0:
                raise _bad(file, index, f"{key} {value:g} is negative")
            value = float(value)
        elif not isinstance(value, str):
            raise _bad(file, index, f"{key} {quoted(value)} is not text")
        elif key in KEY_COLUMNS and not value.isprintable():
            # A case's identity is matched against run.json and baselines: never rewritten.
            raise _bad(file, index, f"{key} {quoted(value)} holds unprintable characters")
        else:
            value = printable(value)  # a note can quote a CUDA error with escape codes
        clean[key] = value
    for key in _POSITIVE:
        if clean[key] is None or clean[key] <= 0:
            raise _bad(file, index, f"{key} {quoted(clean[key])} is not a positive whole number")
    if not clean["kernel"]:
        raise _bad(file, index, "has an empty kernel name")
    if clean["status"] not in STATUSES:
        raise _bad(
            file, index, f"status {quoted(clean['status'])} is not one of {', '.join(STATUSES)}"
        )
    if clean["dtype"] not in DTYPES:
        raise _bad(file, index, f"dtype {quoted(clean['dtype'])} is not one of {', '.join(DTYPES)}")
    if clean["device"] is not None and clean["device"] not in DEVICES:
        # A device memprobe never ran on ("tpu", or "auto", which a run resolves): gate and
        # report would judge and draw it as if one of them had measured it.
        raise _bad(
            file, index, f"device {quoted(clean['device'])} is not one of {', '.join(DEVICES)}"
        )
    for key in ("hidden", "floor_bytes", "peak_bytes"):
        # H sizes the hidden family's inputs; a floor and a peak hold at least the logits:
        # none is ever 0 (a ratio over a floor of 0 has no value; a peak of 0 passed the
        # gate as the best row there is and sent the report's log axis to a warning).
        if clean[key] == 0:
            raise _bad(file, index, f"{key} 0 is not positive")
    snapshot = clean["snapshot"]
    if snapshot is not None and not _SNAPSHOT_PATH.fullmatch(snapshot):
        raise _bad(file, index, f"snapshot {quoted(snapshot)} is not a path under {SNAPSHOTS}/")
    chunk = clean["chunk_size"]
    if chunk is not None and chunk <= 0:
        raise _bad(file, index, f"chunk_size {chunk} is not positive")
    said = contradiction(clean)
    if said:
        raise _bad(file, index, said)
    if not clean.get("case_id"):
        clean["case_id"] = _case_from_row(clean).case_id
    return clean


def _case_from_row(row: Row) -> Case:
    return Case(**{k: row[k] for k in KEY_COLUMNS})


def identity_agrees(row: Row) -> bool:
    """Whether a validated row's case_id is the id of the case its columns describe."""
    return row.get("case_id") == _case_from_row(row).case_id


def case_of(row: Row) -> Case:
    """The Case a validated row describes."""
    return _case_from_row(row)


# -- reading -------------------------------------------------------------------


def results_file(path: str | Path) -> Path:
    p = Path(path)
    return p / RESULTS_JSON if p.is_dir() else p


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """A run directory or a results.json → validated rows (UserError when missing or bad)."""
    file = results_file(path)
    if not file.exists():
        raise link_to_nothing(file) or UserError(
            f"no results at {file}", "give a run directory or its results.json"
        )
    raw = read_regular(file, what="results", max_bytes=MAX_JSON_BYTES)
    try:
        payload = json.loads(raw, object_pairs_hook=unique_keys)
        rows = payload["rows"]
        if not isinstance(rows, list):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        # A run's results.json that is no results is damaged; the run's other files
        # (results.csv, run.json, report.html) are whole, only not what is read here.
        ours = file.name == RESULTS_JSON and (file.parent / RUN_META).is_file()
        raise not_results(file, raw, exc, in_a_run=ours) from None
    _check_count(len(rows), file, "rows")
    checked = [validate_row(row, i, file) for i, row in enumerate(rows)]
    check_unique_cases(checked, str(file))
    return checked


def _check_count(count: int, file: Path, what: str) -> None:
    if count > MAX_CASES:
        raise UserError(
            f"{file} holds {count:,} {what}; a run holds at most {MAX_CASES:,} cases",
            "the file is damaged or not memprobe's; re-run the sweep",
        )


def check_unique_cases(rows: Sequence[Row], source: str) -> None:
    """Results hold each case once: a second row for one case is tampering or a foreign
    merge, and any reader (the gate's baseline lookup, resume) would have to pick one of
    them silently. ``source`` names where the rows came from."""
    first: dict[CaseKey, int] = {}
    for i, row in enumerate(rows):
        j = first.setdefault(case_key(row), i)
        if j != i:
            raise UserError(
                f"{source}: rows {j} and {i} are the same case ({row.get('case_id')}); "
                "a results file holds each case once",
                "the file is damaged or edited; re-run the sweep",
            )


def unplanned_rows(rows: Sequence[Row], cases: Sequence[Case]) -> list[int]:
    """Indexes of rows whose case is not one of ``cases`` (those run.json planned)."""
    planned = {case_key(asdict(c)) for c in cases}
    return [i for i, r in enumerate(rows) if case_key(r) not in planned]


def in_plan_order(rows: Sequence[Row], position: Mapping[CaseKey, int]) -> list[dict[str, Any]]:
    """``rows`` in the order run.json's plan lists their cases (``position``, from
    :func:`plan_positions`, made once per run), so a run's files read the same however
    its cases were run: one process, resumed, or shared out across ranks (which finish
    them in any order). A row of no planned case goes last."""
    return sorted((dict(r) for r in rows), key=lambda r: position.get(case_key(r), len(position)))


def plan_positions(cases: Sequence[Case]) -> dict[CaseKey, int]:
    """Each planned case's place in run.json's plan, by its key. Read field by field: a
    sweep sorts its rows after every case, and ``asdict`` deep-copies (5 s a call at
    57,600 cases)."""
    return {tuple(getattr(c, k) for k in KEY_COLUMNS): i for i, c in enumerate(cases)}


def read_results(path: str | Path) -> pd.DataFrame:
    """A run directory or its results.json → the results table."""
    return frame_of(read_rows(path))


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    file = run_dir / RUN_META
    not_a_run = UserError(
        f"{run_dir} is not a memprobe run (no readable {RUN_META})", "give a run directory"
    )
    if not file.exists():
        raise not_a_run
    try:
        raw = read_regular(file, what="run file", max_bytes=MAX_JSON_BYTES)
        meta = json.loads(raw, object_pairs_hook=unique_keys)
    except (OSError, ValueError, RecursionError) as exc:
        raise twice_in(file, exc) or not_a_run from None
    # JSON that parses but is no run record was "no readable run.json", of a file that
    # read: say what it holds instead.
    said = not_a_run_record(meta)
    if said:
        raise UserError(f"{file} {said}", "give a run directory made by `memprobe sweep`")
    if nests_past(meta, MAX_META_DEPTH):
        # The page walks run.json's text recursively (to make it inert): 600 levels of an
        # extra key, which JSON still parses, ended `report` in a RecursionError, or not,
        # as deep as the stack already was.
        raise UserError(
            f"{file} nests deeper than {MAX_META_DEPTH} levels; memprobe's nests 3",
            "the file is damaged or not memprobe's; re-run the sweep",
        )
    return meta


# How deep run.json may nest lists and objects: memprobe writes 3 levels (the run, its
# cases, each case's fields).
MAX_META_DEPTH = 64


def recorded_alloc_conf(run_dir: Path) -> AllocConf | None:
    """The allocator settings a run being resumed started with, as its run.json records
    them, held to what a sweep runs under: its cases still to run are measured, and their
    reserved bytes modelled, under them. Settings run.json cannot hold (not text, or
    backend:cudaMallocAsync, which --alloc-conf refuses: the native model's reserved peak
    was written as that backend's) are refused, never read as torch's defaults."""
    recorded = read_run_meta(run_dir).get("alloc_conf")
    if recorded is None:
        return None  # a run.json without the key: torch's defaults, as it ran
    try:
        if not isinstance(recorded, str):
            raise UserError(f"{str(recorded)[:40]!r} is not settings text")
        conf = parse_alloc_conf(recorded)
        if not conf.is_modelled:
            raise UserError(f"memprobe models torch's native allocator, not {conf.backend}")
    except UserError as exc:
        raise UserError(
            f"cannot resume {run_dir}: its {RUN_META} records allocator settings "
            f"no sweep runs under ({exc.message})",
            "the run directory was edited or mixed with another; start a new run",
        ) from None
    return conf


def planned_cases(run_dir: Path) -> list[Case]:
    """The cases ``run.json`` recorded for a run."""
    meta = read_run_meta(run_dir)
    file = run_dir / RUN_META
    _check_count(len(meta["cases"]), file, "cases")
    cases = []
    for i, raw in enumerate(meta["cases"]):
        said = unreadable_case(raw, KEY_COLUMNS)
        if said:
            raise UserError(f"{file}: case {i} {said}", "start a new run")
        # The same checks as a results row: a tampered "tokens": "big" is one line (as
        # one not yet run: a case has no peak).
        row = validate_row({**raw, "status": "skipped"}, i, file)
        cases.append(_case_from_row(row))
    return cases


# -- writing -------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def results_payload(rows: Sequence[Row]) -> str:
    """The text of a results.json (also a gate baseline) holding ``rows``."""
    payload = {
        "memprobe_version": __version__,
        "columns": list(RESULT_COLUMNS),
        "rows": [{c: r.get(c) for c in RESULT_COLUMNS} for r in rows],
    }
    return json.dumps(payload, indent=1, default=_json_default)


def write_results(run_dir: Path, rows: Sequence[Row]) -> None:
    """Both results files, each replaced whole. Whole-number columns go into the CSV as the
    rows hold them: an error row's empty cell made pandas hold them as floats, "114944.0"."""
    frame = frame_of(rows)
    for column in INT_COLUMNS:  # Python's ints, of any size (a simulated peak past 2^63)
        frame[column] = pd.Series([row.get(column) for row in rows], dtype=object)
    write_atomic(run_dir / RESULTS_CSV, frame.to_csv(index=False))
    write_atomic(run_dir / RESULTS_JSON, results_payload(rows))


def write_baseline(path: Path, rows: Sequence[Row]) -> None:
    """Rows as a results.json-shaped gate baseline, written atomically."""
    write_atomic(path, results_payload(rows) + "\n", what="baseline")


def default_run_dir(root: Path = Path("reports")) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    n, candidate = 1, root / stamp
    while candidate.exists():
        n += 1
        candidate = root / f"{stamp}-{n}"
    return candidate


def create_run_dir(run_dir: Path, cases: Sequence[Case], environment: Mapping[str, Any]) -> Path:
    """Claim a new run directory and write its run.json; never reuse an existing run.

    The claim is an exclusive create of ``run.json``: of two sweeps started together into
    the same directory exactly one gets it, the other stops before measuring anything.
    """
    refuse_non_folder(run_dir, "a run directory", "choose another --out")
    # --resume is offered only for a run: a folder of notes has no run.json to resume
    resume = f", or continue it with --resume {shell_word(run_dir)}" * (run_dir / RUN_META).exists()
    taken = UserError(f"{run_dir} already exists and is not empty", f"choose another --out{resume}")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise taken
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / RUN_META, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise taken from None
    except OSError as exc:
        raise UserError(
            f"cannot create {run_dir}: {exc.strerror}", "choose another --out"
        ) from None
    os.close(fd)
    meta = {
        "memprobe_version": __version__,
        **environment,
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cases": [asdict(c) for c in cases],
    }
    try:
        write_atomic(run_dir / RUN_META, json.dumps(meta, indent=1))
    except UserError:
        # The claim is still empty: left behind (a full disk), the folder read as taken to
        # `--out` ("not empty") and as no run to `--resume`, so a retry had to delete it.
        (run_dir / RUN_META).unlink(missing_ok=True)
        raise
    return run_dir


def run_inputs(path: Path) -> list[Path]:
    """The files of a run (or a results file) that outputs must never replace."""
    if not path.is_dir():
        return [path]
    return [path / name for name in (RUN_META, RESULTS_JSON, RESULTS_CSV, SNAPSHOTS)]


def check_snapshots_folder(run_dir: Path) -> None:
    """A run being resumed writes its cases' snapshots into ``snapshots/``, the run's own
    folder (or not there yet): a link sends them where it points (``snapshots -> /`` wrote
    pickles into the root); a file there would stop the run after its first case."""
    folder = run_dir / SNAPSHOTS
    if folder.is_symlink():
        raise UserError(
            f"cannot resume {run_dir}: {folder} is a link (to {os.readlink(folder)}), "
            "and the run's snapshots would be written there",
            "make it a folder of the run again, or start a new run",
        )
    if folder.exists() and not folder.is_dir():
        raise UserError(
            f"cannot resume {run_dir}: {folder} is not a folder",
            "move it away (the run writes its snapshots there), or start a new run",
        )


def check_results_files(run_dir: Path, snapshots: tuple[str, ...] = ()) -> None:
    """A run about to write cases: its results files and the ``snapshots`` (relative paths)
    it writes lead inside the run and are files. A write goes through a link: a
    ``results.json`` linked to another run's rewrote that run's results, and a snapshot
    linked into a data tool's cache (DVC) replaced the cached file; a ``results.csv``
    folder failed the resume after its cases ran. A link only read is fine."""
    for name in (RESULTS_JSON, RESULTS_CSV, *snapshots):
        file = run_dir / name
        if leads_out(file, run_dir):
            raise UserError(
                f"cannot resume {run_dir}: {file} is a link (to {os.readlink(file)}) that "
                "leads out of the run, and the run's results would be written there",
                "make it a file of the run again (copy what it names), or start a new run",
            )
        if file.exists() and not file.is_file():
            raise UserError(
                f"cannot resume {run_dir}: {file} is not a file the run can write",
                "move it away (the run writes its results there), or start a new run",
            )


def snapshot_relpath(case: Case) -> str:
    """Where a case's allocator snapshot lives, relative to the run directory."""
    return f"{SNAPSHOTS}/{case.case_id}.pickle"
