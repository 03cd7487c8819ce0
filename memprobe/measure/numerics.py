"""Worst-case deviation of a kernel from a float64 reference, at a small CPU shape.

The inputs, the step and the reference are the kernel's input protocol's
(:mod:`memprobe.measure.protocol`); this module picks the shape and compares."""

from __future__ import annotations

from functools import cache

from memprobe.errors import UserError
from memprobe.measure.parallel import RankLayout
from memprobe.measure.protocol import protocol_for
from memprobe.measure.step import failure_text, process_group_for, refuse_answering_subclass

# Small enough to run in milliseconds, odd sizes so chunks do not divide S,
# and a chunk of 7 so every chunked kernel really loops.
VERIFY_SHAPE = (2, 67, 263)
VERIFY_CHUNK = 7
# Standard normal draws times this: logits of a typical spread.
VERIFY_SCALE = 3.0


@cache
def verify(
    kernel: str,
    dtype: str,
    seed: int = 0,
    chunk_size: int | None = VERIFY_CHUNK,
    shape: tuple[int, int, int] = VERIFY_SHAPE,
    *,
    scale: float = VERIFY_SCALE,
    offset: float = 0.0,
    layout: RankLayout | None = None,
) -> tuple[float, float]:
    """(max |forward error|, max |backward error|) against float64, on CPU.

    For the logits protocol, logits are ``randn * scale + offset`` (rounded to ``dtype``): a large
    ``offset`` (every logit near 1e4) or ``scale`` (logits x100) checks that a
    kernel keeps the row max and the log-sum apart instead of subtracting two
    large numbers.
    """
    protocol = protocol_for(kernel)
    case = protocol.verify_case(kernel, dtype, chunk_size, shape)
    inputs = protocol.verify_inputs(case, seed=seed, scale=scale, offset=offset)
    ref_out, ref_grads = protocol.reference(case, inputs)  # before an in-place kernel runs
    with process_group_for(case):  # one rank: the whole vocabulary
        out = protocol.forward(case, whole_vocab=True, layout=layout)(inputs)
        grads = protocol.backward_of(case)(out, inputs)
    for grad in grads:
        refuse_answering_subclass(grad, "the kernel's backward gave its gradient as")
    err_fwd = (out.double() - ref_out).abs().max().item()
    # The worst of the gradients (the hidden family has two: hidden and weight).
    pairs = zip(grads, ref_grads, strict=True)
    err_bwd = max((g.double() - r).abs().max().item() for g, r in pairs)
    return err_fwd, err_bwd


def verify_or_failure(
    kernel: str, dtype: str, *, layout: RankLayout | None = None
) -> tuple[float, float] | str:
    """:func:`verify`'s figures, or why the check failed (the case's note): the kernel
    runs again there, at a shape of its own. One that failed only there (a chunk that must
    divide the tokens, which 67 do not; an exit; a result it cannot give at that shape)
    ended the whole sweep in its traceback, exit 1, after its own case had measured."""
    try:
        return verify(kernel, dtype, layout=layout)
    except UserError:
        raise
    except Exception as exc:
        b, s, v = VERIFY_SHAPE
        return (
            f"numerics check failed: the kernel failed at the CPU check shape ({b} x {s} x {v}, "
            f"chunk {VERIFY_CHUNK}): {failure_text(exc, limit=500, first_line=True)}; its peak "
            "is measured but its values are unchecked"
        )
