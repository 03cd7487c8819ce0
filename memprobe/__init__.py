"""memprobe: memory profiling and regression gates for LLM log-probability kernels."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# Loaded on first use: ``import memprobe`` must stay cheap (no torch import).
_LAZY = {"fits": "memprobe.plan"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memprobe' has no attribute {name!r}")
