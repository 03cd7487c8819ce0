"""Tensor parallel of a Hugging Face decoder for the sharded step: DTensor's own
``parallelize_module`` on the tp dimension of the fake (or real) world's device mesh.

The plan is Megatron's, as torchtitan applies it to a Llama: in every decoder layer
the attention's q/k/v projections and the MLP's gate/up projections are
``ColwiseParallel`` (each rank computes ``heads / tp`` heads and ``intermediate / tp``
MLP columns), the o and down projections ``RowwiseParallel`` (their partial outputs
all-reduced back to the replicated hidden states). The lm_head is ``ColwiseParallel``
with its output left sharded on the vocabulary: each rank holds the logits of
``vocab / tp`` ids, which memprobe's vocabulary-parallel log-prob kernels take with
the tp group (:mod:`memprobe.kernels.distributed`).

Not sharded over tp (replicated, as without tp): the token embedding and the norms;
sequence parallel (norms and residuals split over the sequence) is not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from memprobe.errors import UserError

# Decoder-layer submodules and their style: "colwise" splits the output features,
# "rowwise" the input features (Llama, Mistral, Qwen2 and their kin name them so).
LAYER_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


def split_sizes(config: Any) -> dict[str, int]:
    """The sizes tensor parallel splits, whole (each rank holds ``size / tp``); those
    the config does not name are left out (its layers are then refused by name)."""
    heads = getattr(config, "num_attention_heads", None)
    sizes = {
        "attention heads": heads,
        "key/value heads": getattr(config, "num_key_value_heads", None) or heads,
        "intermediate size": getattr(config, "intermediate_size", None),
        "vocabulary ids": getattr(config, "vocab_size", None),
    }
    return {what: int(size) for what, size in sizes.items() if isinstance(size, int)}


def check_tp_sizes(config: Any, tp: int) -> None:
    """One line when ``tp`` does not divide a size it splits: attention heads, key/value
    heads, the MLP's intermediate size, the vocabulary (the kernel's even id ranges)."""
    if tp == 1:
        return
    for what, size in split_sizes(config).items():
        if size % tp:
            raise UserError(
                f"--tp {tp} does not divide the {what} ({size}): each rank would hold a "
                "fraction of one",
                "pick a --tp that divides the heads, key/value heads, intermediate size "
                "and vocabulary",
            )
    if getattr(config, "tie_word_embeddings", False):
        raise UserError(
            "--tp with tied embeddings is not simulated (the lm_head would shard the "
            "vocabulary of the embedding it shares)",
            "use a config with tie_word_embeddings false, or drop --tp",
        )


def parallelize(model: Any, layers: torch.nn.ModuleList, mesh: Any) -> None:
    """``model``'s projections and lm_head sharded over the 1-D ``mesh`` in place (the
    parameters become DTensors; on meta, nothing is allocated)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for layer in layers:
        present = {name for name, _ in layer.named_modules()}
        missing = [name for name in LAYER_PLAN if name not in present]
        if missing:
            raise UserError(
                f"--tp: the decoder layer has no {', '.join(missing)} (a {type(layer).__name__})",
                "--tp is simulated for Llama-like layers (q/k/v/o, gate/up/down projections)",
            )
        parallelize_module(layer, mesh, {name: styles[s]() for name, s in LAYER_PLAN.items()})
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise UserError("--tp: the model has no linear lm_head to shard", "drop --tp")
    # The logits stay sharded on the vocabulary, local: the kernel's [B, S, V / tp].
    parallelize_module(head, mesh, ColwiseParallel(output_layouts=Shard(-1)))


def even_split_bytes(params: Sequence[torch.Tensor]) -> int:
    """The bytes each rank would hold if every parameter were split evenly over the
    ranks it is sharded over (FSDP's and tp's alike), without padding; a replicated
    parameter whole."""
    from fractions import Fraction

    from torch.distributed.tensor import DTensor

    total = Fraction(0)
    for p in params:
        ranks = 1
        if isinstance(p, DTensor):
            # Not is_shard(): FSDP2's dim-0 shard of a tp shard is a _StridedShard.
            for dim, placement in enumerate(p.placements):
                if not placement.is_replicate():
                    ranks *= p.device_mesh.size(dim)
        total += Fraction(p.numel() * p.element_size(), ranks)
    return int(total)
