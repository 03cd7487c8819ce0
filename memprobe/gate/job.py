"""The gate stage ``memprobe gate`` runs: config, results (read, or the configured sweep
run by the very job ``memprobe sweep`` runs), the verdict (:mod:`memprobe.gate.rules`),
the baseline update. Reports (terminal text, JUnit, step summary) are render/'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memprobe.config import ROOT, MemprobeConfig, load_config
from memprobe.errors import UserError
from memprobe.gate.rules import Row, Verdict, check_each_rule_matches, evaluate
from memprobe.io.files import check_output_file, guard_outputs, resolved_path
from memprobe.io.text import shell_word
from memprobe.records import Grid
from memprobe.results import (
    RESULTS_JSON,
    RUN_META,
    read_rows,
    results_file,
    run_inputs,
    write_baseline,
)
from memprobe.results_errors import link_to_nothing

if TYPE_CHECKING:
    from memprobe.attribute.records import BlockGroup
    from memprobe.records import Case, Run


@dataclass(frozen=True)
class GateRequest:
    """What the CLI asks for: every flag of ``memprobe gate``."""

    results: Path | None = None
    config: Path | None = None
    baseline: Path | None = None
    max_regression: float | None = None
    # Checked here before anything runs (it must not replace an input); the caller
    # writes it from the verdict.
    junit_xml: Path | None = None
    update_baseline: Path | None = None
    out: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)
    # After each case of the configured sweep (memprobe.sweep.OnCase).
    progress: Callable[[int, int, Case, Run], None] | None = None


@dataclass(frozen=True)
class GateOutcome:
    # None on a torchrun rank but 0: it measured its share; rank 0 judges.
    verdict: Verdict | None
    rows: tuple[Row, ...] = ()
    written: tuple[Path, ...] = ()  # the updated baseline
    # What the gate read (the run's files, the config, the baseline): no report of it
    # (the step summary included) may be written onto one.
    inputs: tuple[Path, ...] = ()

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code if self.verdict is not None else 0


def run_gate(req: GateRequest) -> GateOutcome:
    """Load the config, get results (reading them or running the sweep), check them,
    update the baseline when asked.

    Usage and config errors raise UserError before anything is measured or written.
    """
    if req.results is not None and not results_file(req.results).exists():
        # The first thing to say about a mistyped path, before any config question.
        raise link_to_nothing(results_file(req.results)) or UserError(
            f"no results at {req.results}", "give a run directory or its results.json"
        )
    if req.results is not None and req.out is not None:
        # --out is where the gate's own sweep goes; with RESULTS nothing is swept, and the
        # flag was passed over in silence (a CI job that meant to keep its run found none).
        raise UserError(
            f"--out {req.out} is the run directory of the gate's own sweep, and with "
            f"RESULTS ({req.results}) given the gate sweeps nothing",
            "drop --out to check RESULTS, or drop RESULTS to run tool.memprobe.sweep into --out",
        )
    cfg = load_config(req.config, start=req.cwd)
    # Checked before anything runs or is written: no output replaces an input (the config
    # just read included) or another output; only --update-baseline rewrites the baseline.
    baseline_input = req.baseline or cfg.gate.baseline
    run_files = _run_files(req.results) if req.results else []
    # A baseline that is the run's own results file is still the run's: not rewritten.
    replaceable = (
        [baseline_input]
        if baseline_input and not any(_same_file(baseline_input, f) for f in run_files)
        else []
    )
    inputs = [*run_files, *filter(None, [baseline_input, cfg.source, req.config])]
    guard_outputs(
        {"--junit-xml": req.junit_xml, "--update-baseline": req.update_baseline},
        inputs,
        may_replace={"--update-baseline": replaceable},
    )
    # Each output refused before anything is written or swept: a --junit-xml that is a
    # folder (or under a file) was refused after --update-baseline had replaced the
    # baseline, exit 2 with the baseline gone, and after the gate's own sweep had run.
    for output, what in ((req.junit_xml, "JUnit file"), (req.update_baseline, "baseline")):
        if output is not None:
            check_output_file(output, what=what)
    if req.max_regression is not None and req.max_regression >= 0 and baseline_input is None:
        # Growth over no baseline: the gate passed on its rules alone, as if the allowance
        # had been checked. (A value that is no percentage is said so by the verdict.)
        raise UserError(
            f"--max-regression {req.max_regression:g} is growth allowed over a baseline, "
            "and there is none (no --baseline, no baseline in [tool.memprobe.gate])",
            "add --baseline results.json, or drop --max-regression",
        )
    config_name = str(cfg.source) if cfg.source else None
    max_regression = req.max_regression
    if max_regression is None:
        max_regression = cfg.gate.max_regression or 0.0
    baseline_path = req.baseline or cfg.gate.baseline
    baseline_rows: list[dict[str, Any]] | None = None
    notes: list[str] = []
    if baseline_path is not None:
        where = "the config's baseline" if req.baseline is None else "--baseline"
        if (
            req.update_baseline
            and _same_file(baseline_path, req.update_baseline)
            and not baseline_path.exists()
        ):
            # First run of `gate --update-baseline` with the baseline named in the config.
            notes.append(f"baseline {baseline_path} does not exist yet; not compared")
            baseline_path = None
        elif (dangling := link_to_nothing(results_file(baseline_path))) is not None:
            # Before the folder check: a run directory's results.json that is a link
            # leading nowhere was "a folder with no results.json in it".
            raise dangling
        elif baseline_path.is_dir() and not results_file(baseline_path).exists():
            # Not "does not exist yet": --update-baseline cannot write a folder either.
            raise UserError(
                f"{where} {baseline_path} is a folder with no results.json in it",
                "name the baseline file (a results.json), or a run directory that has one",
            )
        elif not results_file(baseline_path).exists():
            # The first gate run of a project: the baseline is made, not found.
            raise UserError(
                f"{where} {baseline_path} does not exist yet",
                "make it once with `memprobe gate RUN --update-baseline "
                f"{shell_word(baseline_path)}` and commit it",
            )
        else:
            baseline_rows = read_rows(baseline_path)  # a file it cannot be is said first
            if req.results is not None and _same_file(
                results_file(baseline_path), results_file(req.results)
            ):
                # The run compared with itself: every regression check passed by
                # construction (a config's baseline naming the run a CI job gates).
                raise UserError(
                    f"{where} {baseline_path} is the results being gated "
                    f"({results_file(req.results)}): the run would be compared with itself",
                    "give the results of an earlier run as the baseline",
                )
            if not baseline_rows:
                # No case to compare: the gate would pass on "all 0 check(s)".
                if req.update_baseline and _same_file(baseline_path, req.update_baseline):
                    notes.append(f"baseline {baseline_path} holds no cases; not compared")
                    baseline_rows, baseline_path = None, None
                else:
                    raise UserError(
                        f"{where} {baseline_path} holds no cases: it would compare nothing",
                        "remake it from a finished run with "
                        f"`memprobe gate RUN --update-baseline {shell_word(baseline_path)}`",
                    )
    if req.baseline is None and cfg.gate.baseline is None and cfg.gate.max_regression:
        # The config allows growth over a baseline that neither it nor --baseline names:
        # the gate passed on its rules alone, and no word said growth went unchecked
        # (--max-regression typed without a baseline is refused above; the config's may
        # stand for CI jobs that pass --baseline, so it is said, not refused).
        notes.append(
            f"max_regression {cfg.gate.max_regression:g}% ({config_name}) not applied: no "
            "baseline to compare with (pass --baseline, or set baseline in [tool.memprobe.gate])"
        )
    rules = cfg.gate.rules
    if not rules and baseline_path is None and req.update_baseline is None:
        where = config_name or f"no pyproject.toml at or above {req.cwd}"
        raise UserError(
            f"nothing to check: no [tool.memprobe.gate] rules ({where}) and no --baseline",
            "add rules to [tool.memprobe.gate] or pass --baseline results.json",
        )
    if req.results is not None:
        rows = read_rows(req.results)
        source = str(req.results)
    else:
        swept = _run_configured_sweep(cfg, req)
        if swept is None:
            return GateOutcome(verdict=None)
        rows, source = swept
        inputs += _run_files(Path(source))
    verdict = evaluate(
        rows,
        rules,
        results=source,
        baseline=baseline_rows,
        baseline_source=str(baseline_path) if baseline_path else None,
        max_regression=max_regression,
        config=config_name,
    )
    notes += _failure_evidence(verdict, rows, _run_dir_of(req, source))
    if notes:
        verdict = replace(verdict, notes=(*notes, *verdict.notes))
    written: list[Path] = []
    if req.update_baseline is not None:
        write_baseline(req.update_baseline, rows)
        written.append(req.update_baseline)
    return GateOutcome(
        verdict=verdict, rows=tuple(rows), written=tuple(written), inputs=tuple(inputs)
    )


def _run_files(results: Path) -> list[Path]:
    """A run's files: what the gate reads (run_inputs) and what else the sweep wrote there
    (report.html, its PNGs): a gate's report replaces none of them. A run's results.json
    given for the run is the run too (its snapshots explain a failure): `gate
    run/results.json --update-baseline run/run.json` left a folder that was no longer a
    run, and `--junit-xml run/report.html` replaced the run's page."""
    if not results.is_dir():
        if results.name == RESULTS_JSON and (results.parent / RUN_META).is_file():
            return [results, *_run_files(results.parent)]
        return run_inputs(results)
    return list(dict.fromkeys([*run_inputs(results), *sorted(results.iterdir())]))


def _same_file(a: Path, b: Path) -> bool:
    return resolved_path(a, "path") == resolved_path(b, "path")


# Failing cases whose snapshot is read to name the line behind their peak.
MAX_EXPLAINED = 5


def _run_dir_of(req: GateRequest, source: str) -> Path:
    """The run directory the rows' snapshot paths are relative to."""
    if req.results is None:
        return Path(source)  # the gate's own sweep
    return req.results if req.results.is_dir() else req.results.parent


def _failure_evidence(verdict: Verdict, rows: Sequence[Row], run_dir: Path) -> list[str]:
    """For each failing case with a snapshot: where the snapshot is, and the line that
    made the largest block live at its peak (what to look at first)."""
    from memprobe.attribute import attribute
    from memprobe.snapshot import load_snapshot
    from memprobe.snapshot.synthesize import another_case, contradicted_peak

    by_id = {r.get("case_id"): r for r in rows}
    notes: list[str] = []
    # A case that disappeared has no row here: a row of these results under its id (a
    # baseline whose case_id disagrees with its columns) is another case's, and its
    # snapshot would be told as the lost case's evidence.
    failing = dict.fromkeys(
        (c.case_id, c.case)
        for c in verdict.failures
        if c.case_id in by_id and c.kind != "disappeared"
    )
    for case_id, label in list(failing)[:MAX_EXPLAINED]:
        snapshot = by_id[case_id].get("snapshot")
        path = run_dir / snapshot if snapshot else None
        if path is None or not path.is_file():
            continue
        try:
            snapshot = load_snapshot(path)
            recorded = another_case(snapshot, case_id)
            if recorded is not None:
                notes.append(f"{label}: snapshot {path} was recorded for case {recorded}; not read")
                continue
            contradiction = contradicted_peak(snapshot, by_id[case_id])
            if contradiction is not None:
                notes.append(f"{label}: snapshot {path} {contradiction}; not read")
                continue
            groups = attribute(snapshot, path=str(path)).groups
        except UserError as exc:
            notes.append(f"{label}: snapshot {path} could not be read ({exc.message})")
            continue
        if not groups:
            continue
        notes.append(f"{label}: {_largest_blocks_text(groups)}; snapshot {path}")
    return notes


def _largest_blocks_text(groups: Sequence[BlockGroup]) -> str:
    """The largest block live at the peak and the line that made it; when that block has
    no line (an input the harness made, a block autograd's engine made), the largest
    block that has one too: a failure always names a source line when the trace has any."""
    from memprobe.attribute.frames import describe_frame, in_kernel
    from memprobe.io.sizes import format_bytes
    from memprobe.snapshot.labels import op_words

    def made(g: BlockGroup) -> str:
        return f"made at {describe_frame(g.frame)} (op {g.op or '?'}{in_kernel(g.kernel)})"

    largest = max(groups, key=lambda g: g.size)
    head = f"its largest block live at the peak, {format_bytes(largest.size)} {largest.category}"
    if largest.frame is not None:
        return f"{head}, was {made(largest)}"
    head += f" (op {op_words(largest.op or '?')}), has no source line"
    lined = [g for g in groups if g.frame is not None]
    if not lined:
        return f"{head}, nor has any block live there (the snapshot records no Python frames)"
    block = max(lined, key=lambda g: g.size)
    return (
        f"{head}; the largest with one, {format_bytes(block.size)} {block.category}, "
        f"was {made(block)}"
    )


# The sweep's checks speak the sweep command's flags ("--tp 2 shards the vocabulary"); a
# gate's sweep was written as [tool.memprobe.sweep] keys, where no flag was given.
_FLAG = re.compile(r"--([a-z][a-z-]*)")


def _in_config_words(exc: UserError, source: Path | None) -> UserError:
    keys = {f.name for f in fields(Grid)}

    def spelled(text: str) -> str:
        def key(match: re.Match[str]) -> str:
            name = match.group(1).replace("-", "_")
            return name if name in keys else match.group(0)

        return _FLAG.sub(key, text)

    where = f"{source}: " if source is not None else ""
    return UserError(f"{where}{ROOT}.sweep: {spelled(exc.message)}", spelled(exc.hint))


def _run_configured_sweep(
    cfg: MemprobeConfig, req: GateRequest
) -> tuple[list[dict[str, Any]], str] | None:
    """Run ``[tool.memprobe.sweep]`` into ``req.out`` with the sweep job itself (its
    allocator settings and torchrun ranks); None on a rank that does not report.

    The default is ``reports/gate/<time>/`` next to the config file, so CI can
    keep it as an artifact.
    """
    # torch comes with the sweep: reading results and judging them must not pay for it.
    from memprobe.measure import resolve_device
    from memprobe.results import default_run_dir, rows_of
    from memprobe.sweep import SweepRequest, plan_cases, run_sweep_job

    if cfg.sweep is None:
        where = str(cfg.source) if cfg.source else f"no pyproject.toml at or above {req.cwd}"
        raise UserError(
            f"no RESULTS given and no [tool.memprobe.sweep] to run ({where})",
            "give a run directory or results.json, or add [tool.memprobe.sweep] tokens and vocab",
        )
    device = resolve_device(cfg.sweep.device)  # raises on cuda without CUDA
    for rule in cfg.gate.rules:
        if rule.device and device not in rule.device:
            why = " and CUDA is not available here" if "cuda" in rule.device else ""
            raise UserError(
                f"{rule.where} gates device {','.join(rule.device)} "
                f"but the sweep runs on {device}{why}",
                "drop the rule's device filter, or set device in [tool.memprobe.sweep]",
            )
    # A rule whose filters no planned case meets (tokens = [99] beside a sweep of 64) is
    # known now: it was refused only after the whole sweep had run, hours on a GPU.
    try:
        planned = [asdict(case) for case in plan_cases(cfg.sweep)]
    except UserError as exc:
        raise _in_config_words(exc, cfg.source) from None
    check_each_rule_matches(planned, cfg.gate.rules, source="the cases [tool.memprobe.sweep] plans")
    root = cfg.source.parent if cfg.source else req.cwd
    if req.out is not None and req.out.is_dir() and any(req.out.iterdir()):
        # The sweep's own refusal offered "continue it with --resume OUT", a flag the gate
        # does not have: the user who followed it got "No such option: --resume".
        hint = "choose another --out (the gate's sweep makes a new run)"
        if (req.out / RUN_META).exists():
            hint += (
                f", or gate that run: `memprobe gate {shell_word(req.out)}` (finish it first, "
                f"if it stopped, with `memprobe sweep --resume {shell_word(req.out)}`)"
            )
        raise UserError(f"--out {req.out} already exists and is not empty", hint)
    out = req.out or default_run_dir(root / "reports" / "gate")
    # With snapshots: a failing case's is what to look at (its path is in the report).
    request = SweepRequest(grid=cfg.sweep, out=out, verify=False, command="memprobe gate")
    outcome = run_sweep_job(request, req.progress)
    if not outcome.lead:
        return None
    return rows_of(outcome.frame), str(outcome.run_dir)
