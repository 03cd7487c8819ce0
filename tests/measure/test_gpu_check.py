"""benchmarks/gpu_check.py: one line and exit 0 without a GPU; its checks, run on the fake."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

# Imported before the fake freezes the heap, so its garbage collections stay short.
import memprobe.attribute  # noqa: F401
import memprobe.sweep  # noqa: F401

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_says_so_in_one_line_and_measures_nothing(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on this CPU build
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and "no GPU" in out and not err
    assert not (tmp_path / "out").exists()


def test_on_a_fake_gpu_every_check_runs_and_passes(
    gpu_check: ModuleType, fake_cuda, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Capacity: the sweep's cases fit (the fake gives every small block its own 2 MiB
    # segment), unchunked at the OOM shape does not.
    fake_cuda(capacity=256 << 20)
    argv = ["--out", str(tmp_path), "--tokens", "256", "--vocab", "1024"]
    argv += ["--hidden", "64", "--hidden-tokens", "256", "--error-shape", "32", "256", "16"]
    code = gpu_check.main([*argv, "--oom-tokens", "32768"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    failed = [(c["kernel"], c["checks"]) for c in summary["cases"] if not c["pass"]]
    assert code == 0 and summary["pass"], (failed, summary["oom"])
    from memprobe.kernels import kernel_names

    singles = kernel_names(distributed=False)  # every single-device logits kernel
    hidden = kernel_names(inputs="hidden")
    assert len(summary["cases"]) == len(singles) + len(hidden)
    assert [c["kernel"] for c in summary["cases"] if c["hidden"] == 64] == hidden
    assert all(c["tolerance_bytes"] > 0 for c in summary["cases"])
    assert summary["oom"]["status"] == "oom" and summary["oom"]["ooms"]
    assert "PASS" in (tmp_path / "summary.md").read_text()
    # The GPU peers are not installed here: listed as skipped with the reason; the
    # kernels beside them are measured and checked against float64.
    peers = {p["kernel"]: p for p in summary["peers"]}
    assert peers["liger_fused_linear_ce"]["status"] == "skipped"
    assert peers["liger_fused_linear_ce"]["note"].startswith("needs CUDA + liger-kernel")
    assert peers["cce_linear_ce"]["note"].startswith("needs CUDA + cut-cross-entropy")
    for kernel in ("fused_linear_chunked", "torch_linear_ce", "local_chunked"):
        assert peers[kernel]["status"] == "ok" and peers[kernel]["peak_bytes"] > 0
        assert 0 < peers[kernel]["max_abs_err_fwd_random"] < 0.1
        assert 0 < peers[kernel]["max_abs_err_bwd_random"] < 0.1
    # Every timed logits kernel against the HBM floor (3 x the logits' bytes).
    floors = summary["hbm_floor"]["kernels"]
    assert {f["kernel"] for f in floors} >= {"local_chunked", "unchunked"}
    assert all(f["bytes_moved"] == 3 * 2 * f["tokens"] * 1024 for f in floors)
    assert summary["sharded"]["skipped"]  # torchrun's ranks cannot see the fake GPU
    assert capsys.readouterr().out.startswith("gpu_check: PASS")
