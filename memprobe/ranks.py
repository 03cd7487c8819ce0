"""Real multi-rank sweeps under torchrun: one process per rank, rank 0 writes.

``torchrun --nproc-per-node N -m memprobe sweep --tp T --cp C ...`` with
N = T × C. Rank r holds vocabulary shard ``r % T`` and token shard ``r // T``;
the T ranks of one token shard form a tensor-parallel group. Every rank
measures every case; rank 0 gathers the rows and keeps, per case, the
largest rank's figures.

Everything that can fail on bad input is decided from the command line alone,
so every rank reaches the same verdict without a collective and none is left
waiting for a peer that exited.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from memprobe.errors import UserError


@dataclass(frozen=True)
class RankLayout:
    rank: int
    world_size: int
    tp: int
    cp: int
    tp_group: Any
    # A group of this rank alone: lets one rank run a whole-vocabulary check
    # (the numerics verify step) inside a multi-rank job.
    solo_group: Any = None

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def cp_rank(self) -> int:
        return self.rank // self.tp


_layout: RankLayout | None = None


def current_layout() -> RankLayout | None:
    """The rank layout of this process, or None outside a torchrun sweep."""
    return _layout


def under_torchrun() -> bool:
    """torchrun (and torch.distributed.launch) set WORLD_SIZE and RANK for every rank."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def start_ranks(device: str, tp: list[int], cp: list[int]) -> RankLayout:
    """Join the torchrun job and build the tensor-parallel groups."""
    global _layout
    world = int(os.environ["WORLD_SIZE"])
    if len(tp) != 1 or len(cp) != 1:
        raise UserError(
            "under torchrun --tp and --cp take one value each",
            "run one torchrun job per (tp, cp), or simulate lists with --device meta",
        )
    if tp[0] * cp[0] != world:
        raise UserError(
            f"torchrun started {world} ranks but --tp {tp[0]} x --cp {cp[0]} = {tp[0] * cp[0]}",
            f"use --nproc-per-node {tp[0] * cp[0]} or change --tp/--cp",
        )
    if device == "meta":
        raise UserError(
            "--device meta simulates one rank in one process", "run it without torchrun"
        )
    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(local_device_index())
        dist.init_process_group(backend, **init_options(device))
    rank = dist.get_rank()
    groups = [dist.new_group(list(range(c * tp[0], (c + 1) * tp[0]))) for c in range(cp[0])]
    # new_group is collective: every rank makes every singleton, keeps its own.
    solos = [dist.new_group([r]) for r in range(world)]
    _layout = RankLayout(rank, world, tp[0], cp[0], groups[rank // tp[0]], solos[rank])
    return _layout


# How long a collective may wait for its peers before it fails (torch's default is
# 10 min for NCCL, 30 min for gloo): a stuck case ends the job in bounded time.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)


def local_device_index() -> int:
    """This rank's GPU: LOCAL_RANK, wrapped by the devices this node has."""
    return int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count())


def init_options(device: str) -> dict[str, Any]:
    """Keywords for ``init_process_group``: a timeout, and on cuda the rank's device, so
    NCCL binds its communicator to it at once instead of guessing at the first collective."""
    options: dict[str, Any] = {"timeout": COLLECTIVE_TIMEOUT}
    if device == "cuda":
        options["device_id"] = torch.device("cuda", local_device_index())
    return options


def stop_ranks() -> None:
    global _layout
    _layout = None
    if dist.is_initialized():
        dist.destroy_process_group()


def agree(error: str | None) -> str | None:
    """Share rank 0's verdict (an error message or None) with every rank."""
    box = [error]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def share_cases(cases: list[Any]) -> list[Any]:
    """Rank 0's list of cases, on every rank."""
    box = [cases]
    dist.broadcast_object_list(box, src=0)
    return box[0]


_MAX_FIELDS = (
    "peak_bytes",
    "forward_peak_bytes",
    "backward_peak_bytes",
    "reserved_peak_bytes",
    "fwd_time_s",
    "bwd_time_s",
    "max_abs_err_fwd",
    "max_abs_err_bwd",
    "big_fp32_blocks",
)
_STATUS_ORDER = ("error", "oom", "skipped", "ok")


def gather_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """On rank 0: one row for the case, each figure the largest rank's; None elsewhere."""
    rows: list[dict[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    if dist.get_rank() != 0:
        return None
    return merge_rows([r for r in rows if r is not None])


def merge_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    merged = dict(rows[0])
    for key in _MAX_FIELDS:
        values = [r[key] for r in rows if r.get(key) is not None]
        merged[key] = max(values) if values else None
    merged["status"] = min((r["status"] for r in rows), key=_STATUS_ORDER.index)
    notes = dict.fromkeys(
        f"rank {i}: {r['note']}" if r["status"] != "ok" else r["note"]
        for i, r in enumerate(rows)
        if r.get("note")
    )
    merged["note"] = "; ".join(notes)
    return merged
