"""Python's process-wide hooks user code may set and leave behind, put back after each
call and import of it (:func:`memprobe.kernels.user.user_code`): the root logger's
handlers and level, the trace and profile functions, and sys.modules. Left in place, they
ran in (or broke) memprobe's own work after the code returned: what they wrote reached
`--json`'s standard output (user code's own output goes to standard error only while it
runs), and a blocked import ended the command in a traceback."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

# What user code left on the root logger (``logging.basicConfig(stream=sys.stdout,
# level=logging.DEBUG)`` as its module is imported): its handlers, and its level (None:
# the code left the level as it found it). Swapped in while user code runs, so its own
# records go where it sent them; swapped out as it returns. Left on, every record of
# what memprobe runs later went through them: matplotlib's DEBUG lines, drawing a sweep's
# report or `profile --html`'s page, went into `--json`'s object on standard output.
_ROOT_LEFT: dict[str, Any] = {"handlers": [], "level": None}


@contextlib.contextmanager
def logging_kept(theirs: bool = True) -> Iterator[None]:
    """The root logger as memprobe had it, around user code (``theirs``: the code is the
    user's, and sees what it left there before). Only the root's: the one that
    ``basicConfig`` and a bare ``logging.debug()`` set up, which every logger's records
    reach; a handler the code adds to a logger of its own is its own."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    if theirs:
        root.handlers.extend(h for h in _ROOT_LEFT["handlers"] if h not in root.handlers)
        if _ROOT_LEFT["level"] is not None:
            root.setLevel(_ROOT_LEFT["level"])
    lent = list(root.handlers), root.level
    try:
        yield
    finally:
        if (list(root.handlers), root.level) != lent:  # the code changed them
            _ROOT_LEFT["handlers"] = [h for h in root.handlers if h not in handlers]
            _ROOT_LEFT["level"] = None if root.level == level else root.level
        root.handlers[:] = handlers
        if root.level != level:
            root.setLevel(level)


@contextlib.contextmanager
def tracing_kept() -> Iterator[None]:
    """Put back the trace and profile functions user code set (``sys.settrace``,
    ``sys.setprofile``, and threading's for the threads started later): left on, the
    code's function ran at every call of memprobe's own code after it, what it printed
    went into `--json`'s object, and one that raised ended the command in a traceback."""
    trace, profile = sys.gettrace(), sys.getprofile()
    threads = _thread_hooks()
    try:
        yield
    finally:
        if sys.gettrace() is not trace:
            sys.settrace(trace)
        if sys.getprofile() is not profile:
            sys.setprofile(profile)
        if _thread_hooks() != threads:
            threading.settrace(threads[0])
            threading.setprofile(threads[1])


def _thread_hooks() -> tuple[Any, Any]:
    # threading.gettrace and getprofile are Python 3.10's; memprobe requires 3.10.
    return threading.gettrace(), threading.getprofile()


# The entries of sys.modules user code removed or replaced, and the import blockers it
# added (``sys.modules["matplotlib"] = None``, the way to make a module unimportable): by
# name, the code's value (_GONE: removed). Swapped in while user code runs; memprobe's
# own are back as it returns. Left in place, what memprobe imports later ended the
# command in "ModuleNotFoundError: import of matplotlib halted; None in sys.modules",
# a traceback after the sweep (its report, `profile --html`).
_MODULES_LEFT: dict[str, Any] = {}
_GONE = object()


@contextlib.contextmanager
def modules_kept(theirs: bool = True) -> Iterator[None]:
    """sys.modules as memprobe had it, around user code (``theirs``: the code is the
    user's, and sees what it left there before). Modules the code imports stay."""
    modules = sys.modules
    own = dict(modules)
    if theirs:
        for name, value in _MODULES_LEFT.items():
            if value is _GONE:
                modules.pop(name, None)
            else:
                modules[name] = value
    try:
        yield
    finally:
        left = {name: modules.get(name, _GONE) for name in own}
        left = {name: value for name, value in left.items() if value is not own[name]}
        left.update((name, None) for name, value in modules.items() if value is None)
        if theirs:
            _MODULES_LEFT.clear()
            _MODULES_LEFT.update(left)
        for name in left:
            if name in own:
                modules[name] = own[name]
            else:  # a blocker the code added
                modules.pop(name, None)
