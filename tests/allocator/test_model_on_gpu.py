"""The allocator model against the real CUDA caching allocator, case by case.

Runs only where a GPU is (skipped elsewhere); `benchmarks/gpu_check.py` prints the
same comparison for the headline shapes.
"""

from __future__ import annotations

import pytest
import torch

from memprobe.allocator import replay_snapshot
from memprobe.measure import measure
from memprobe.records import Case
from memprobe.snapshot.load import normalize_snapshot

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("kernel", ["unchunked", "naive_chunked", "local_chunked"])
def test_model_replays_the_real_allocator_exactly(kernel: str) -> None:
    run = measure(Case(kernel, 1, 4096, 32768, "bf16", 1024, device="cuda"))
    assert run.status == "ok" and run.cuda_snapshot is not None
    (replay,) = replay_snapshot(normalize_snapshot(run.cuda_snapshot), use_recorded_addresses=True)[
        :1
    ]
    assert replay.recorded_reserved_peak_bytes is not None
    assert replay.predicted_reserved_peak_bytes == replay.recorded_reserved_peak_bytes
    assert replay.predicted_segments == replay.recorded_segments
    assert replay.address_mismatches == 0
