from __future__ import annotations

import sys

import pytest

from memprobe import cli


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """Run ``memprobe ARGS`` through the real entry point; return (code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["memprobe", *args])
        code = 0
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run
