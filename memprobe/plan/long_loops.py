"""Allocated peaks of the plain-autograd chunk loops at any chunk count, from two short runs.

``naive_chunked`` and ``precast_chunked`` cannot skip their middle chunks on meta the way
the recomputing kernels do (:func:`memprobe.kernels._steps.block_starts`): every chunk's
float32 log-softmax output stays saved until backward, and every chunk's backward builds a
full-size slice gradient. Their simulation is linear in the chunk count (1.7M tokens in
chunks of 1024 took 62 s), which made one plan take minutes.

It need not run every chunk. Take ``n`` chunks, the last one ``r`` tokens wide
(``0 < r <= c``). Going from ``n`` to ``n + 1`` chunks (same ``r``) adds one full chunk to
forward and one to backward, each making exactly the blocks of its neighbours, and grows
every sequence-sized block (the logits, each slice gradient, their running sum, the
concatenated output) by ``c`` tokens' worth. So the live bytes at each moment of the trace
grow by a constant per chunk, and, once the first chunks' start-up effects are behind (the
peak sits in the second backward chunk: the logits, every saved output but one, the
running sum, a slice gradient and their new sum), so does the peak: for ``n >= n0``

    peak(n) = peak(n0) + (n - n0) · (peak(n0 + 1) - peak(n0))

exactly. ``tests/plan/test_long_loops.py`` checks it against the full simulation at every
chunk count up to a few dozen, over batch, vocabulary, dtype, chunk size and last width.

Only the allocated peak is extrapolated. The allocator model's reserved peak rounds
sequence-sized segments to its 2 MiB granule, which is not linear in the chunk count, so
a reserved search is planned only while a loop has at most :data:`RESERVED_MAX_CHUNKS`
chunks (each simulation then stays under a few seconds), and the plan says so beyond it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from memprobe.measure.loops import chunk_count, runs_every_chunk
from memprobe.records import Case

# The two short runs extrapolated from: past the start-up chunks (the peak settles by the
# fifth), and cheap (about 0.3 s on meta).
BASE_CHUNKS = 8
# Up to this many chunks the loop is simulated in full (not much dearer than two runs).
FULL_CHUNKS = 16
# The reserved search of such a loop runs only while the answer has at most this many
# chunks (a simulation of 64 takes about 2 s).
RESERVED_MAX_CHUNKS = 64


def _with_chunks(case: Case, chunks: int, last: int) -> Case:
    assert case.chunk_size is not None
    local = (chunks - 1) * case.chunk_size + last
    return replace(case, tokens=local * case.cp)


def allocated_peak(case: Case, simulate: Callable[[Case], int]) -> int:
    """The allocated peak of ``case``: ``simulate(case)`` itself, or for a loop of more than
    :data:`FULL_CHUNKS` chunks the exact line through two runs of :data:`BASE_CHUNKS`
    and one more chunk with the same last width (see the module notes)."""
    chunks = chunk_count(case)
    if not runs_every_chunk(case) or chunks <= FULL_CHUNKS:
        return simulate(case)
    assert case.chunk_size is not None
    last = case.local_tokens - (chunks - 1) * case.chunk_size
    base = simulate(_with_chunks(case, BASE_CHUNKS, last))
    step = simulate(_with_chunks(case, BASE_CHUNKS + 1, last)) - base
    return base + (chunks - BASE_CHUNKS) * step


def reserved_plannable(case: Case) -> bool:
    """Whether a reserved search may run at ``case``'s size (its loop is short enough)."""
    return not runs_every_chunk(case) or chunk_count(case) <= RESERVED_MAX_CHUNKS
