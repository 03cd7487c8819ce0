"""The sharded step's flags, shared by ``memprobe step`` and ``plan --step``: FSDP2, context
and tensor parallel over a fake world of ranks (:mod:`memprobe.profile.sharded`,
:mod:`memprobe.profile.tensor_parallel`)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from memprobe.commands.flags import MAX_COUNT

FsdpOption = Annotated[
    int,
    typer.Option(
        min=1,
        max=MAX_COUNT,
        help="FSDP2 (fully_shard per layer and the root) over N ranks, simulated as rank 0 "
        "of a fake world: per-rank peaks.",
    ),
]
CpOption = Annotated[
    int,
    typer.Option(
        min=1,
        max=MAX_COUNT,
        help="Context parallel over N ranks: --tokens per rank of a sequence N times as "
        "long; K/V all-gathered for attention. FSDP shards over fsdp x cp ranks.",
    ),
]
TpOption = Annotated[
    int,
    typer.Option(
        min=1,
        max=MAX_COUNT,
        help="Tensor parallel over N ranks (DTensor): q/k/v/gate/up colwise, o/down "
        "rowwise (heads / N per rank), the lm_head vocabulary-parallel into the "
        "chunked_distributed kernel. With --fsdp: a (fsdp x cp, tp) mesh.",
    ),
]
ReshardOption = Annotated[
    str,
    typer.Option(help="true: FSDP2 frees a unit's gathered parameters after its forward."),
]
MpParamOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        help="FSDP2's param_dtype (what units compute in); the shards are then fp32 unless "
        "--param-dtype says otherwise."
    ),
]
# plan --step has no --param-dtype: its help must not point at step's flag.
PlanMpParamOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="FSDP2's param_dtype (what units compute in); the shards are then fp32."),
]
MpReduceOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="FSDP2's reduce_dtype: the reduce-scatter's dtype, e.g. fp32."),
]
MpOutputOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="FSDP2's output_dtype: fp32 stores every unit's output in float32; none."),
]


def sharded_flags(
    *,
    fsdp: int,
    cp: int,
    tp: int,
    reshard_after_forward: str,
    mp_param: str | None,
    mp_reduce: str | None,
    mp_output: str | None,
) -> dict[str, Any]:
    """The keyword arguments of :func:`memprobe.commands.step.build_step` the flags give."""
    from memprobe.profile.sharded import sharding_from_flags

    sharding = sharding_from_flags(
        fsdp=fsdp,
        cp=cp,
        tp=tp,
        reshard_after_forward=reshard_after_forward,
        mp_reduce=mp_reduce,
        mp_output=mp_output,
    )
    return {"sharding": sharding, "mp_param": mp_param}
