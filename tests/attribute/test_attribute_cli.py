"""``memprobe attribute``: the report, --json, --html, and one line + exit 2 on a bad file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import snapshot_fixtures as fx
from typer.testing import CliRunner

from memprobe.cli import app
from memprobe.snapshot import write_snapshot


@pytest.fixture
def oom_file(tmp_path: Path) -> Path:
    return write_snapshot(fx.oom_snapshot(), tmp_path / "oom.pickle")


def test_text_report(run_cli, oom_file: Path) -> None:
    code, out, err = run_cli("attribute", str(oom_file), "--vocab", "131072", "--top", "3")
    assert code == 0, err
    assert "peak allocated: 34.18 GiB" in out
    assert "live at the peak: 5 blocks in 5 groups; the 3 largest:" in out
    assert "made of: 34.18 GiB logits-family" in out
    assert out.count("float32 [1, 20000, 131072]") >= 3
    assert "OOM #1" in out and "requested 10,485,760,000 B (9.77 GiB)" in out
    assert "backward" in out and "forward" in out


def test_json_is_one_object_with_findings(run_cli, oom_file: Path) -> None:
    code, out, _ = run_cli("attribute", str(oom_file), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["peak_allocated_bytes"] == fx.HEADLINE_PEAK
    required = {"size", "dtype", "shape", "op", "frame", "phase", "live_at_peak"}
    assert data["findings"] and all(required <= set(f) for f in data["findings"])
    fp32 = [f for f in data["findings"] if f["size"] == fx.FP32_BSV]
    assert {f["phase"] for f in fp32} == {"forward", "backward"}
    assert data["ooms"][0]["device_free_bytes"] == 3 * 2**30


def test_html_page(run_cli, oom_file: Path, tmp_path: Path) -> None:
    page = tmp_path / "out" / "attribution.html"
    code, out, err = run_cli("attribute", str(oom_file), "--html", str(page))
    assert code == 0 and "peak allocated" in out
    assert err.strip() == f"page: {page}"  # where the page went, off stdout
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "float32 [1, 20000, 131072]" in text


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        (b"", "empty"),
        (b"\x80\x04\x95", "truncated"),
        (b"hello world", "not a pickle"),
        (fx.malicious_pickle("echo hi"), "refused"),
    ],
    ids=["missing", "empty", "truncated", "text", "global"],
)
def test_bad_file_is_one_line_and_exit_2(
    run_cli, tmp_path: Path, content: bytes | None, expected: str
) -> None:
    path = tmp_path / "snap.pickle"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run_cli("attribute", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("memprobe: error:") and expected in err


def test_exit_2_without_the_entry_point(tmp_path: Path) -> None:
    # CliRunner calls the typer app directly, bypassing main(): still exit 2, one line.
    result = CliRunner().invoke(app, ["attribute", str(tmp_path / "missing.pickle")])
    assert result.exit_code == 2
    assert "does not exist" in result.output and result.output.count("\n") == 1
