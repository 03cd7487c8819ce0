"""The named kernels memprobe measures. Names are part of the CLI and CI contract."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from memprobe.kernels.autograd_reference import (
    naive_chunked_logprobs,
    precast_chunked_logprobs,
    unchunked_logprobs,
)
from memprobe.kernels.distributed import (
    chunked_distributed_collectives,
    chunked_distributed_logprobs,
    distributed_collectives,
    distributed_logprobs,
)
from memprobe.kernels.filtered import filtered_logprobs
from memprobe.kernels.filtered_chunked import filtered_chunked_logprobs
from memprobe.kernels.fused_linear import fused_linear_chunked_logprobs
from memprobe.kernels.linear_unfused import (
    linear_local_chunked_logprobs,
    linear_unchunked_logprobs,
)
from memprobe.kernels.local_chunked import (
    local_chunked_inplace_logprobs,
    local_chunked_logprobs,
)
from memprobe.kernels.local_tiled import local_tiled_inplace_logprobs, local_tiled_logprobs
from memprobe.kernels.peers import PEERS, unavailable_reason
from memprobe.kernels.spec import HiddenLogprobKernel, KernelSpec, LogprobKernel
from memprobe.kernels.torch_linear_ce import (
    torch_linear_ce_accurate_logprobs,
    torch_linear_ce_logprobs,
)

KERNELS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (
        KernelSpec(
            "unchunked",
            unchunked_logprobs,
            "log_softmax(logits.float()) + gather under autograd: the reference",
            casts_per_chunk=False,
            uses_chunk_size=False,
        ),
        KernelSpec(
            "naive_chunked",
            naive_chunked_logprobs,
            "per-chunk cast + log_softmax + gather under plain autograd: bounds nothing",
            casts_per_chunk=True,
        ),
        KernelSpec(
            "precast_chunked",
            precast_chunked_logprobs,
            "whole tensor cast to float32 first, then the naive chunk loop (old dispatcher rule)",
            casts_per_chunk=False,
        ),
        KernelSpec(
            "local_chunked",
            local_chunked_logprobs,
            "LocalChunkedLogprob: saves only inputs, recomputes per chunk, grad in logits dtype",
            casts_per_chunk=True,
        ),
        KernelSpec(
            "local_chunked_inplace",
            local_chunked_inplace_logprobs,
            "as local_chunked, but backward writes the gradient into the logits (consumes them)",
            casts_per_chunk=True,
            consumes_logits=True,
        ),
        KernelSpec(
            "local_tiled",
            local_tiled_logprobs,
            "tiled over tokens and vocabulary, online logsumexp: one float32 [B,c,t] tile",
            casts_per_chunk=True,
        ),
        KernelSpec(
            "local_tiled_inplace",
            local_tiled_inplace_logprobs,
            "as local_tiled, but backward writes the gradient into the logits (consumes them)",
            casts_per_chunk=True,
            consumes_logits=True,
        ),
        KernelSpec(
            "filtered",
            filtered_logprobs,
            "top-k / top-p filtering, then log_softmax + gather under plain autograd",
            casts_per_chunk=False,
            uses_chunk_size=False,
            filters=True,
        ),
        KernelSpec(
            "filtered_chunked",
            filtered_chunked_logprobs,
            "FilteredChunkedLogprob: filtered's top-k / top-p in local_chunked's memory",
            casts_per_chunk=True,
            filters=True,
        ),
        KernelSpec(
            "distributed",
            distributed_logprobs,
            "DistributedLogprob: vocab-parallel, whole shard in float32, softmax saved",
            casts_per_chunk=False,
            uses_chunk_size=False,
            distributed=True,
            collectives=distributed_collectives,
        ),
        KernelSpec(
            "chunked_distributed",
            chunked_distributed_logprobs,
            "ChunkedDistributedLogprob: vocab-parallel, recomputes per chunk, 2 all_reduces",
            casts_per_chunk=True,
            distributed=True,
            collectives=chunked_distributed_collectives,
        ),
        KernelSpec(
            "linear_unchunked",
            linear_unchunked_logprobs,
            "hidden @ weight.T, then unchunked: the logits and their float32 copies",
            casts_per_chunk=True,
            inputs="hidden",
            uses_chunk_size=False,
        ),
        KernelSpec(
            "linear_local_chunked",
            linear_local_chunked_logprobs,
            "hidden @ weight.T to logits in the hidden dtype, then local_chunked",
            casts_per_chunk=True,
            inputs="hidden",
        ),
        KernelSpec(
            "torch_linear_ce",
            torch_linear_ce_logprobs,
            "torch's chunked F.linear_cross_entropy, acc_policy='compact'",
            casts_per_chunk=True,
            inputs="hidden",
        ),
        KernelSpec(
            "torch_linear_ce_accurate",
            torch_linear_ce_accurate_logprobs,
            "torch's chunked F.linear_cross_entropy, acc_policy='accurate' ([V,H] scratch)",
            casts_per_chunk=True,
            inputs="hidden",
        ),
        KernelSpec(
            "fused_linear_chunked",
            fused_linear_chunked_logprobs,
            "fused lm_head + logprob: float32 forward, recompute centered on the max, no logits",
            casts_per_chunk=True,
            inputs="hidden",
        ),
    )
}


def kernel_names(
    *, distributed: bool | None = None, inputs: str | None = "logits", peers: bool = False
) -> list[str]:
    """Registered names, optionally only the (non-)distributed ones.

    ``inputs`` picks one input protocol, ``"logits"`` by default (the kernels a
    logits sweep runs), ``"hidden"`` for the hidden family, None for all. With
    ``peers`` the GPU peers (:mod:`memprobe.kernels.peers`) that can run here come
    too (a CUDA sweep's default; never a meta simulation's, which cannot run them).
    """
    runnable = {n: s for n, s in PEERS.items() if peers and unavailable_reason(n) is None}
    return [
        n
        for n, s in {**KERNELS, **runnable}.items()
        if (distributed is None or s.distributed == distributed)
        and (inputs is None or s.inputs == inputs)
    ]


def get_spec(name: str) -> KernelSpec:
    """The registered kernel ``name``, or a user kernel given as ``package.module:function``.

    An import path resolves through :func:`memprobe.kernels.user.resolve_user_kernel`
    (which raises ``memprobe.errors.UserError`` when it cannot); an unknown
    plain name, or one that is not a string, raises ``ValueError``.
    """
    if not isinstance(name, str):
        raise ValueError(f"a kernel is named by a string (`memprobe kernels`), got {name!r}")
    if ":" in name:
        from memprobe.kernels.user import resolve_user_kernel

        return resolve_user_kernel(name)
    try:
        return KERNELS[name] if name in KERNELS else PEERS[name]
    except KeyError:
        close = difflib.get_close_matches(name, [*KERNELS, *PEERS], n=1)
        if close:
            guess = f" (did you mean {close[0]!r}?)"
        else:
            # A dot where the colon goes (`mine.k`): the user's own kernel, misspelled.
            from memprobe.kernels.user import meant_import_path

            meant = meant_import_path(name)
            guess = f" (did you mean {meant[1]!r}?)" if meant else ""
        known = ", ".join([*KERNELS, *PEERS])
        raise ValueError(
            f"unknown kernel {name!r}{guess}; known kernels: {known} "
            "(or your own as package.module:function)"
        ) from None


def check_inputs_match(kernels: Sequence[str], hidden: int | None) -> None:
    """One line (``UserError``) when a kernel's input protocol does not match ``--hidden``:
    the hidden family needs a hidden size, a logits kernel must not get one (it would be
    compared with the hidden family's reference, whose inputs and floor differ)."""
    from memprobe.errors import UserError

    def subject(names: list[str]) -> str:
        return f"{', '.join(names)} {'takes' if len(names) == 1 else 'take'}"

    wrong = [k for k in kernels if (get_spec(k).inputs == "hidden") != (hidden is not None)]
    if not wrong:
        return
    if hidden is None:
        raise UserError(
            f"{subject(wrong)} hidden states and the lm_head weight, not logits",
            "give the hidden size with --hidden, e.g. --hidden 4096",
        )
    raise UserError(
        f"{subject(wrong)} logits, not hidden states: --hidden is for the hidden family",
        "drop --hidden for logits kernels, or name hidden-family kernels: "
        "`memprobe kernels` lists both",
    )


def get_kernel(name: str) -> LogprobKernel | HiddenLogprobKernel:
    """The callable: ``fn(logits, targets, *, chunk_size=None) -> Tensor[B, S]``, or
    ``fn(hidden, weight, targets, *, chunk_size=None)`` for a hidden-family kernel."""
    return get_spec(name).fn
