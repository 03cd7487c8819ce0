"""Every guard around user code, in one list (:func:`guarded`): what
:func:`memprobe.kernels.user.user_code` runs a call of user code under, and
:mod:`memprobe.kernels.user` an import of a user's module. Each guard is in its own module
(user_guards, user_hooks, user_torch, user_process, user_dispatch, user_memprobe), which says
what user code did to memprobe without it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from memprobe.kernels import user_process as process
from memprobe.kernels.user_dispatch import torch_ops_kept
from memprobe.kernels.user_guards import (
    cwd_kept,
    environment_kept,
    nothing_replaced,
    process_kept,
    streams_kept,
    torch_functions_kept,
)
from memprobe.kernels.user_hooks import (
    importers_kept,
    logging_kept,
    modules_kept,
    no_modules_left,
    tracing_kept,
)
from memprobe.kernels.user_memprobe import memprobe_kept
from memprobe.kernels.user_threads import threads_kept
from memprobe.kernels.user_torch import torch_state_kept


@contextlib.contextmanager
def guarded(*, theirs: bool, users: bool = True, importing: bool = False) -> Iterator[None]:
    """Every guard around user code, in one list: a call and an import are guarded alike;
    what a module leaves of torch's state as it is imported is its own
    (:func:`torch_state_kept`), swapped in for its later code."""
    # memprobe's own code where no user code left a replaced torch function or module:
    # those two guards swap in and find nothing, at 0.8 ms a call (4 a simulated case).
    # Not a user kernel's backward (theirs False): skipped, what it blocked
    # (sys.modules["matplotlib"] = None) ended the sweep's report in a traceback.
    own_alone = not users and nothing_replaced() and no_modules_left()
    threads_kept()
    with contextlib.ExitStack() as stack:
        for guard in (
            cwd_kept(),
            streams_kept(),
            torch_state_kept(theirs, importing=importing),
            None if own_alone else torch_functions_kept(theirs),
            process_kept(),
            environment_kept(),
            logging_kept(theirs),
            tracing_kept(),
            None if own_alone else modules_kept(theirs),
            importers_kept(theirs),
            process.faults_kept(),
            process.gc_kept(),
            process.audit_hooks_switched() if users else None,
            torch_ops_kept() if users else None,
            argv_alone() if users else None,
            memprobe_kept(importing) if users else None,  # last: put back before the others record
        ):
            if guard is not None:
                stack.enter_context(guard)
        yield


@contextlib.contextmanager
def argv_alone() -> Iterator[None]:
    """User code sees a command line without arguments, as ``python my_step.py`` gives it.
    memprobe's own (``profile my_step:train_step --top 1``) reached a module's
    ``int(sys.argv[1])`` ("invalid literal for int() with base 10: 'profile'") and its
    argparse ("unrecognized arguments: profile my_step:train_step --top 1"), where the
    script run alone takes its defaults. What the code sets sys.argv to is its own."""
    kept = sys.argv
    sys.argv = kept[:1]
    try:
        yield
    finally:
        sys.argv = kept
