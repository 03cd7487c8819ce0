"""Whether this process is a torchrun rank, and whether the job's size fits the flags:
decided from the environment and the command line alone, without torch.

``memprobe sweep`` asks before it imports torch, so a job started with the wrong
``--nproc-per-node`` fails on every rank at once, not after each has paid for a torch
import; :func:`memprobe.measure.parallel.start_ranks` asks the same again.
"""

from __future__ import annotations

import os
import socket

from memprobe.errors import UserError
from memprobe.io.text import exception_text

_TORCHRUN_HINT = "launch with torchrun, or unset WORLD_SIZE and RANK to run in one process"


def under_torchrun() -> bool:
    """torchrun (and torch.distributed.launch) set WORLD_SIZE and RANK for every rank.

    With both set, the rest of torchrun's environment must read as torchrun writes it
    (:func:`torchrun_world`): a stray export, or a scheduler's variables of the same
    names, would otherwise end in a traceback deep inside torch.distributed."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return False
    torchrun_world()
    return True


def torchrun_world() -> int:
    """The world size torchrun set, after checking every variable a rank reads: RANK below
    WORLD_SIZE, LOCAL_RANK (when set) a rank number, MASTER_ADDR and MASTER_PORT there."""
    world = env_count("WORLD_SIZE", least=1)
    rank = env_count("RANK", least=0)
    if rank >= world:
        raise UserError(
            f"RANK={rank} in the environment is not below WORLD_SIZE={world}", _TORCHRUN_HINT
        )
    if "LOCAL_RANK" in os.environ:
        env_count("LOCAL_RANK", least=0)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise UserError(
                f"WORLD_SIZE and RANK are set but {name} is not: this is not a torchrun rank",
                _TORCHRUN_HINT,
            )
    port = env_count("MASTER_PORT", least=1)
    if port > 65535:
        raise UserError(f"MASTER_PORT={port} in the environment is not a port", _TORCHRUN_HINT)
    _check_master_addr(os.environ["MASTER_ADDR"], port)
    return world


def _check_master_addr(addr: str, port: int) -> None:
    """A MASTER_ADDR that names no host (a typo, a blank, a host of another network):
    torch's store retried it for its whole timeout, minutes, with a c10d warning on stderr
    every few seconds, rank 0 included. Looked up once here, it is one line at once."""
    try:
        socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # socket.gaierror; idna's "label too long"
        raise UserError(
            f"MASTER_ADDR={addr!r} in the environment names no host this machine can find "
            f"({exception_text(exc)})",
            _TORCHRUN_HINT,
        ) from None


def check_team(device: str, tp: list[int], cp: list[int]) -> None:
    """A torchrun job measures one ``(tp, cp)`` layout on exactly ``tp x cp`` ranks, for
    real: refuse anything else (nothing, outside torchrun)."""
    if not under_torchrun():
        return
    world = torchrun_world()
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


def env_count(name: str, *, least: int) -> int:
    text = os.environ.get(name, "")
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) < least:
        raise UserError(
            f"{name}={text!r} in the environment is not a whole number of at least {least} "
            "(torchrun sets it for each rank)",
            _TORCHRUN_HINT,
        )
    return int(text)
