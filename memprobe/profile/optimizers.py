"""The optimizer of a simulated training step (`memprobe step`, `plan --step`): AdamW or
SGD with momentum, foreach as on CUDA, holding from the start the state every step after
the first holds."""

from __future__ import annotations

from typing import Any

import torch


def make_optimizer(name: str, params: list[torch.Tensor]) -> torch.optim.Optimizer | None:
    """The optimizer ``--optimizer`` names, over ``params``, holding the state of a step
    after the first (:func:`_steady_state`); None for \"none\"."""
    # foreach=True: torch's default for CUDA parameters (meta and cpu would default to the
    # per-tensor loop, whose temporaries are one parameter's, not all of them at once).
    if name == "none":
        return None
    groups = _param_groups(params)
    optimizer: torch.optim.Optimizer
    if name == "sgd":
        optimizer = torch.optim.SGD(groups, lr=1e-3, momentum=0.9, foreach=True)
    else:
        optimizer = torch.optim.AdamW(groups, lr=1e-3, foreach=True)
    _steady_state(optimizer)
    return optimizer


def _steady_state(optimizer: torch.optim.Optimizer) -> None:
    """The state the optimizer holds from its first step on, made before the step: a
    training loop runs every step after the first with it live through forward and
    backward. Made lazily by that first step, it was absent from both, and the step's
    peak was the first step's: the README's 8B unchunked step "fits" 80 GiB at 75.00 GiB,
    where every later step's backward holds 49.80 + 30.00 GiB of AdamW moments. Made as
    torch's own first step makes it (AdamW's moments ``zeros_like``, its step count a CPU
    scalar; SGD's momentum buffer), so the step then takes the path of every later one."""
    with torch.no_grad():  # as torch's step makes it; with grad on, "forward" began here
        for group in optimizer.param_groups:
            for p in group["params"]:
                _steady_param_state(optimizer, p)


def _steady_param_state(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> None:
    state = optimizer.state[p]
    if isinstance(optimizer, torch.optim.AdamW):
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    elif isinstance(optimizer, torch.optim.SGD):
        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _param_groups(params: list[torch.Tensor]) -> list[dict[str, Any]]:
    """One parameter group, or two when DTensors and plain tensors mix (tensor parallel
    without FSDP leaves the embedding and norms plain): a foreach kernel refuses a
    list that mixes them, so a tensor-parallel training loop groups them apart."""
    dtensor: Any = ()
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        dtensor = DTensor
    groups: dict[bool, list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault(isinstance(p, dtensor), []).append(p)
    return [{"params": group} for group in groups.values()]
