"""Fixtures shared by the command tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import swept


@pytest.fixture(scope="session")
def made_run(tmp_path_factory) -> Path:
    """One small run, swept once per test process (a dozen modules read it); tests copy
    it before they change it."""
    return swept(
        tmp_path_factory.mktemp("made") / "run",
        *("--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked"),
        *("--device", "meta", "-q", "--no-verify"),
    )


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh current directory, importable: where a test writes a user's step or kernel."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path
