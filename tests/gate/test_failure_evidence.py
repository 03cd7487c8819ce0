"""A failing gate names the line behind each failing case's peak and where its snapshot
is; the gate's own sweep keeps those snapshots."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memprobe.attribute.records import BlockGroup
from memprobe.gate.job import _largest_blocks_text
from memprobe.records import Frame
from memprobe.sweep import plan_cases, run_sweep

SWEEP = """
[tool.memprobe.sweep]
tokens = [512]
vocab = [4096]
kernel = ["unchunked", "local_chunked"]
chunk_size = [128]
device = "meta"
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "run"
    cases = plan_cases(tokens=[512], vocab=[4096], kernel=["unchunked", "local_chunked"],
                       chunk_size=[128], device="meta", ladder=False)  # fmt: skip
    run_sweep(cases, out, verify=False)
    return out


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swept: Path) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    shutil.copytree(swept, tmp_path / "run")
    return tmp_path


def _notes(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("note: ")]


@pytest.mark.parametrize(
    ("rule", "failing", "made_at"),
    [
        ('{ kernel = "*", max_big_fp32_blocks = 0 }', ["unchunked"], "in unchunked_logprobs"),
        ('{ kernel = "*", max_peak = "1 MiB" }', ["unchunked", "local_chunked"], " in "),
        ('{ kernel = "local_chunked", max_peak_over_floor = 1.0 }', ["local_chunked"], " in "),
        ('{ kernel = "*", max_peak = "1 GiB" }', [], ""),  # passes: nothing to explain
    ],
)
@pytest.mark.parametrize("given", ["run", "run/results.json"])
def test_failures_name_the_line_and_the_snapshot(project, run_cli, rule, failing, made_at, given):
    (project / "pyproject.toml").write_text(f"[tool.memprobe.gate]\nrules = [{rule}]\n")
    code, out, err = run_cli("gate", given)
    assert code == (1 if failing else 0), err
    notes = _notes(out)
    assert [n.split()[1] for n in notes] == failing
    for note in notes:
        assert "its largest block live at the peak" in note and made_at in note
        snapshot = Path(note.rsplit("snapshot ", 1)[1])
        assert snapshot.is_file() and snapshot.parent.resolve() == project / "run" / "snapshots"


def test_rows_without_snapshots_are_explained_by_nothing(project, run_cli):
    payload = json.loads((project / "run" / "results.json").read_text())
    for row in payload["rows"]:
        row["snapshot"] = None
    (project / "run" / "results.json").write_text(json.dumps(payload))
    (project / "pyproject.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 MiB" }]\n'
    )
    code, out, _ = run_cli("gate", "run")
    assert code == 1 and _notes(out) == []


def test_the_gates_own_sweep_keeps_the_snapshots(project, run_cli):
    (project / "pyproject.toml").write_text(
        SWEEP + '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_big_fp32_blocks = 0 }]\n'
    )
    code, out, err = run_cli("gate", "--out", "gated")
    assert code == 1, err
    (note,) = _notes(out)
    assert note.split()[1] == "unchunked" and "unchunked_logprobs" in note
    assert Path(note.rsplit("snapshot ", 1)[1]).is_file()
    assert len(list((project / "gated" / "snapshots").glob("*.pickle"))) == 2


def _group(size: int, op: str, frame: Frame | None, kernel: Frame | None = None) -> BlockGroup:
    return BlockGroup(1, size, size, "logits-family", op, frame, "forward", False, True,
                      kernel=kernel)  # fmt: skip


LINE = Frame("_grad_buffer", "/x/memprobe/kernels/local_chunked.py", 137)
USER = Frame("step", "/home/me/train.py", 9)


@pytest.mark.parametrize(
    ("groups", "says"),
    [
        ([_group(4 << 20, "aten.empty_like.default", LINE)],
         ["4.00 MiB logits-family, was made at local_chunked.py:137 in _grad_buffer"]),
        # The input the harness made is the largest: it has no line, the next one does.
        ([_group(8 << 20, "input:_logits", None), _group(2 << 20, "aten.mm.default", LINE)],
         ["8.00 MiB logits-family (op input: logits), has no source line",
          "the largest with one, 2.00 MiB logits-family, was made at local_chunked.py:137"]),
        ([_group(8 << 20, "aten.mm.default", None), _group(1 << 20, "aten.mm.default", None)],
         ["has no source line, nor has any block live there"]),
        # Made in memprobe's kernel for the user's line: both are named.
        ([_group(4 << 20, "aten._to_copy.default", USER, LINE)],
         ["made at train.py:9 in step (op aten._to_copy.default in memprobe's kernel "
          "(local_chunked.py:137 in _grad_buffer))"]),
    ],
)  # fmt: skip
def test_a_failure_names_a_source_line_when_the_largest_block_has_none(groups, says) -> None:
    text = _largest_blocks_text(groups)
    assert all(s in text for s in says), text
