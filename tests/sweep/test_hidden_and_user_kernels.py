"""The hidden family and your own kernels, through the sweep and the planner."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memprobe.results import read_rows


def test_sweep_hidden_family_side_by_side(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, stdout, err = run_cli(
        "sweep", "--no-report",
        "--tokens", "2048", "--vocab", "8192", "--hidden", "256", "--no-ladder",
        "--device", "meta", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    rows = {r["kernel"]: r for r in read_rows(out)}
    assert set(rows) == {
        "linear_unchunked",
        "linear_local_chunked",
        "torch_linear_ce",
        "torch_linear_ce_accurate",
        "fused_linear_chunked",
    }
    floor = 2 * (2048 * 256 + 8192 * 256) * 2  # hidden + weight + both gradients, bf16
    for row in rows.values():
        assert row["hidden"] == 256 and row["floor_bytes"] == floor
    fused, unfused = rows["fused_linear_chunked"], rows["linear_local_chunked"]
    assert fused["status"] == "ok" and fused["peak_bytes"] < unfused["peak_bytes"]
    assert fused["big_fp32_blocks"] == 0 and rows["linear_unchunked"]["big_fp32_blocks"] > 0
    # Verified against float64: both gradients, within bf16 rounding.
    assert fused["max_abs_err_fwd"] < 1e-3 and fused["max_abs_err_bwd"] < 0.1
    assert "Fused: " in stdout and "for matmul + local_chunked" in stdout
    # Its own snapshot reads as a fused step, not as a classifier without logits.
    code, text, err = run_cli("attribute", str(out / fused["snapshot"]))
    assert code == 0, err
    assert "records a fused step" in text and "H = 256" in text and "classifier" not in text
    assert "parameters, setup, op input: weight" in text  # the lm_head weight
    assert "forward activations, setup, op input: hidden" in text


def test_hidden_kernels_need_a_hidden_size(run_cli) -> None:
    code, _, err = run_cli("sweep", "--kernel", "fused_linear_chunked", "--device", "meta")
    assert code == 2 and "--hidden" in err


@pytest.mark.parametrize("command", ["sweep", "plan"])
def test_logits_kernels_are_refused_with_a_hidden_size(run_cli, command: str) -> None:
    # --hidden runs the hidden family: a logits kernel named beside it would be
    # compared with linear_unchunked, whose inputs and floor differ.
    sizes = ["--tokens", "1024"] if command == "sweep" else ["--budget", "1GiB"]
    code, out, err = run_cli(
        command, *sizes, "--vocab", "16384", "--hidden", "512",
        "--kernel", "local_chunked,linear_unchunked",
    )  # fmt: skip
    assert code == 2 and not out
    assert "local_chunked takes logits, not hidden states" in err and "\n" not in err.strip()


def test_plan_hidden_family(run_cli) -> None:
    code, out, err = run_cli(
        "plan", "--vocab", "4096", "--hidden", "256", "--budget", "32MiB",
        "--kernel", "fused_linear_chunked,linear_unchunked", "--json",
    )  # fmt: skip
    assert code == 0, err
    rows = {r["kernel"]: r for r in json.loads(out)}
    assert rows["fused_linear_chunked"]["max_tokens"] > rows["linear_unchunked"]["max_tokens"]


USER_KERNEL = """
import torch


def logprobs(logits, targets, *, chunk_size=None):
    return torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "my_logprobs_under_test"
    (tmp_path / f"{name}.py").write_text(USER_KERNEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, name, raising=False)
    return f"{name}:logprobs"


def test_sweep_runs_your_kernel_by_import_path(run_cli, tmp_path: Path, user_module: str) -> None:
    out = tmp_path / "run"
    code, _, err = run_cli(
        "sweep", "--no-report", "--kernel", f"{user_module},unchunked", "--tokens", "256",
        "--vocab", "1024",
        "--no-ladder", "--device", "meta", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    rows = {r["kernel"]: r for r in read_rows(out)}
    mine, reference = rows[user_module], rows["unchunked"]
    # The same math as unchunked: the same simulated peak, verified against float64.
    assert mine["peak_bytes"] == reference["peak_bytes"] and mine["max_abs_err_fwd"] < 1e-5
    assert (out / mine["snapshot"]).exists()  # a portable file name despite the ':'


@pytest.mark.parametrize(
    ("kernel", "expected"),
    [
        ("no_such_module_here:fn", "cannot import 'no_such_module_here'"),
        ("json:not_there", "has no attribute"),
    ],
)
def test_a_bad_import_path_is_one_line(run_cli, kernel: str, expected: str) -> None:
    code, _, err = run_cli("sweep", "--kernel", kernel, "--device", "meta")
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
