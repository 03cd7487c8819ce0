"""Case grid → Results: plan the cases, measure each, write rows as they finish.

A run directory holds ``run.json`` (versions, device, command, the planned
cases), ``results.csv`` and ``results.json`` (one row per finished case).
Rows are rewritten by atomic replace after every case, so an interrupt or a
crash loses nothing finished and ``--resume`` runs only what is missing.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import platform
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from memprobe import __version__
from memprobe.atomic_files import write_atomic
from memprobe.errors import UserError
from memprobe.kernels import get_spec, kernel_names
from memprobe.measure import measure, resolve_device
from memprobe.measure.rank_agreement import run_agreed
from memprobe.ranks import agree, current_layout, gather_row, share_cases, under_torchrun
from memprobe.records import DTYPE_ALIASES, DTYPES, RESULT_COLUMNS, Case, Run

LADDER_START = {"tokens": 1024, "vocab": 16384}


# -- planning -------------------------------------------------------------
def x2_ladder(top: int, start: int) -> list[int]:
    """×2 steps from ``start`` that end at ``top``: 20000 → 1024 … 16384, 20000."""
    steps: list[int] = []
    value = start
    while value < top:
        steps.append(value)
        value *= 2
    return [*steps, top]


def normalize_dtype(name: str) -> str:
    key = DTYPE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in DTYPES:
        raise UserError(f"unknown dtype {name!r}", f"use one of: {', '.join(DTYPES)}")
    return key


def _positive(values: Sequence[int], what: str) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise UserError(f"{what} must be positive integers, got {v!r}", f"e.g. --{what} 20000")
        out.append(v)
    return out


def plan_cases(
    *,
    tokens: Sequence[int],
    vocab: Sequence[int],
    batch: Sequence[int] = (1,),
    dtype: Sequence[str] = ("bf16",),
    kernel: Sequence[str] | None = None,
    chunk_size: Sequence[int | None] = (1024,),
    tp: Sequence[int] = (1,),
    cp: Sequence[int] = (1,),
    device: str = "auto",
    grid: bool = False,
    ladder: bool = True,
) -> list[Case]:
    """Every case a sweep runs, largest shape always included.

    With ``ladder`` a single tokens or vocab value N becomes a ×2 ladder ending
    at N. Shapes are a cross (the tokens ladder at the largest vocab plus the
    vocab ladder at the largest token count) unless ``grid`` asks for the product.
    """
    tokens = _positive(list(tokens), "tokens")
    vocab = _positive(list(vocab), "vocab")
    batch = _positive(list(batch), "batch")
    tp = _positive(list(tp), "tp")
    cp = _positive(list(cp), "cp")
    if not tokens or not vocab:
        raise UserError("no tokens or vocab given", "e.g. --tokens 20000 --vocab 131072")
    for c in chunk_size:
        if c is not None and (isinstance(c, bool) or c <= 0):
            raise UserError(
                f"chunk size must be a positive integer, got {c!r}", "e.g. --chunk-size 1024"
            )
    if ladder and len(tokens) == 1:
        tokens = x2_ladder(tokens[0], LADDER_START["tokens"])
    if ladder and len(vocab) == 1:
        vocab = x2_ladder(vocab[0], LADDER_START["vocab"])
    tokens, vocab = sorted(set(tokens)), sorted(set(vocab))
    if grid:
        shapes = [(s, v) for s in tokens for v in vocab]
    else:
        shapes = [(s, vocab[-1]) for s in tokens] + [(tokens[-1], v) for v in vocab[:-1]]
    # --tp shards the vocabulary, which only the distributed kernels can take.
    kernels = list(kernel) if kernel else kernel_names(distributed=max(tp) > 1)
    for name in kernels:
        try:
            get_spec(name)
        except ValueError as exc:
            raise UserError(str(exc), "see `memprobe kernels`") from None
    dtypes = [normalize_dtype(d) for d in dtype]
    dev = resolve_device(device)
    single = [k for k in kernels if not get_spec(k).distributed]
    if max(tp) > 1 and single:
        sharded = ", ".join(kernel_names(distributed=True)) or "none"
        raise UserError(
            f"--tp {max(tp)} shards the vocabulary, which {', '.join(single)} cannot do",
            f"use --tp with: {sharded}",
        )
    if dev != "meta" and max(tp) * max(cp) > 1 and not under_torchrun():
        raise UserError(
            f"a real --device {dev} run with --tp/--cp needs one process per rank (torchrun)",
            f"launch it with torchrun --nproc-per-node {max(tp) * max(cp)} -m memprobe sweep ..., "
            "or simulate one rank with --device meta",
        )
    cases = []
    for b, (s, v), d, t, c in itertools.product(batch, shapes, dtypes, tp, cp):
        _check_parallel(s, v, t, c)
        cases += [Case(k, b, s, v, d, cs, t, c, dev) for k in kernels for cs in chunk_size]
    return list(dict.fromkeys(cases))


def _check_parallel(tokens: int, vocab: int, tp: int, cp: int) -> None:
    if vocab % tp:
        raise UserError(
            f"--tp {tp} does not divide the vocabulary {vocab}", "pick a tp that divides it"
        )
    if tokens % cp:
        raise UserError(
            f"--cp {cp} does not divide the tokens {tokens}", "pick a cp that divides it"
        )


# -- files ----------------------------------------------------------------
def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_results(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    frame = results_frame(rows)
    write_atomic(run_dir / "results.csv", frame.to_csv(index=False))
    payload = {"memprobe_version": __version__, "columns": list(RESULT_COLUMNS), "rows": rows}
    write_atomic(run_dir / "results.json", json.dumps(payload, indent=1, default=_json_default))


def results_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(RESULT_COLUMNS))


# Whole-number columns: pandas turns them into floats when a value is missing.
_INT_COLUMNS = frozenset(
    f.name for f in (*fields(Case), *fields(Run)) if f.type in ("int", "int | None")
)


def result_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The table's rows as plain Python values: NaN → None, whole-number columns as int."""
    rows = []
    for record in frame.to_dict(orient="records"):
        row: dict[str, Any] = {}
        for key, value in record.items():
            if hasattr(value, "item") and not isinstance(value, (str, bytes)):
                value = value.item()  # numpy scalar → Python
            if value is pd.NA or value is pd.NaT:
                value = None
            elif isinstance(value, float) and not math.isfinite(value):
                value = None
            elif key in _INT_COLUMNS and isinstance(value, float) and value.is_integer():
                value = int(value)
            row[str(key)] = value
        rows.append(row)
    return rows


def read_results(path: str | Path) -> pd.DataFrame:
    """A run directory or its results.json → the results table."""
    p = Path(path)
    file = p / "results.json" if p.is_dir() else p
    if not file.exists():
        raise UserError(f"no results at {file}", "give a run directory or its results.json")
    try:
        payload = json.loads(file.read_text(encoding="utf-8"))
        rows = payload["rows"]
        if not isinstance(rows, list):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(
            f"{file} is not a memprobe results.json", "point at a run directory"
        ) from None
    return results_frame(rows)


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    file = run_dir / "run.json"
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or "cases" not in meta:
            raise ValueError
        return meta
    except (OSError, ValueError):
        raise UserError(
            f"{run_dir} is not a memprobe run (no readable run.json)", "give a run directory"
        ) from None


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    if device == "cpu":
        return platform.processor() or platform.machine()
    return "meta (simulated)"


def default_run_dir(root: Path = Path("reports")) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    candidate = root / stamp
    n = 1
    while candidate.exists():
        n += 1
        candidate = root / f"{stamp}-{n}"
    return candidate


def prepare_run_dir(out: Path | None, cases: list[Case], command: str) -> Path:
    """Create a new run directory and its run.json; never reuse an existing run."""
    run_dir = out if out is not None else default_run_dir()
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} is a file, not a run directory", "choose another --out")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(
            f"{run_dir} already exists and is not empty",
            f"choose another --out, or continue it with --resume {run_dir}",
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"cannot create {run_dir}: {exc.strerror}", "choose another --out"
        ) from None
    device = cases[0].device if cases else "meta"
    meta = {
        "memprobe_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device": device,
        "device_name": device_name(device),
        # The report draws it as the budget line of a measured GPU run.
        "device_memory_bytes": (
            torch.cuda.get_device_properties(0).total_memory if device == "cuda" else None
        ),
        "command": command,
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cases": [asdict(c) for c in cases],
    }
    write_atomic(run_dir / "run.json", json.dumps(meta, indent=1))
    return run_dir


def resume_plan(run_dir: Path) -> tuple[list[Case], list[dict[str, Any]]]:
    """The cases recorded for a run and the rows already finished."""
    if not run_dir.is_dir():
        raise UserError(f"cannot resume {run_dir}: no such directory", "give a run directory")
    meta = read_run_meta(run_dir)
    try:
        cases = [Case(**c) for c in meta["cases"]]
    except TypeError:
        raise UserError(
            f"{run_dir}/run.json has a case memprobe cannot read", "start a new run"
        ) from None
    done: list[dict[str, Any]] = []
    if (run_dir / "results.json").exists():
        done = result_rows(read_results(run_dir))
    return cases, done


# -- running --------------------------------------------------------------
Progress = Callable[[int, int, Case, Run], None]


def run_sweep(
    cases: list[Case],
    out_dir: Path,
    *,
    verify: bool = True,
    progress: Progress | None = None,
    command: str = "",
    resume: bool = False,
    snapshots: bool = True,
) -> pd.DataFrame:
    """Measure every case not already in ``out_dir`` and return all rows.

    With ``resume`` the directory must hold a run; otherwise it is created
    (and must not already hold one).
    """
    layout = current_layout()
    lead = layout is None or layout.rank == 0
    rows: list[dict[str, Any]] = []
    todo: list[Case] = []
    error: UserError | None = None
    if lead:
        try:
            rows, todo = _open_run(cases, out_dir, command, resume)
        except UserError as exc:
            error = exc
    if layout is not None:
        # Rank 0 alone touches the run directory; every rank learns its
        # verdict and the cases to run, so none waits on a rank that quit.
        verdict = agree(error.one_line() if error else None)
        if verdict is not None:
            raise error or UserError(verdict)
        todo = share_cases(todo)
    elif error is not None:
        raise error
    for i, case in enumerate(todo, start=1):
        run = _measure_one(case, verify=verify)
        if snapshots and lead:
            run = _with_snapshot(run, out_dir)
        row: dict[str, Any] | None = run.row()
        if layout is not None:
            row = gather_row(run.row())
            if row is None:
                continue
        rows.append(row)
        write_results(out_dir, rows)
        if progress is not None:
            progress(i, len(todo), case, run)
    return results_frame(rows)


def _open_run(
    cases: list[Case], out_dir: Path, command: str, resume: bool
) -> tuple[list[dict[str, Any]], list[Case]]:
    """(rows already finished, cases still to run) for a new or resumed run."""
    if resume:
        cases, done = resume_plan(out_dir)
    else:
        prepare_run_dir(out_dir, cases, command)
        done = []
    finished = {r["case_id"] for r in done}
    return list(done), [c for c in cases if c.case_id not in finished]


def _measure_one(case: Case, *, verify: bool) -> Run:
    # Under torchrun every rank agrees to run the case, stops it when a peer fails
    # mid-step, and learns every rank's status, so none waits on a collective forever.
    run, every_rank_ok = run_agreed(case, _measure_or_error, _unfit)
    if verify and run.status == "ok" and every_rank_ok:
        from memprobe.measure.numerics import verify as verify_numerics

        err_fwd, err_bwd = verify_numerics(case.kernel, case.dtype)
        run = replace(run, max_abs_err_fwd=err_fwd, max_abs_err_bwd=err_bwd)
    return run


def _measure_or_error(case: Case) -> Run:
    try:
        return measure(case)
    except UserError:
        raise
    except torch.cuda.OutOfMemoryError as exc:  # a backend that does not catch its own
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        return Run(case=case, status="oom", note=text)
    except Exception as exc:  # one broken case must not end the sweep
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        return Run(case=case, status="error", note=text)


def _unfit(case: Case) -> str | None:
    """Why this process cannot run ``case`` at all (a sticky CUDA error), or None."""
    if case.device != "cuda":
        return None
    from memprobe.measure.cuda_backend import sticky_error_note

    return sticky_error_note()


def _with_snapshot(run: Run, out_dir: Path) -> Run:
    """Write the case's allocator snapshot (torch's format, protocol 4) and
    point the row at it: the real one on cuda, one synthesized from the
    tracker's trace on meta and cpu."""
    from memprobe.snapshot import synthesize_snapshot, write_snapshot

    if run.cuda_snapshot is not None:
        snapshot = run.cuda_snapshot
    elif run.events:
        snapshot = synthesize_snapshot(run.events, case=run.case)
    else:
        return run  # skipped or failed before anything ran
    relative = Path("snapshots") / f"{run.case.case_id}.pickle"
    (out_dir / "snapshots").mkdir(exist_ok=True)
    write_snapshot(snapshot, out_dir / relative)
    return replace(run, snapshot=relative.as_posix())
