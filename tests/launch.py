"""How the multi-process tests start their ranks: real torchrun, or ranks forked from a
server that has imported torch and memprobe once."""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.forkserver  # noqa: F401 - see below
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

# --standalone: each launch's rendezvous takes a free port, so two tests launching at
# once (pytest -n) never meet on torchrun's default port 29500.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

# What a rank would import again had it been spawned: torch (and the torch._dynamo its
# first meta op pulls in), transformers, memprobe's commands, and what a model step
# imports at its first call (transformers' model classes, FSDP2, tensor parallel: about a
# second more per rank that builds a model). Seconds of CPU per rank, most of a real-rank
# test's time on two cores. One list: the forkserver starts once per pytest worker, with
# whichever preload is set first.
_PRELOAD = [
    "torch",
    "torch._dynamo",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.llama.modeling_llama",
    "torch.distributed.fsdp",
    "torch.distributed.tensor.parallel",
    "memprobe.cli",
    "memprobe.sharded_sweep",
    "memprobe.profile.step",
    "memprobe.plan.driver",  # and what plan's fresh processes import (memprobe.measure.fresh)
    "memprobe.measure.meta_backend",
    # What a forked command imports as it runs: typer's parameter adapters (pydantic, at
    # the first option it parses: a quarter of a forked command's CPU), and a forked
    # pytest's plugins. Not matplotlib: the tests of MPLBACKEND need it read afresh.
    "typer._adapters",
    "_pytest.config",
    "_pytest.assertion",
    "_pytest.helpconfig",
    "hypothesis",
    "anyio.pytest_plugin",
]


# multiprocessing.forkserver holds the one server of this process. Imported here, as the
# test modules are collected, it is in sys.modules before any pytester test snapshots them:
# imported first inside one, it was dropped at that test's end with its running server, and
# the next test started (and preloaded) a server of its own.


def forkserver() -> str:
    """The start method for ranks forked from the preloaded server (its preload set)."""
    multiprocessing.set_forkserver_preload(_PRELOAD)
    return "forkserver"


def fork_ranks(fn: Callable[..., None], nprocs: int, args: tuple[Any, ...]) -> None:
    """Run ``fn(rank, *args)`` on ``nprocs`` processes forked from a clean server.

    A rank forked from the test process would inherit its fake worlds and process-group
    registry; forked from a forkserver that has imported torch and memprobe once (per
    pytest worker), a rank starts clean and at once.
    """
    import torch.multiprocessing as mp

    mp.start_processes(fn, args=args, nprocs=nprocs, start_method=forkserver())


# torchrun stops the other ranks this long after one fails, then kills them.
_GRACE_S = 5.0


def forked_torchrun(
    argv: Sequence[str],
    *,
    cwd: Path,
    nproc: int = 2,
    script: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    stdout: str = "captured",
    stderr: str = "captured",
    unset: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node NPROC -m memprobe ARGV`` (or ``SCRIPT ARGV``),
    its ranks forked from the preloaded server instead of started afresh.

    Each rank sees the environment torchrun gives it (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT, the agent's store, which this process hosts so that it outlives the
    ranks as torchrun's does). As torchrun does, the job fails when one rank fails: the
    others are sent SIGTERM, then killed. With ``nproc=0``, one process and no torchrun
    environment: a fresh ``python -m memprobe ARGV``. ``stdout`` and ``stderr`` say what the
    process writes into, as a shell would set it up (:data:`STREAMS`); a stream that is not
    ``captured`` comes back empty. Returns the ranks' exit (the first failure's code),
    stdout and stderr, rank by rank. ``unset``: variables of this environment the ranks
    start without.
    """
    import torch.distributed as dist

    store = None
    base = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", *unset):
        base.pop(name, None)
    ranks: list[dict[str, str]] = [base]
    if nproc > 0:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        ranks = [
            {
                **base,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(store.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": "0",
            }
            for rank in range(nproc)
        ]
    context = multiprocessing.get_context(forkserver())
    with tempfile.TemporaryDirectory() as logs:
        streams = [(Path(logs, f"{i}.out"), Path(logs, f"{i}.err")) for i in range(len(ranks))]
        procs = [
            context.Process(
                target=_rank_main, args=(list(argv), script, cwd, e, *s, (stdout, stderr))
            )
            for e, s in zip(ranks, streams, strict=True)
        ]
        for proc in procs:
            proc.start()
        code = _wait_as_torchrun(procs, timeout, argv)
        out = "".join(o.read_text(errors="replace") for o, _ in streams)
        err = "".join(e.read_text(errors="replace") for _, e in streams)
    del store
    return subprocess.CompletedProcess(list(argv), code, out, err)


def forked_pytest(pytester: Any, *args: str, timeout: float = 120) -> Any:
    """``pytest ARGS`` on the pytester's files, as ``pytester.runpytest_subprocess`` runs it
    (a process of its own, so what its tests leave never reaches this one), but forked from
    the preloaded server: without importing torch again, seconds of CPU per run. Returns
    pytest's ``RunResult``."""
    import pytest

    start = time.monotonic()
    done = forked_torchrun(
        [*args, f"--basetemp={pytester.path / 'basetemp'}"],
        cwd=pytester.path,
        nproc=0,
        script=Path(pytest.__file__).parent / "__main__.py",
        timeout=timeout,
        # As on a developer's machine wherever this suite runs: under CI (a CI or
        # BUILD_NUMBER variable) pytest prints each failure's message again in its short
        # summary, and a test counting a message in the output counted it twice.
        unset=("CI", "BUILD_NUMBER"),
    )
    lines = done.stdout.splitlines(), done.stderr.splitlines()
    return pytest.RunResult(done.returncode, *lines, time.monotonic() - start)


def _wait_as_torchrun(procs: list[Any], timeout: float, argv: Sequence[str]) -> int:
    deadline = time.monotonic() + timeout
    failed = 0
    running = list(procs)
    while running and not failed:
        left = deadline - time.monotonic()
        if left <= 0:
            for proc in running:
                proc.kill()
                proc.join()
            raise subprocess.TimeoutExpired(list(argv), timeout)
        wait([p.sentinel for p in running], timeout=left)
        for proc in [p for p in running if p.exitcode is not None]:
            running.remove(proc)
            failed = failed or proc.exitcode
    for proc in running:
        proc.terminate()
    for proc in running:
        proc.join(_GRACE_S)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    return failed


def _closed(fd: int) -> None:
    """As Python starts with the descriptor closed (``>&-``): no sys.stdout/stderr at all."""
    os.close(fd)
    setattr(sys, ("stdout", "stderr")[fd - 1], None)


def _onto(fd: int, target: int) -> None:
    os.dup2(target, fd)
    os.close(target)


def _reader_gone(fd: int) -> None:
    """A pipe whose reader has left (``| true`` once true is done): every write is EPIPE
    (Python ignores SIGPIPE, as the forked child inherits)."""
    read, write = os.pipe()
    os.close(read)
    _onto(fd, write)


# What a forked process's stdout or stderr is, by name.
STREAMS: dict[str, Callable[[int], None]] = {
    "captured": lambda fd: None,
    "closed": _closed,
    "full": lambda fd: _onto(fd, os.open("/dev/full", os.O_WRONLY)),
    "reader gone": _reader_gone,
}


def _rank_main(
    argv: list[str],
    script: Path | None,
    cwd: Path,
    env: dict[str, str],
    out: Path,
    err: Path,
    hows: tuple[str, str],
) -> None:
    """One rank, in the forked child: torchrun's environment, the command, its exit code."""
    import torch

    # What the server's preload made (torch, transformers, FSDP: 380,000 objects) is frozen:
    # each full garbage collection of the rank would scan it again, 0.2-0.3 s every time.
    gc.freeze()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    torch.set_num_threads(1)
    for path, fd in ((out, 1), (err, 2)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    if "PYTHONIOENCODING" in env:  # as Python starts with it set: streams in that encoding
        encoding, _, errors = env["PYTHONIOENCODING"].partition(":")
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(encoding=encoding or None, errors=errors or None)  # type: ignore[union-attr]
    for fd, how in zip((1, 2), hows, strict=True):
        STREAMS[how](fd)
    code = 0
    try:
        if script is not None:
            sys.argv = [str(script), *argv]
            runpy.run_path(str(script), run_name="__main__")
        else:
            from memprobe import cli

            sys.argv = ["memprobe", *argv]
            cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.exit(code)  # as the interpreter ends: it waits for the threads left running
