"""Fixtures for the measurement tests: a fake ``torch.cuda`` backed by memprobe's tracker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from fake_cuda import FakeCuda


@pytest.fixture
def fake_cuda() -> Iterator[Callable[..., FakeCuda]]:
    """``fake_cuda(capacity=..., round_to=..., backend=...)`` installs a fake CUDA device,
    replacing the one installed before in the same test (a fresh device, nothing cached)."""
    current = ExitStack()

    def install(**state: Any) -> FakeCuda:
        nonlocal current
        current.close()
        current = ExitStack()
        patch = pytest.MonkeyPatch()
        current.callback(patch.undo)
        return current.enter_context(FakeCuda(**state).installed(patch))

    try:
        yield install
    finally:
        current.close()
