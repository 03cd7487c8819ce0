"""What the plan tells the user beside its table: what the reserved column stands on."""

from __future__ import annotations


def reserved_status(alloc_conf: str | None = None) -> str:
    """One line on what the reserved column is planned on."""
    settings = f" with {alloc_conf}" if alloc_conf else " with default settings"
    return (
        "reserved: planned on memprobe's model of the CUDA caching allocator"
        f"{settings} (memory outside PyTorch's allocator, e.g. the CUDA context, not included)"
    )
