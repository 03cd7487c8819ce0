"""Worst-case deviation of a kernel from a float64 reference, at a small CPU shape.

The inputs, the step and the reference are the kernel's input protocol's
(:mod:`memprobe.measure.protocol`); this module picks the shape and compares."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

from memprobe.errors import UserError
from memprobe.measure.parallel import RankLayout
from memprobe.measure.protocol import protocol_for
from memprobe.measure.step import (
    failure_text,
    plain_tensor,
    process_group_for,
    refuse_answering_subclass,
)
from memprobe.records import Run

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
    grads = tuple(plain_tensor(grad) for grad in grads)
    err_fwd = (out.double() - ref_out).abs().max().item()
    # The worst of the gradients (the hidden family has two: hidden and weight).
    pairs = zip(grads, ref_grads, strict=True)
    err_bwd = max((g.double() - r).abs().max().item() for g, r in pairs)
    return err_fwd, err_bwd


def checked_run(run: Run, *, layout: RankLayout | None = None) -> Run:
    """``run`` with its errors against float64 (:func:`verify`), or an error row saying
    why the check failed: the kernel runs again there, at a shape of its own. One that
    failed only there (a chunk that must divide the tokens, which 67 do not; an exit; a
    result it cannot give at that shape) ended the whole sweep in its traceback, exit 1,
    after its own case had measured."""
    case = run.case
    try:
        err_fwd, err_bwd = verify(case.kernel, case.dtype, layout=layout)
    except UserError:
        raise
    except Exception as exc:
        b, s, v = VERIFY_SHAPE
        return replace(
            run,
            status="error",
            note=f"numerics check failed: the kernel failed at the CPU check shape ({b} x {s} "
            f"x {v}, chunk {VERIFY_CHUNK}): {failure_text(exc, limit=500, first_line=True)}; "
            "its peak is measured but its values are unchecked",
        )
    run = replace(run, max_abs_err_fwd=err_fwd, max_abs_err_bwd=err_bwd)
    if math.isfinite(err_fwd) and math.isfinite(err_bwd):
        return run
    # NaN or inf is stored as "no value": left as it is, the row would read as a kernel
    # that was never checked, not one whose values are wrong.
    wrong = [f"{what} {err:g}" for what, err in (("forward", err_fwd), ("backward", err_bwd))]
    return replace(
        run,
        status="error",
        note="numerics check failed: the kernel's output or gradient is not finite against "
        f"float64 at the CPU check shape (max |err| {', '.join(wrong)}); its peak is measured "
        "but its values are wrong",
    )
