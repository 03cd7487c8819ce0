"""What a thread user code started may do to memprobe's process as memprobe goes on, after
the code returned: its os._exit ends that thread alone, and it may not change the process's
current directory (:func:`threads_kept`, from the first guarded call on)."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
import weakref
from typing import Any

# os._exit and os.chdir as Python has them (memprobe's own main thread calls these).
OS_EXIT = os._exit
_OS_CHDIR, _OS_FCHDIR = os.chdir, os.fchdir

# The threads user code started. One that called os._exit later, as memprobe went on (a
# watchdog, a worker's "done"), ended the process there: a sweep stopped after 4 of its 15
# cases with exit status 0, no table and no word, read by CI as a success. There it ends
# the thread alone, said on standard error; os._exit anywhere else is the real one.
USERS_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def threads_kept() -> None:
    """Make os._exit end a thread user code started alone, and os.chdir refused there, from
    now on (before the guards record the standard library's functions: they are memprobe's
    own from then on)."""
    if os._exit is OS_EXIT:
        os._exit = exit_unless_users_thread  # type: ignore[assignment]
    if os.chdir is _OS_CHDIR:
        os.chdir = _chdir_unless_users_thread
    if os.fchdir is _OS_FCHDIR:
        os.fchdir = _fchdir_unless_users_thread


# os.chdir in such a thread, as memprobe went on, moved memprobe with it: cwd_kept puts back
# only what the code's own call moved, and a thread's later chdir split a sweep's run in two
# (run.json in run/, its results and snapshots in elsewhere/run), then ended it in "run is not
# a memprobe run". The directory is the process's, shared by every thread: refused there.
def _chdir_unless_users_thread(path: Any) -> None:
    _refused_in_users_thread(path)
    _OS_CHDIR(path)


def _fchdir_unless_users_thread(fd: Any) -> None:
    _refused_in_users_thread(fd)
    _OS_FCHDIR(fd)


def _refused_in_users_thread(where: Any) -> None:
    if threading.current_thread() in USERS_THREADS:
        raise PermissionError(
            errno.EPERM,
            "memprobe: a thread user code started may not change the process's current "
            "directory (memprobe writes its outputs relative to it)",
            str(where),
        )


def exit_unless_users_thread(status: int = 0, *_: Any) -> None:
    if threading.current_thread() not in USERS_THREADS:
        OS_EXIT(status)
    with contextlib.suppress(Exception):
        sys.stderr.write(
            f"memprobe: warning: a thread user code started called os._exit({status!r}); "
            "it ended that thread alone (memprobe's exit status is its own)\n"
        )
    raise SystemExit(status)
