"""Real multi-rank sweeps: a torchrun job whose world size disagrees with --tp.

(A two-rank job that measures and writes its run: tests/sweep/test_sharded_sweep.py, whose
--shard test compares against that very run.)"""

from __future__ import annotations

import os
import subprocess

import pytest
from launch import TORCHRUN

# Real torchrun jobs: several processes each, seconds per test.
pytestmark = pytest.mark.multiprocess


def torchrun(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*TORCHRUN, "-m", "memprobe", "sweep", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=env,
    )


def test_world_size_that_disagrees_with_tp_exits_2(tmp_path):
    done = torchrun(
        "--device",
        "cpu",
        "--tp",
        "4",
        "--kernel",
        "chunked_distributed",
        "--tokens",
        "256",
        "--vocab",
        "2048",
        "--out",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert done.returncode != 0
    # Each rank refuses before it imports torch; the first to exit ends the job, so the
    # other may be stopped by torchrun before it has printed its own line.
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("memprobe: error:")]
    assert lines and all("torchrun started 2 ranks but --tp 4" in ln for ln in lines), lines
    assert "exitcode  : 2" in done.stderr  # (torchrun prints its own traceback)
    assert not (tmp_path / "run").exists()
