"""One size of a kernel that keeps memory between calls, simulated in a process of its own.

plan's search calls a kernel at size after size in one process, where a training loop
calls it at one size, step after step. A kernel that keeps memory between calls (a cache
per shape, a buffer made at its first call and reused) then ran beside what its calls at
other sizes left, or reused it: one keeping a 1 MiB buffer per shape (around
local_chunked, chunk 64, vocabulary 128) fitted 965 tokens in 8 MiB, a buffer of every
size the search had tried counted, where a loop at one size fits 14,051; one that sizes
a buffer by its first call read every later size at the first's. Once a kernel is seen
keeping memory, each later size of it is simulated in a new process, forked from a
server that has imported torch and memprobe but never called it. (A cpu sweep sizes such
a kernel's cases against RAM so too: memprobe.measure.cpu_backend.)

The fork server is the process's one (:mod:`multiprocessing.forkserver`): it starts once,
in a second or two, and each size after that costs a fork and the simulation (0.1 s for
a small one). A plan worker (itself forked, see :mod:`memprobe.plan.driver`) that finds
such a kernel raises :class:`Unclean`, and the planning process simulates the size
afresh.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from memprobe.errors import UserError
from memprobe.measure.traced import owner_of
from memprobe.records import Case

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkServerContext

# What each fresh process would otherwise import again before its first simulation
# (seconds: torch's first meta op alone pulls in torch._dynamo).
_PRELOAD = ["torch", "torch._dynamo", "memprobe.plan.driver", "memprobe.measure.meta_backend"]

_KEEPING: set[str] = set()  # kernels' owners (traced.owner_of) seen keeping memory here
_preloaded = False
_in_plan_worker = False


class Unclean(Exception):
    """A plan worker holds what a kernel kept at other sizes: simulate this size afresh."""


def keeps(kernel: str) -> bool:
    """Whether ``kernel`` (or another kernel of its module) was seen keeping memory here."""
    return owner_of(kernel) in _KEEPING


def saw_keeping(kernel: str) -> None:
    _KEEPING.add(owner_of(kernel))


def in_plan_worker() -> None:
    """The initializer of plan's forked workers: they leave fresh processes to the parent
    (a forked copy shares the parent's fork server, which only the parent may start)."""
    global _in_plan_worker
    _in_plan_worker = True


def available() -> bool:
    return "forkserver" in multiprocessing.get_all_start_methods()


def run(simulate: Callable[[Case, str, str | None], int], case: Case, kind: str,
        alloc_conf: str | None) -> int:  # fmt: skip
    """``simulate(case, kind, alloc_conf)`` in a new process; its UserError comes back whole."""
    if _in_plan_worker:
        raise Unclean
    context = _context()
    receive, send = context.Pipe(duplex=False)
    args = (send, sys.path[:], os.getcwd(), simulate, case, kind, alloc_conf)
    process = context.Process(target=_in_child, args=args, daemon=True)
    process.start()
    send.close()
    try:
        done, value = receive.recv()
    except EOFError:  # it died without a word: a crash, os._exit or sys.exit in the kernel
        raise UserError(
            f"{case.kernel} ended the process that simulated it at "
            f"{case.local_tokens:,} tokens per rank",
            f"run `memprobe sweep --kernel {case.kernel} --device meta --tokens "
            f"{case.tokens} --vocab {case.vocab}` to see it",
        ) from None
    except BaseException:  # Ctrl-C here: the simulation must not outlive the plan
        process.kill()
        raise
    finally:
        receive.close()
        process.join()
    if done is None:  # Ctrl-C reached it first (or the kernel raised KeyboardInterrupt)
        raise KeyboardInterrupt
    if not done:
        raise value
    return int(value)


def _context() -> ForkServerContext:
    global _preloaded
    if not _preloaded:
        # The process has one fork server: add to what another part of it asked it to
        # preload (the multi-rank tests name more) rather than replace it.
        server = multiprocessing.forkserver._forkserver
        asked = list(getattr(server, "_preload_modules", []))
        multiprocessing.set_forkserver_preload(asked + [m for m in _PRELOAD if m not in asked])
        _preloaded = True
    _start_server()
    return multiprocessing.get_context("forkserver")


def _start_server() -> None:
    """Start the fork server deaf to Ctrl-C. It imports torch first (seconds), and only
    then ignores SIGINT itself: a Ctrl-C meanwhile printed its 40-line import traceback
    under the plan's own exit. An ignored signal stays ignored through its exec; each
    process it forks hears Ctrl-C again (:func:`_in_child`)."""
    if threading.current_thread() is not threading.main_thread():
        multiprocessing.forkserver.ensure_running()  # signal.signal works in the main thread only
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, before)


def _in_child(
    send: Connection,
    path: list[str],
    cwd: str,
    simulate: Callable[[Case, str, str | None], int],
    case: Case,
    kind: str,
    alloc_conf: str | None,
) -> None:
    # The server's path and folder are the planning process's when the server started:
    # a kernel imported from the folder plan ran in since then must import here too.
    sys.path[:] = path
    os.chdir(cwd)
    # What the server imported lives for this process's short life: frozen, the garbage
    # collections a kernel that keeps memory is read with (memprobe.measure.traced) scan
    # the simulation's objects only (a full one: 0.26 s of a 0.45 s size).
    gc.freeze()
    # Ctrl-C (or a kernel's KeyboardInterrupt) is the planning process's to act on: said
    # back, not left to multiprocessing, which prints "Process ForkServerProcess-1:" and
    # a traceback. The server ignores SIGINT, and this process inherited that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        send.send((True, simulate(case, kind, alloc_conf)))
    except UserError as exc:
        send.send((False, exc))
    except KeyboardInterrupt:
        try:
            send.send((None, None))
        except OSError:  # the planning process stopped listening: it was interrupted too
            pass
