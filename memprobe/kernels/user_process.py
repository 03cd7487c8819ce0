"""What user code may do to memprobe's process below Python's objects, and memprobe puts
back (or, where it cannot, says) after each call and import of it
(:func:`memprobe.kernels.user.user_code`): the file descriptors of its standard streams,
faulthandler's timer, the audit hooks the code adds and the garbage collector's settings."""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from memprobe.errors import UserError


class StreamsLost(UserError):
    """User code closed (or replaced) the descriptor memprobe kept its standard output in
    while the code ran: memprobe's answer has nowhere to go. Ends the command, in one
    line, rather than being one case's error: no later case can write it either."""


def _identity(fd: int) -> tuple[int, int] | None:
    """The file ``fd`` is open on (device, inode), None where it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _kept_copy(fd: int) -> tuple[int, tuple[int, int] | None] | None:
    """A copy of ``fd`` to put it back from, and what it is open on (None: ``fd`` closed)."""
    try:
        saved = os.dup(fd)
    except OSError:
        return None
    return saved, _identity(saved)


@contextlib.contextmanager
def stderr_fd_kept() -> Iterator[None]:
    """File descriptor 2 as memprobe had it: a kernel that closed it (``os.close(2)``) or
    pointed it elsewhere (``os.dup2(log, 2)``) took memprobe's standard error with it, and
    the progress and warnings of every case after its own went nowhere."""
    kept = _kept_copy(2)
    if kept is None:  # closed before the code ran: left as it is
        yield
        return
    saved, what = kept
    try:
        yield
    finally:
        if _identity(saved) == what:  # not closed by the code (os.closerange) nor reused
            with contextlib.suppress(OSError):
                os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def stdout_fd_kept(out: TextIO | None) -> Iterator[None]:
    """File descriptor 1 points at standard error while user code runs: what it writes
    below ``sys.stdout`` (``os.write(1, ...)``, a subprocess it starts, a C library's
    printf) went into ``--json``'s object. Where either descriptor is closed, as it is.

    The copy it is put back from is a descriptor too, which the code may close: a kernel
    that ran ``os.closerange(3, 4096)`` (a daemon's habit) left standard output on standard
    error, and the sweep's ``--json`` answer went there, exit 0, nothing on standard output;
    one that then opened a file got that descriptor number, where memprobe would have
    written its answer. Then memprobe says so and stops (:class:`StreamsLost`)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if out is not None:
            out.flush()  # memprobe's own output so far goes where it was meant to
    kept = _kept_copy(1)
    if kept is None:
        yield
        return
    saved, what = kept
    try:
        try:
            os.dup2(2, 1)
        except OSError:
            os.close(saved)
            saved = -1
        yield
    finally:
        if saved >= 0:
            if _identity(saved) != what:
                raise StreamsLost(
                    f"closed memprobe's own file descriptor {saved} (where it kept its "
                    "standard output while the code ran), so memprobe cannot write its answer",
                    "close only the descriptors the code opened itself",
                )
            os.dup2(saved, 1)
            os.close(saved)


@contextlib.contextmanager
def faults_kept() -> Iterator[None]:
    """faulthandler's timer user code set (``faulthandler.dump_traceback_later(1)``, a
    watchdog it forgot to cancel) is cancelled as the code returns: left running, it went
    off in memprobe's own work after the code, a thread dump on standard error, and with
    ``exit=True`` ended the sweep mid-case, exit 1, in a 27-line traceback. memprobe sets
    none of its own, and faulthandler cannot say whether one is set: cancelled always."""
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


# The audit hooks user code adds (``sys.addaudithook``) cannot be taken off again: a
# kernel's module that added one raising for every file opened for writing failed the
# sweep as "cannot write run/run.json: ... (choose another path)", blaming the path.
# While user code runs, sys.addaudithook adds the hook behind a switch: it sees what the
# user code does, and nothing memprobe does after it.
_USER_DEPTH = [0]
_ADD_AUDIT_HOOK = sys.addaudithook


def _add_switched_hook(hook: Callable[[str, tuple[Any, ...]], Any]) -> None:
    def switched(event: str, args: tuple[Any, ...]) -> None:
        if _USER_DEPTH[0]:
            hook(event, args)

    _ADD_AUDIT_HOOK(switched)


@contextlib.contextmanager
def audit_hooks_switched() -> Iterator[None]:
    """Around user code: the audit hooks it adds see only user code."""
    before = sys.addaudithook
    sys.addaudithook = _add_switched_hook
    _USER_DEPTH[0] += 1
    try:
        yield
    finally:
        _USER_DEPTH[0] -= 1
        sys.addaudithook = before


@contextlib.contextmanager
def gc_kept() -> Iterator[None]:
    """The garbage collector's settings as memprobe had them, around user code: its debug
    flags, whether it runs, its thresholds. A kernel's module that set
    ``gc.set_debug(gc.DEBUG_STATS)`` had every collection of memprobe's after it print its
    statistics on standard error (a bad --kernel name's one line came in 30 lines); with
    ``gc.DEBUG_LEAK``, 150,000 lines, and every object collected kept in gc.garbage."""
    debug, enabled, threshold = gc.get_debug(), gc.isenabled(), gc.get_threshold()
    try:
        yield
    finally:
        if gc.get_debug() != debug:
            gc.set_debug(debug)
            if not debug & gc.DEBUG_SAVEALL:
                gc.garbage.clear()  # what the code's DEBUG_SAVEALL kept: memprobe's garbage
        if gc.get_threshold() != threshold:
            gc.set_threshold(*threshold)
        if gc.isenabled() != enabled:
            (gc.enable if enabled else gc.disable)()
