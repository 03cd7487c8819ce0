"""Which kernels' meta simulation runs every chunk of their loop, and how many chunks.

The recomputing kernels skip their middle chunks on meta
(:func:`memprobe.kernels._steps.block_starts`), so their simulation costs the same at any
sequence length. ``naive_chunked`` and ``precast_chunked`` cannot: every chunk's saved
output stays until backward, so each chunk is simulated, and the cost grows with the
chunk count (1.7M tokens in chunks of 1024 took 62 s). A plan extrapolates their peak
exactly from two short runs (:mod:`memprobe.plan.long_loops`); a sweep, which keeps the
whole trace, skips a case whose loop is past :data:`MAX_SIMULATED_CHUNKS`.
"""

from __future__ import annotations

from memprobe.records import Case

# Kernels whose meta simulation runs every one of their chunks.
EVERY_CHUNK_KERNELS = frozenset({"naive_chunked", "precast_chunked"})
# A sweep simulates such a loop up to this many chunks (4M tokens in chunks of 1024:
# about two minutes for the one case on a loaded 2-core machine; a ladder past it doubled
# that with every step and never ended at 2^40 tokens).
MAX_SIMULATED_CHUNKS = 4_096


def chunk_count(case: Case) -> int:
    """Chunks the kernel's loop runs on one rank (1 when it has no chunk size)."""
    tokens = case.local_tokens
    if not case.chunk_size or tokens <= 0:
        return 1
    return -(-tokens // case.chunk_size)


def runs_every_chunk(case: Case) -> bool:
    """Whether this case's meta simulation grows with its chunk count."""
    return case.kernel in EVERY_CHUNK_KERNELS and case.chunk_size is not None


def too_long_to_simulate(case: Case) -> str | None:
    """Why a sweep skips ``case`` on meta (and on cpu, which simulates on meta first): a
    loop simulated chunk by chunk past :data:`MAX_SIMULATED_CHUNKS`; None otherwise."""
    if case.device == "cuda" or not runs_every_chunk(case):
        return None
    chunks = chunk_count(case)
    if chunks <= MAX_SIMULATED_CHUNKS:
        return None
    return (
        f"its meta simulation runs each of its {chunks:,} chunks (a sweep stops at "
        f"{MAX_SIMULATED_CHUNKS:,}); `memprobe plan` computes its peak exactly from two short runs"
    )
