"""A first gate run whose baseline does not exist yet says how to make it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprobe.records import Case, Run

RULES = '[tool.memprobe.gate]\nrules = [{ kernel = "local_chunked", max_peak = "1 GiB" }]\n'


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    case = Case("local_chunked", 1, 1024, 4096, "bf16", 256, 1, 1, "meta")
    rows = [Run(case, "ok", peak_bytes=2**20, big_fp32_blocks=0).row()]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps({"rows": rows}))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "args", "says"),
    [
        (RULES + 'baseline = "ci/base.json"\n', [], "the config's baseline ci/base.json"),
        (RULES + 'baseline = "base.json"\n', [], "the config's baseline base.json"),
        (RULES, ["--baseline", "ci/b.json"], "--baseline ci/b.json"),
        (RULES + 'baseline = "x.json"\n', ["--baseline", "y.json"], "--baseline y.json"),
    ],
)
def test_a_missing_baseline_points_at_update_baseline(project, run_cli, config, args, says):
    (project / "pyproject.toml").write_text(config, encoding="utf-8")
    code, out, err = run_cli("gate", "run", *args)
    assert code == 2 and out == ""
    path = says.split()[-1]
    # A config's baseline is named where it resolves, beside the config file.
    named = says if "--baseline" in says else f"{says.rsplit(' ', 1)[0]} {project / path}"
    assert f"{named} does not exist yet" in err
    assert "--update-baseline" in err and len(err.strip().splitlines()) == 1
    # Doing what it says works, and the next run compares.
    code, out, _ = run_cli("gate", "run", *args, "--update-baseline", path)
    assert code == 0 and f"wrote {path}" in out
    code, out, _ = run_cli("gate", "run", *args)
    assert code == 0 and "baseline " in out and f"{path} (max regression" in out
