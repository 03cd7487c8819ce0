"""``memprobe gate``: load the config, get results (reading them or running the sweep),
check them against the rules and a baseline, write the reports, exit 0/1/2."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from memprobe.commands.flags import user_errors
from memprobe.config import MemprobeConfig, load_config
from memprobe.errors import UserError
from memprobe.gate import Verdict, evaluate
from memprobe.io.files import check_output
from memprobe.records import Case, Run
from memprobe.render.gate_text import format_verdict
from memprobe.render.junit import write_junit
from memprobe.render.markdown import append_step_summary
from memprobe.results import read_rows, results_file, run_inputs, write_baseline

Progress = Callable[[int, int, Case, Run], None]


@dataclass(frozen=True)
class GateRequest:
    """What the CLI asks for: every flag of ``memprobe gate``."""

    results: Path | None = None
    config: Path | None = None
    baseline: Path | None = None
    max_regression: float | None = None
    junit_xml: Path | None = None
    update_baseline: Path | None = None
    out: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)
    progress: Progress | None = None


@dataclass(frozen=True)
class GateOutcome:
    verdict: Verdict
    text: str  # the report to print on stdout
    written: tuple[Path, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


def run_gate(req: GateRequest) -> GateOutcome:
    """Load the config, get results (reading them or running the sweep), check, write reports.

    Usage and config errors raise UserError before anything is measured or written.
    """

    if req.results is not None and not results_file(req.results).exists():
        # The first thing to say about a mistyped path, before any config question.
        raise UserError(f"no results at {req.results}", "give a run directory or its results.json")
    if req.junit_xml is not None:
        # Checked before anything runs: the report must not replace an input.
        inputs = [*(run_inputs(req.results) if req.results else []), *filter(None, [req.baseline])]
        check_output(req.junit_xml, inputs, flag="--junit-xml")
    cfg = load_config(req.config, start=req.cwd)
    config_name = str(cfg.source) if cfg.source else None
    max_regression = req.max_regression
    if max_regression is None:
        max_regression = cfg.gate.max_regression or 0.0
    baseline_path = req.baseline or cfg.gate.baseline
    baseline_rows: list[dict[str, Any]] | None = None
    notes: list[str] = []
    if baseline_path is not None:
        if (
            req.update_baseline
            and _same_file(baseline_path, req.update_baseline)
            and not baseline_path.exists()
        ):
            # First run of `gate --update-baseline` with the baseline named in the config.
            notes.append(f"baseline {baseline_path} does not exist yet; not compared")
            baseline_path = None
        else:
            baseline_rows = read_rows(baseline_path)
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
        rows, source = _run_configured_sweep(cfg, req)
    verdict = evaluate(
        rows,
        rules,
        results=source,
        baseline=baseline_rows,
        baseline_source=str(baseline_path) if baseline_path else None,
        max_regression=max_regression,
        config=config_name,
    )
    if notes:
        verdict = replace(verdict, notes=(*notes, *verdict.notes))
    written: list[Path] = []
    warnings: list[str] = []
    if req.junit_xml is not None:
        write_junit(req.junit_xml, verdict)
        written.append(req.junit_xml)
    warning = append_step_summary(verdict)
    if warning:
        warnings.append(warning)
    if req.update_baseline is not None:
        write_baseline(req.update_baseline, rows)
        written.append(req.update_baseline)
    text = format_verdict(verdict, written=written)
    return GateOutcome(verdict=verdict, text=text, written=tuple(written), warnings=tuple(warnings))


def _same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _run_configured_sweep(
    cfg: MemprobeConfig, req: GateRequest
) -> tuple[list[dict[str, Any]], str]:
    """Run ``[tool.memprobe.sweep]`` into ``req.out``.

    The default is ``reports/gate/<time>/`` next to the config file, so CI can
    keep it as an artifact.
    """
    from memprobe.measure import resolve_device
    from memprobe.results import default_run_dir, rows_of
    from memprobe.sweep import plan_cases, run_sweep

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
    cases = plan_cases(cfg.sweep)
    root = cfg.source.parent if cfg.source else req.cwd
    out = req.out or default_run_dir(root / "reports" / "gate")
    frame = run_sweep(
        cases, out, verify=False, progress=req.progress, command="memprobe gate", snapshots=False
    )
    return rows_of(frame), str(out)


@user_errors
def command(
    results: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Argument(help="Run directory or results.json (default: run tool.memprobe.sweep)."),
    ] = None,
    config: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="TOML file with tool.memprobe (default: nearest pyproject.toml)."),
    ] = None,
    baseline: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="results.json of an earlier run: fail on growth, loss, oom/error."),
    ] = None,
    max_regression: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(metavar="PCT", help="Peak growth allowed over the baseline, % (default: 0)."),
    ] = None,
    junit_xml: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Write a JUnit XML file: one testcase per rule x case."),
    ] = None,
    update_baseline: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Write these results as the new baseline (the checks still run)."),
    ] = None,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Run directory for the gate's own sweep (default: reports/gate/TIME)."),
    ] = None,
) -> None:
    """Fail CI when a peak crosses a rule or regresses against a baseline.

    Rules live in tool.memprobe.gate of pyproject.toml: a kernel glob, optional
    filters (tokens, vocab, batch, dtype, chunk_size, tp, cp, device) and limits
    (max_peak, max_peak_over_floor, max_big_fp32_blocks). Exit 0 when every
    check passes, 1 on any violation, 2 on a config or usage error (a rule that
    matches no case is one).
    """
    from memprobe.render.console import Progress

    request = GateRequest(
        results=results,
        config=config,
        baseline=baseline,
        max_regression=max_regression,
        junit_xml=junit_xml,
        update_baseline=update_baseline,
        out=out,
        progress=Progress().case,
    )
    outcome = run_gate(request)
    for warning in outcome.warnings:
        typer.echo(f"memprobe: warning: {warning}", err=True)
    typer.echo(outcome.text)
    raise typer.Exit(outcome.exit_code)
