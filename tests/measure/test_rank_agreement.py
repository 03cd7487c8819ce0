"""Two gloo ranks as under torchrun: one rank's OOM mid-kernel must not hang the other."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
from launch import forked_torchrun

from memprobe.results import read_results

pytestmark = [
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable"),
    pytest.mark.multiprocess,
]

SCRIPT = Path(__file__).with_name("oom_on_rank_one.py")
DEADLINE_S = 120  # before the fix rank 0 waited in its all_reduce for the gloo timeout


def test_one_ranks_oom_mid_kernel_ends_the_case_on_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = forked_torchrun(
        ["sweep", "--device", "cpu", "--tp", "2", "--kernel", "chunked_distributed,distributed",
         "--tokens", "128", "--vocab", "1024", "--no-verify", "--out", str(out)],
        cwd=tmp_path, script=SCRIPT, timeout=DEADLINE_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_results(out).set_index("kernel")
    first, second = rows.loc["chunked_distributed"], rows.loc["distributed"]
    # Both ranks' parts are in the first case's row: rank 1's OOM, rank 0 stopped by it.
    assert first["status"] == "oom"
    assert "rank 1: CUDA out of memory" in first["note"]
    assert "rank 0: stopped: rank 1 failed the case" in first["note"]
    # The ranks stayed in step: the next case ran on both.
    assert second["status"] == "ok" and second["fwd_collectives"] == 3
