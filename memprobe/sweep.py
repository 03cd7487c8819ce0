"""Grid → Cases → rows: plan the cases, measure each, hand rows to the run directory.

The run directory itself (run.json, results files, snapshots) belongs to
:mod:`memprobe.results`; this module decides what runs and runs it.
:func:`run_sweep_job` is the whole job ``memprobe sweep`` runs (allocator settings,
torchrun ranks, resume), and the one ``memprobe gate`` runs for its configured sweep;
``--shard`` runs :func:`memprobe.sharded_sweep.run_sharded_job` instead.
"""

from __future__ import annotations

import itertools
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from memprobe import results
from memprobe.allocator import AllocConf, alloc_conf_to_model, set_process_alloc_conf
from memprobe.errors import UserError
from memprobe.kernels import get_spec, kernel_names
from memprobe.kernels.peers import PEERS
from memprobe.kernels.registry import check_inputs_match
from memprobe.kernels.user_sources import kernel_source_digests
from memprobe.measure import measure, resolve_device
from memprobe.measure.parallel import (
    RankLayout,
    agree,
    gather_row,
    share_cases,
    start_ranks,
    stop_ranks,
)
from memprobe.measure.rank_agreement import run_agreed
from memprobe.measure.step import failure_text
from memprobe.measure.torchrun_env import under_torchrun
from memprobe.records import DTYPES, MAX_COUNT, Case, Grid, Run, normalize_dtype, too_large
from memprobe.results_errors import RunBudget, budget_record, changed_kernel, mixed_versions

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


def _positive(values: Any, what: str) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise UserError(f"{what} must be positive integers, got {v!r}", f"e.g. --{what} 20000")
        out.append(v)
    return out


def _dtype(name: str) -> str:
    key = normalize_dtype(name)
    if key is None:
        raise UserError(f"unknown dtype {name!r}", f"use one of: {', '.join(DTYPES)}")
    return key


MAX_CASES = results.MAX_CASES  # cases one run holds at most (results.py says why)


def plan_cases(grid: Grid | None = None, /, **values: Any) -> list[Case]:
    """Every case a sweep runs, largest shape always included.

    Takes a :class:`Grid`, or its fields as keywords. Shapes are a cross (the
    tokens ladder at the largest vocab plus the vocab ladder at the largest
    token count) unless ``grid`` asks for the product. A kernel that ignores
    the chunk size runs once, at the first one given.
    """
    if grid is None:
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in values.items()
        }
        grid = Grid(**fields)
    tokens = _positive(grid.tokens, "tokens")
    vocab = _positive(grid.vocab, "vocab")
    batch = _positive(grid.batch, "batch")
    tp = _positive(grid.tp, "tp")
    cp = _positive(grid.cp, "cp")
    if not tokens or not vocab:
        raise UserError("no tokens or vocab given", "e.g. --tokens 20000 --vocab 131072")
    for c in grid.chunk_size:
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c <= 0):
            raise UserError(
                f"chunk size must be a positive integer, got {c!r}", "e.g. --chunk-size 1024"
            )
    if grid.ladder and len(tokens) == 1:
        tokens = x2_ladder(tokens[0], LADDER_START["tokens"])
    if grid.ladder and len(vocab) == 1:
        vocab = x2_ladder(vocab[0], LADDER_START["vocab"])
    tokens, vocab = sorted(set(tokens)), sorted(set(vocab))
    if grid.grid:
        shapes = [(s, v) for s in tokens for v in vocab]
    else:
        shapes = [(s, vocab[-1]) for s in tokens] + [(tokens[-1], v) for v in vocab[:-1]]
    hidden = _positive(grid.hidden, "hidden") if grid.hidden is not None else None
    # --tp shards the vocabulary, which only the distributed kernels can take;
    # --hidden H runs the hidden family (the lm_head matmul and the log-prob together).
    dev = resolve_device(grid.device)
    # On a GPU the peers that are installed (Liger-Kernel, Cut Cross-Entropy) run beside
    # memprobe's own; one named with --kernel where it cannot run is a skipped row.
    if grid.kernel:
        kernels = list(grid.kernel)
    elif hidden:
        kernels = kernel_names(inputs="hidden", peers=dev == "cuda")
    else:
        kernels = kernel_names(distributed=max(tp) > 1, peers=dev == "cuda")
    for name in kernels:
        try:
            get_spec(name)
        except ValueError as exc:
            raise UserError(str(exc), "see `memprobe kernels`") from None
    check_inputs_match(kernels, hidden[0] if hidden else None)
    dtypes = [_dtype(d) for d in grid.dtype]
    single = [k for k in kernels if not get_spec(k).distributed]
    if max(tp) > 1 and single:
        sharded = ", ".join(kernel_names(distributed=True)) or "none"
        # With --hidden, "use --tp with: distributed" named kernels that take logits, which
        # --hidden then refused: the hint is plan's, the hidden family runs on one device.
        hint = (
            f"drop --tp, or drop --hidden to sweep the logits kernels that shard it: {sharded}"
            if hidden
            else f"use --tp with: {sharded}"
        )
        raise UserError(
            f"--tp {max(tp)} shards the vocabulary, which {', '.join(single)} cannot do", hint
        )
    if dev != "meta" and max(tp) * max(cp) > 1 and not under_torchrun():
        raise UserError(
            f"a real --device {dev} run with --tp/--cp needs one process per rank (torchrun)",
            f"launch it with torchrun --nproc-per-node {max(tp) * max(cp)} -m memprobe sweep ..., "
            "or simulate one rank with --device meta",
        )
    chunks = {
        k: grid.chunk_size if get_spec(k).uses_chunk_size else grid.chunk_size[:1] for k in kernels
    }
    per_shape = sum(len(chunks[k]) for k in kernels) * (len(hidden) if hidden else 1)
    count = len(batch) * len(shapes) * len(dtypes) * len(tp) * len(cp) * per_shape
    if count > MAX_CASES:
        # Counted before a case is made: a grid of thousands of values each would take
        # minutes to list, and every finished case rewrites the results (quadratic).
        raise UserError(
            f"this sweep would run {count:,} cases; one run takes at most {MAX_CASES:,}",
            "split it into smaller sweeps (fewer --tokens/--vocab values, or drop --grid)",
        )
    # check_inputs_match: with hidden sizes every kernel takes them, else none does.
    sizes: list[int | None] = list(hidden) if hidden else [None]
    cases = []
    for b, (s, v), d, t, c in itertools.product(batch, shapes, dtypes, tp, cp):
        _check_parallel(s, v, t, c)
        for h in sizes:
            past = too_large(b, s // c, v // t, h)  # one rank's share: what it simulates
            if past is not None:
                raise UserError(past, "give smaller sizes")
        for k in kernels:
            cases += [Case(k, b, s, v, d, cs, t, c, dev, h) for h in sizes for cs in chunks[k]]
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


def environment(device: str) -> dict[str, Any]:
    """What run.json records about the machine a run measured on."""
    if device == "cuda":
        name = torch.cuda.get_device_name()
    elif device == "cpu":
        name = platform.processor() or platform.machine()
    else:
        name = "meta (simulated)"
    return {
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device": device,
        "device_name": name,
        # The report draws it as the budget line of a measured GPU run.
        "device_memory_bytes": (
            torch.cuda.get_device_properties(0).total_memory if device == "cuda" else None
        ),
    }


# -- running --------------------------------------------------------------
# Called after the i-th of n cases finishes: (i, n, case, run). The CLI's is
# memprobe.render.console.Progress.case.
OnCase = Callable[[int, int, Case, Run], None]


@dataclass(frozen=True)
class SweepRequest:
    grid: Grid
    out: Path | None = None  # None: reports/<run-id>/
    resume: Path | None = None
    verify: bool = True
    alloc_conf: str | None = None  # PYTORCH_ALLOC_CONF syntax
    command: str = ""
    snapshots: bool = True  # an allocator snapshot per case in the run directory
    # --shard: how long rank 0 waits for a case another rank took before it calls the
    # rank silent, records the case as unfinished and stops the job.
    case_timeout_s: float = 600.0
    budget: RunBudget = None  # for run.json: `memprobe report` and --resume mark it again


@dataclass(frozen=True)
class SweepOutcome:
    frame: pd.DataFrame
    run_dir: Path
    # False on every torchrun rank but 0: they measure, rank 0 reports.
    lead: bool


def run_sweep_job(request: SweepRequest, progress: OnCase | None = None) -> SweepOutcome:
    """Plan (or resume) the cases, join the torchrun ranks when there are any, and run
    them into the run directory under the requested allocator settings."""
    resumed = request.resume is not None and request.resume.is_dir()
    # A flag is checked either way; the environment only for a new run.
    conf = alloc_conf_to_model(request.alloc_conf, environ={} if resumed else None)
    if resumed and request.resume is not None:  # it keeps the settings it started with
        conf = results.recorded_alloc_conf(request.resume)
    if conf is not None and request.resume is None:
        # The real allocator reads it at its first allocation: set before any CUDA call.
        set_process_alloc_conf(conf.to_string())
    # This process's rank in a torchrun job, handed down explicitly (None: one process).
    layout = (
        start_ranks(
            resolve_device(request.grid.device), list(request.grid.tp), list(request.grid.cp)
        )
        if under_torchrun()
        else None
    )
    try:
        if request.resume is not None:
            cases, run_dir = [], request.resume
        else:
            cases = plan_cases(request.grid)
            run_dir = request.out if request.out is not None else results.default_run_dir()
        lead = layout is None or layout.rank == 0
        frame = run_sweep(
            cases,
            run_dir,
            alloc_conf=conf,
            verify=request.verify,
            progress=progress if lead else None,
            command=request.command,
            budget=request.budget,
            resume=request.resume is not None,
            snapshots=request.snapshots,
            layout=layout,
        )
        return SweepOutcome(frame, run_dir, lead)
    finally:
        if under_torchrun():
            stop_ranks()


def run_sweep(
    cases: list[Case],
    out_dir: Path,
    *,
    verify: bool = True,
    progress: OnCase | None = None,
    command: str = "",
    resume: bool = False,
    snapshots: bool = True,
    alloc_conf: AllocConf | None = None,
    layout: RankLayout | None = None,
    budget: RunBudget = None,
) -> pd.DataFrame:
    """Measure every case not already in ``out_dir`` and return all rows.

    With ``resume`` the directory must hold a run; otherwise it is created
    (and must not already hold one). ``layout``: this process's rank in a torchrun
    job (from :func:`memprobe.measure.parallel.start_ranks`), None for one process.
    """
    lead = layout is None or layout.rank == 0
    rows: list[dict[str, Any]] = []
    todo: list[Case] = []
    planned: list[Case] = []
    error: UserError | None = None
    if lead:
        try:
            planned, rows, todo = open_run(cases, out_dir, command, resume, alloc_conf, budget)
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
    positions = results.plan_positions(planned)
    for i, case in enumerate(todo, start=1):
        run = with_reserved(measure_one(case, verify=verify, layout=layout), alloc_conf)
        if snapshots and lead:
            run = _with_snapshot(run, out_dir, alloc_conf)
        # Under torchrun rank 0 gathers every rank's row; the others get None.
        row = run.row() if layout is None else gather_row(run.row())
        if row is None:
            continue
        rows = results.in_plan_order([*rows, row], positions)
        results.write_results(out_dir, rows)
        if progress is not None:
            progress(i, len(todo), case, run)
    return results.frame_of(rows)


def open_run(
    cases: list[Case], out_dir: Path, command: str, resume: bool, conf: AllocConf | None,
    budget: RunBudget = None,
) -> tuple[list[Case], list[dict[str, Any]], list[Case]]:  # fmt: skip
    """(every planned case, rows already finished, cases still to run) for a new or
    resumed run."""
    if resume:
        if not out_dir.is_dir():  # e.g. the run's results.json, given for the run
            said = "a file, not a run directory" if out_dir.exists() else "no such directory"
            raise UserError(f"cannot resume {out_dir}: {said}", "give a run directory")
        cases = results.planned_cases(out_dir)
        results.check_snapshots_folder(out_dir)
        # A results.json that is a link leading nowhere is read (and named for what it
        # is), not taken as absent: the resume re-ran every case and replaced the link.
        written = results.results_file(out_dir)
        done = results.read_rows(out_dir) if written.exists() or written.is_symlink() else []
        stray = results.unplanned_rows(done, cases)
        if stray:
            # Resuming would keep them in results.json, where gate and report take them
            # for cases of this run.
            raise UserError(
                f"cannot resume {out_dir}: results row {stray[0]} is a case its "
                f"{results.RUN_META} did not plan ({len(stray)} such row(s))",
                "the run directory was edited or mixed with another; start a new run",
            )
    else:
        device = cases[0].device if cases else "meta"
        # The report names each kernel by its registry line without importing the registry.
        summaries = {c.kernel: get_spec(c.kernel).summary for c in cases}
        info = {
            **environment(device),
            "command": command,
            "kernel_summaries": summaries,
            "kernel_sources": kernel_source_digests(summaries),  # a resume runs the same code
            # The allocator settings: the model's on meta/cpu, the real allocator's on cuda.
            "alloc_conf": (conf or AllocConf()).to_string(),
            **budget_record(budget),
        }
        results.create_run_dir(out_dir, cases, info)
        done = []
    # A case recorded as unfinished (its rank went silent) runs again; its row is replaced.
    # So does the case of a row whose case_id is not its columns' case (edited, or pasted
    # from another run): which case it measured is unknown, and its snapshot may be the
    # other one's. Refusing would leave a hand edit or a new run; the case is planned, so
    # running it again puts a row that is true in its place.
    done = [r for r in done if not results.unfinished(r) and results.identity_agrees(r)]
    finished = {results.case_key(r) for r in done}
    todo = [c for c in cases if results.case_key(asdict(c)) not in finished]
    if resume and todo:
        results.check_results_files(out_dir, tuple(map(results.snapshot_relpath, todo)))
        _check_resumed(todo, out_dir)
        kernels = {c.kernel for c in todo} & {r.get("kernel") for r in done}
        if changed := changed_kernel(out_dir, results.read_run_meta(out_dir), kernels):
            raise changed
    return cases, list(done), todo


def _check_resumed(todo: list[Case], out_dir: Path) -> None:
    """The cases a resume is about to run, held to the rules :func:`plan_cases` plans by
    and to the versions that started the run. run.json is a file a user can edit or mix:
    a case no sweep makes (a logits kernel with a hidden size, a --tp above 1 for a kernel
    that cannot shard, a tp or cp that does not divide the shape) was measured as something
    else and written under its own name (unchunked at tp 2 ran on half the vocabulary: half
    the peak, a wrong row). Only the cases still to run are checked: a finished one imports
    nothing again."""
    if mixed := mixed_versions(out_dir, results.read_run_meta(out_dir), torch.__version__):
        raise mixed
    for case in todo:
        try:
            # Every count flag's bound: past it a case ran at 2^41 tokens, or overflowed.
            for name in ("batch", "tokens", "vocab", "chunk_size", "tp", "cp", "hidden"):
                value = getattr(case, name)
                if value is not None and value > MAX_COUNT:
                    raise UserError(
                        f"{name} {value:,} is beyond the largest count memprobe simulates "
                        f"({MAX_COUNT:,} = 2^40)"
                    )
            if case.device is None:  # a results row may lack one; a case to run cannot
                raise UserError("no device (meta, cpu or cuda)")
            spec = get_spec(case.kernel)
            check_inputs_match([case.kernel], case.hidden)
            if case.tp > 1 and not spec.distributed:
                raise UserError(f"--tp {case.tp} shards the vocabulary, which it cannot do")
            _check_parallel(case.tokens, case.vocab, case.tp, case.cp)
        except (UserError, ValueError) as exc:
            why = exc.message if isinstance(exc, UserError) else str(exc)
            raise UserError(
                f"cannot resume {out_dir}: its {results.RUN_META} plans {case.case_id}, "
                f"which no sweep runs ({why})",
                "the run directory was edited or mixed with another; start a new run",
            ) from None


def measure_one(case: Case, *, verify: bool, layout: RankLayout | None) -> Run:
    # Under torchrun every rank agrees to run the case, stops it when a peer fails
    # mid-step, and learns every rank's status, so none waits on a collective forever.
    run, every_rank_ok = run_agreed(case, lambda c: _measure_or_error(c, layout), _unfit, layout)
    # The check runs on CPU, where a Triton peer cannot: benchmarks/gpu_check.py
    # measures the peers' error against float64 on the GPU instead.
    if verify and run.status == "ok" and every_rank_ok and case.kernel not in PEERS:
        from memprobe.measure.numerics import checked_run

        # Both gradients for the hidden family; one rank's whole vocabulary under torchrun.
        run = checked_run(run, layout=layout)
    return run


def _measure_or_error(case: Case, layout: RankLayout | None) -> Run:
    try:
        return measure(case, layout=layout)
    except UserError:
        raise
    except torch.cuda.OutOfMemoryError as exc:  # a backend that does not catch its own
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        return Run(case=case, status="oom", note=text)
    except Exception as exc:  # one broken case must not end the sweep
        return Run(case=case, status="error", note=failure_text(exc, limit=1000, first_line=True))


def _unfit(case: Case) -> str | None:
    """Why this process cannot run ``case`` at all (a sticky CUDA error), or None."""
    if case.device != "cuda":
        return None
    from memprobe.measure.cuda_backend import sticky_error_note

    return sticky_error_note()


def with_reserved(run: Run, conf: AllocConf | None) -> Run:
    """Reserved bytes for every case: the allocator's own figure where it measured one
    (cuda), else what memprobe's model of the caching allocator reserves for the
    tracked allocations."""
    if run.reserved_peak_bytes is not None:
        return replace(run, reserved_source="measured")
    if not run.events:
        return run  # skipped or failed before anything ran
    from memprobe.measure.reserved import modelled_reserved_peak

    reserved = modelled_reserved_peak(run.events, conf)
    return replace(run, reserved_peak_bytes=reserved, reserved_source="modelled")


def _with_snapshot(run: Run, out_dir: Path, conf: AllocConf | None = None) -> Run:
    """Write the case's allocator snapshot and point the row at it."""
    return with_snapshot_written(run, snapshot_of(run, conf), out_dir)


def snapshot_of(run: Run, conf: AllocConf | None) -> dict[str, Any] | None:
    """The case's allocator snapshot (torch's format): the real one on cuda, one
    synthesized from the tracker's trace on meta and cpu; None when nothing ran."""
    from memprobe.snapshot import synthesize_snapshot

    if run.cuda_snapshot is not None:
        return run.cuda_snapshot
    if run.events:
        return synthesize_snapshot(run.events, case=run.case, conf=conf)
    return None  # skipped or failed before anything ran


def with_snapshot_written(run: Run, snapshot: dict[str, Any] | None, out_dir: Path) -> Run:
    """Write ``snapshot`` (pickle protocol 4) under the run directory, and point the row at it."""
    from memprobe.snapshot import write_snapshot

    if snapshot is None:
        return run
    relative = results.snapshot_relpath(run.case)
    write_snapshot(snapshot, out_dir / relative)
    return replace(run, snapshot=relative)
