"""memprobe gate: rules × cases, the baseline, exit codes, JUnit and the step summary.

Results are small results.json files built here from real records, so these
tests do not need the sweep; the last ones run the real sweep on meta.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch

from memprobe.config import Rule, load_config
from memprobe.errors import UserError
from memprobe.gate import case_label, check_baseline, evaluate
from memprobe.records import Case, Run
from memprobe.render.markdown import markdown_summary
from memprobe.results import read_results

GiB = 2**30
S, V = 20000, 131072
BF16_BSV = S * V * 2  # 4.88 GiB
LOCAL_PEAK, INPLACE_PEAK = 11_022_795_008, 5_779_927_296

CONFIG = """
[tool.memprobe.gate]
rules = [
  { kernel = "local_chunked", tokens = 20000, vocab = 131072, max_peak = "10.3 GiB" },
  { kernel = "local_chunked_inplace", tokens = 20000, max_peak = "5.4 GiB" },
  { kernel = "local_chunked*", max_big_fp32_blocks = 0 },
]
"""


def row(
    kernel: str = "local_chunked",
    tokens: int = S,
    vocab: int = V,
    *,
    peak: int | None = None,
    floor: int | None = None,
    blocks: int | None = 0,
    status: str = "ok",
    note: str = "",
    device: str = "meta",
) -> dict[str, Any]:
    case = Case(kernel, 1, tokens, vocab, "bf16", 1024, 1, 1, device)
    return Run(
        case,
        status,
        peak_bytes=peak,
        floor_bytes=floor,
        big_fp32_blocks=blocks if status == "ok" else None,
        note=note,
    ).row()


def headline_rows() -> list[dict[str, Any]]:
    """Simulated figures at 20000 × 131072 bf16 (DESIGN.md), plus one smaller case."""
    return [
        row("unchunked", peak=36_700_240_000, floor=2 * BF16_BSV, blocks=3),  # 34.18 GiB
        row("local_chunked", peak=LOCAL_PEAK, floor=2 * BF16_BSV),  # 10.27 GiB
        row("local_chunked_inplace", peak=INPLACE_PEAK, floor=BF16_BSV),  # 5.38 GiB
        row("local_chunked", 4096, peak=2_684_391_424, floor=2 * 4096 * V * 2),
    ]


def write_results(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"memprobe_version": "test", "rows": rows}), encoding="utf-8")
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with the gate config, as cwd; GITHUB_STEP_SUMMARY unset."""
    (tmp_path / "pyproject.toml").write_text(CONFIG, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return tmp_path


def rules_of(text: str, tmp_path: Path) -> tuple[Rule, ...]:
    path = tmp_path / "rules.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path).gate.rules


# -- rules × cases -------------------------------------------------------------


def test_headline_passes_and_glob_matches_both_chunked_kernels(tmp_path: Path) -> None:
    verdict = evaluate(headline_rows(), rules_of(CONFIG, tmp_path), results="r")
    assert verdict.passed and verdict.exit_code == 0
    blocks = [c for c in verdict.checks if c.kind == "max_big_fp32_blocks"]
    assert sorted(c.case.split()[0] for c in blocks) == [
        "local_chunked",
        "local_chunked",
        "local_chunked_inplace",
    ]
    peak = next(c for c in verdict.checks if c.source == "rules[0]")
    assert peak.measured == LOCAL_PEAK and peak.limit == int(10.3 * GiB)


def test_violation_carries_measured_limit_and_excess(tmp_path: Path) -> None:
    rows = headline_rows()
    rows[1] = row("local_chunked", peak=12 * GiB, floor=2 * BF16_BSV, blocks=1)
    verdict = evaluate(rows, rules_of(CONFIG, tmp_path), results="r")
    assert verdict.exit_code == 1
    peak, blocks = verdict.failures
    assert (peak.kind, peak.measured, peak.limit) == ("max_peak", 12 * GiB, int(10.3 * GiB))
    assert peak.excess == 12 * GiB - int(10.3 * GiB)
    assert peak.excess_pct == pytest.approx(100 * (12 / 10.3 - 1), rel=1e-6)
    assert (blocks.kind, blocks.measured, blocks.limit, blocks.excess) == (
        "max_big_fp32_blocks",
        1,
        0,
        1,
    )


def test_peak_over_floor_is_computed(tmp_path: Path) -> None:
    text = '[tool.memprobe.gate]\nrules = [{kernel="local_chunked", tokens=20000, ratio=1.05}]'
    rules = rules_of(text.replace("ratio", "max_peak_over_floor"), tmp_path)
    (check,) = evaluate(headline_rows(), rules, results="r").checks
    assert check.measured == pytest.approx(LOCAL_PEAK / (2 * BF16_BSV))
    assert check.passed is False and check.excess == pytest.approx(check.measured - 1.05)


@pytest.mark.parametrize("status", ["oom", "error", "skipped"])
def test_a_case_that_did_not_finish_fails_its_rules(tmp_path: Path, status: str) -> None:
    rows = headline_rows()
    rows[2] = row("local_chunked_inplace", status=status, note="CUDA out of memory")
    verdict = evaluate(rows, rules_of(CONFIG, tmp_path), results="r")
    failed = {(c.source, c.kind) for c in verdict.failures}
    assert failed == {("rules[1]", "status"), ("rules[2]", "status")}
    assert f"status {status}: CUDA out of memory" in verdict.failures[0].reason


def test_a_missing_measurement_fails_as_not_measured(tmp_path: Path) -> None:
    rows = [row("local_chunked", peak=GiB, floor=GiB, blocks=None, device="cuda")]
    rules = rules_of(
        '[tool.memprobe.gate]\nrules = [{kernel="local*", max_big_fp32_blocks=0}]', tmp_path
    )
    (check,) = evaluate(rows, rules, results="r").checks
    assert not check.passed and "not measured (big_fp32_blocks is empty" in check.reason


def test_a_rule_matching_nothing_is_a_usage_error(tmp_path: Path) -> None:
    rules = rules_of(
        '[tool.memprobe.gate]\nrules = [{kernel="local_chunkd", max_peak="1 B"}]', tmp_path
    )
    with pytest.raises(UserError) as info:
        evaluate(headline_rows(), rules, results="run/results.json")
    message = info.value.one_line()
    assert "rules[0] (local_chunkd) matches no case in run/results.json" in message
    assert "kernel local_chunked,local_chunked_inplace,unchunked" in message


def test_filters_narrow_a_rule_to_nothing(tmp_path: Path) -> None:
    text = '[tool.memprobe.gate]\nrules = [{kernel="*", dtype="fp32", max_peak="1 B"}]'
    with pytest.raises(UserError, match="matches no case"):
        evaluate(headline_rows(), rules_of(text, tmp_path), results="r")


def test_a_cuda_rule_without_cuda_is_a_usage_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    text = '[tool.memprobe.gate]\nrules = [{kernel="*", device="cuda", max_peak="80 GiB"}]'
    with pytest.raises(UserError, match="CUDA is not available here"):
        evaluate(headline_rows(), rules_of(text, tmp_path), results="r")


def test_a_cuda_rule_on_cuda_results_is_checked_anywhere(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rows = [row("local_chunked", peak=11 * GiB, floor=10 * GiB, blocks=None, device="cuda")]
    text = '[tool.memprobe.gate]\nrules = [{kernel="*", device="cuda", max_peak="10.3 GiB"}]'
    (check,) = evaluate(rows, rules_of(text, tmp_path), results="r").checks
    assert not check.passed and check.measured == 11 * GiB


# -- baseline ------------------------------------------------------------------


def test_baseline_growth_within_the_allowance_passes() -> None:
    base = headline_rows()
    now = headline_rows()
    now[1] = row("local_chunked", peak=int(LOCAL_PEAK * 1.02), floor=2 * BF16_BSV)
    checks, notes = check_baseline(now, base, max_regression=2.5)
    assert all(c.passed for c in checks) and notes == []
    checks, _ = check_baseline(now, base, max_regression=1)
    (failed,) = [c for c in checks if not c.passed]
    assert failed.kind == "regression" and failed.reference == LOCAL_PEAK
    assert failed.limit == pytest.approx(LOCAL_PEAK * 1.01)


def test_zero_regression_means_any_growth_fails() -> None:
    now = headline_rows()
    now[2] = row("local_chunked_inplace", peak=INPLACE_PEAK + 2, floor=BF16_BSV)
    checks, _ = check_baseline(now, headline_rows(), max_regression=0)
    assert [c.case for c in checks if not c.passed] == [case_label(now[2])]


def test_baseline_disappearance_oom_and_new_cases() -> None:
    base = headline_rows()
    now = [base[0], row("local_chunked", status="oom", note="out of memory"), base[3]]
    now.append(row("local_chunked", 8192, peak=GiB, floor=GiB))
    checks, notes = check_baseline(now, base, max_regression=0)
    failed = {c.case.split()[0]: c for c in checks if not c.passed}
    assert set(failed) == {"local_chunked", "local_chunked_inplace"}
    assert failed["local_chunked"].reason == "turned oom: out of memory (was ok)"
    assert failed["local_chunked_inplace"].kind == "disappeared"
    assert notes == ["1 case(s) not in the baseline, not compared"]


def test_a_case_failing_in_the_baseline_cannot_regress() -> None:
    base = [row("unchunked", status="oom")]
    now = [row("unchunked", status="oom")]
    (check,) = check_baseline(now, base, max_regression=0)[0]
    assert check.passed and check.reason == "baseline status oom, now oom"


def test_baseline_on_another_device_is_a_usage_error() -> None:
    base = headline_rows()
    now = [row("local_chunked", peak=GiB, floor=GiB, device="cuda")]
    with pytest.raises(UserError, match="measured on meta and these results on cuda"):
        check_baseline(now, base, max_regression=0)


def test_negative_regression_allowance_is_a_usage_error() -> None:
    with pytest.raises(UserError, match="is not a percentage"):
        evaluate(headline_rows(), (), results="r", baseline=[], max_regression=-1)


# -- the command -----------------------------------------------------------------


def test_exit_0_when_every_check_passes(project: Path, run_cli) -> None:
    write_results(project / "run" / "results.json", headline_rows())
    code, out, err = run_cli("gate", "run")
    assert code == 0, err
    assert "memprobe gate: 4 case(s) from run" in out
    spare = (int(10.3 * GiB) - LOCAL_PEAK) / 2**20
    assert f"peak 10.27 GiB <= limit 10.30 GiB ({spare:.2f} MiB to spare)" in out
    assert out.rstrip().endswith("passed: all 5 check(s)")


def test_exit_1_prints_case_measured_limit_and_excess(project: Path, run_cli) -> None:
    rows = headline_rows()
    rows[1] = row("local_chunked", peak=11 * GiB + GiB // 2, floor=2 * BF16_BSV, blocks=2)
    write_results(project / "bad.json", rows)
    code, out, _ = run_cli("gate", "bad.json")
    assert code == 1
    fails = [line for line in out.splitlines() if line.lstrip().startswith("FAIL  ")]
    assert len(fails) == 2
    assert "local_chunked b1 s20000 v131072 bf16 c1024 meta" in fails[0]
    assert "peak 11.50 GiB > limit 10.30 GiB: over by 1.20 GiB (+11.7%)" in fails[0]
    assert "float32 [B,S,V] blocks 2 > limit 0: over by 2" in fails[1]
    assert out.rstrip().endswith("FAILED: 2 of 5 check(s) failed")


@pytest.mark.parametrize(
    ("args", "config", "expected"),
    [
        (["gate", "missing"], CONFIG, "no results at missing"),
        (["gate", "run", "--baseline", "nope.json"], CONFIG, "--baseline nope.json does not exist"),
        (["gate", "run", "--max-regression", "-3"], CONFIG, "'-3' is not a percentage of zero"),
        (
            ["gate", "run"],
            '[tool.memprobe.gate]\nrules = [{kernel="local_chunked", max_peek="1 GiB"}]',
            "pyproject.toml: tool.memprobe.gate.rules[0]: unknown key 'max_peek'",
        ),
        (
            ["gate", "run"],
            '[tool.memprobe.gate]\nrules = [{kernel="lcoal_chunked", max_peak="1 GiB"}]',
            "rules[0] (lcoal_chunked) matches no case in run",
        ),
        (["gate", "run"], "[project]\nname = 'x'\n", "nothing to check"),
        (["gate"], CONFIG, "no RESULTS given and no [tool.memprobe.sweep]"),
        (
            ["gate", "run", "--config", "other.toml"],
            CONFIG,
            "config file other.toml does not exist",
        ),
        (["gate", "run"], "[tool.memprobe\n", "is not valid TOML"),
    ],
)
def test_exit_2_on_usage_and_config_errors(
    project: Path, run_cli, args: list[str], config: str, expected: str
) -> None:
    (project / "pyproject.toml").write_text(config, encoding="utf-8")
    write_results(project / "run" / "results.json", headline_rows())
    code, out, err = run_cli(*args)
    assert code == 2
    assert out == ""
    assert err.startswith("memprobe: error: ") and err.count("\n") == 1
    assert expected in err


def test_cuda_rule_on_a_machine_without_cuda_stops_before_the_sweep(
    project: Path, run_cli, monkeypatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (project / "pyproject.toml").write_text(
        "[tool.memprobe.sweep]\ntokens = [1024]\nvocab = [16384]\n"
        '[tool.memprobe.gate]\nrules = [{kernel="*", device="cuda", max_peak="1 GiB"}]\n',
        encoding="utf-8",
    )
    code, _, err = run_cli("gate", "--out", "run")
    assert code == 2
    assert "gates device cuda but the sweep runs on meta and CUDA is not available here" in err
    assert not (project / "run").exists()


def test_junit_xml_is_well_formed_with_one_testcase_per_check(project: Path, run_cli) -> None:
    rows = headline_rows()
    rows[2] = row("local_chunked_inplace", status="oom", note='tried <2.00 GiB> & "more"')
    write_results(project / "bad.json", rows)
    write_results(project / "base.json", headline_rows())
    code, out, _ = run_cli("gate", "bad.json", "--baseline", "base.json", "--junit-xml", "ci/j.xml")
    assert code == 1 and "wrote ci/j.xml" in out
    root = ET.parse(project / "ci" / "j.xml").getroot()  # parses: escaping is right
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    failures = [c for c in cases if c.find("failure") is not None]
    # 5 rule checks (the oom case gives one status check per rule) + 4 baseline checks
    assert (len(cases), len(failures)) == (9, 3)
    assert suite.get("tests") == "9" and suite.get("failures") == "3"
    names = {(c.get("classname"), c.get("name")) for c in failures}
    label = "local_chunked_inplace b1 s20000 v131072 bf16 c1024 meta"
    assert names == {
        ("memprobe.gate.rules[1]", f"status: {label}"),
        ("memprobe.gate.rules[2]", f"status: {label}"),
        ("memprobe.gate.baseline", f"status: {label}"),
    }
    messages = [c.find("failure").get("message") for c in failures]  # type: ignore[union-attr]
    assert 'tried <2.00 GiB> & "more"' in messages[0]


def test_step_summary_is_appended_when_set(project: Path, run_cli, monkeypatch) -> None:
    summary = project / "summary.md"
    summary.write_text("earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    rows = headline_rows()
    rows[1] = row("local_chunked", peak=11 * GiB, floor=2 * BF16_BSV)
    write_results(project / "bad.json", rows)
    assert run_cli("gate", "bad.json")[0] == 1
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("earlier step\n### memprobe gate: 1 of 5 checks failed")
    assert "| ❌ | rules[0] max_peak | `local_chunked b1 s20000 v131072 bf16 c1024 meta` |" in text
    assert "| 11.00 GiB | 10.30 GiB | 716.80 MiB (+6.8%) |" in text


def test_markdown_escapes_pipes(tmp_path: Path) -> None:
    rows = [row("local_chunked", status="error", note="a|b")]
    rules = rules_of('[tool.memprobe.gate]\nrules = [{kernel="*", max_peak="1 B"}]', tmp_path)
    text = markdown_summary(evaluate(rows, rules, results="r"))
    assert "a\\|b" in text


def test_update_baseline_writes_a_readable_baseline(project: Path, run_cli) -> None:
    write_results(project / "run" / "results.json", headline_rows())
    code, out, _ = run_cli("gate", "run", "--update-baseline", "ci/baseline.json")
    assert code == 0 and "wrote ci/baseline.json" in out
    written = read_results(project / "ci" / "baseline.json")
    assert written.to_dict(orient="records") == read_results(project / "run").to_dict(
        orient="records"
    )
    code, out, _ = run_cli("gate", "run", "--baseline", "ci/baseline.json")
    assert code == 0 and "baseline ci/baseline.json (max regression 0%)" in out


def test_update_baseline_runs_the_checks_too(project: Path, run_cli) -> None:
    rows = headline_rows()
    rows[1] = row("local_chunked", peak=11 * GiB, floor=2 * BF16_BSV)
    write_results(project / "bad.json", rows)
    code, _, _ = run_cli("gate", "bad.json", "--update-baseline", "b.json")
    assert code == 1 and (project / "b.json").exists()


def test_config_baseline_missing_on_first_update(project: Path, run_cli) -> None:
    (project / "pyproject.toml").write_text(
        CONFIG + 'baseline = "b.json"\nmax_regression = 1\n', encoding="utf-8"
    )
    write_results(project / "run" / "results.json", headline_rows())
    code, out, _ = run_cli("gate", "run", "--update-baseline", "b.json")
    assert code == 0 and "note: baseline" in out and "does not exist yet" in out
    code, out, _ = run_cli("gate", "run")
    assert code == 0 and "(max regression 1%)" in out


def test_cli_runner_maps_user_errors_to_exit_2(project: Path) -> None:
    from typer.testing import CliRunner

    from memprobe.cli import app

    result = CliRunner().invoke(app, ["gate", "missing.json"])
    assert result.exit_code == 2
    assert "memprobe: error: no results at missing.json" in result.output


def test_installed_entry_point_exit_codes(project: Path) -> None:
    """Through a real process: `python -m memprobe gate` (one subprocess, ~3 s)."""
    rows = headline_rows()
    rows[1] = row("local_chunked", peak=11 * GiB, floor=2 * BF16_BSV)
    write_results(project / "bad.json", rows)
    proc = subprocess.run(
        [sys.executable, "-m", "memprobe", "gate", "bad.json", "--junit-xml", "j.xml"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "FAIL  rules[0]" in proc.stdout and (project / "j.xml").exists()


# -- end to end on meta ----------------------------------------------------------------

SWEEP = """
[tool.memprobe.sweep]
tokens = [4096]
vocab = [16384]
kernel = ["unchunked", "local_chunked"]
device = "meta"

[tool.memprobe.gate]
rules = [
  { kernel = "local_chunked*", max_big_fp32_blocks = 0 },
  { kernel = "unchunked", max_peak = "900 MiB" },
]
"""


def test_gate_runs_the_configured_sweep(project: Path, run_cli) -> None:
    (project / "pyproject.toml").write_text(SWEEP, encoding="utf-8")
    code, out, err = run_cli("gate")
    assert code == 0, out + err
    (run_dir,) = (project / "reports" / "gate").iterdir()
    assert f"memprobe gate: 2 case(s) from {run_dir}" in out
    # unchunked is 14·B·S·V bytes (896 MiB) plus its [B,S] float32 output
    assert "peak 896.02 MiB <= limit 900.00 MiB" in out
    assert (run_dir / "results.json").exists() and "[2/2] local_chunked" in err


def test_gate_fails_a_deliberately_regressed_kernel(project: Path, run_cli, monkeypatch) -> None:
    """A caller that pre-casts the logits to float32 brings the [B,S,V] blocks back."""
    from memprobe.kernels import registry

    spec = registry.KERNELS["local_chunked"]

    def precast(logits: torch.Tensor, targets: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return spec.fn(logits.float(), targets, **kwargs)

    monkeypatch.setitem(registry.KERNELS, "local_chunked", dataclasses.replace(spec, fn=precast))
    (project / "pyproject.toml").write_text(SWEEP, encoding="utf-8")
    code, out, _ = run_cli("gate", "--out", "run")
    assert code == 1
    assert "FAIL  rules[0]  max_big_fp32_blocks  local_chunked b1 s4096 v16384" in out
    assert "> limit 0: over by" in out
