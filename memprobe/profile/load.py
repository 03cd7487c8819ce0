"""A step by import path, ``package.module:function``: the rules of ``--kernel pkg.mod:fn``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memprobe.errors import UserError
from memprobe.kernels.user import UserCodeExit, import_callable

if TYPE_CHECKING:
    import torch

# A step: builds its model and inputs on the device given, runs forward, loss, backward
# and optionally an optimizer step; what it returns is dropped.
Step = Callable[["torch.device"], Any]

STEP_HINT = "a step is fn(device) that builds its model and inputs there, given as pkg.module:fn"


def load_step(path: str) -> Step:
    """Import ``package.module:function`` (the current directory tried as well)."""
    step: Step = import_callable(path, what="step", hint=STEP_HINT)
    try:
        inspect.signature(step).bind(None)
    except TypeError:
        raise UserError(
            f"step {path!r} does not take one argument (the device)", STEP_HINT
        ) from None
    except ValueError:
        pass  # no signature to read (a builtin): let the call tell
    if (
        inspect.isgeneratorfunction(step)
        or inspect.iscoroutinefunction(step)
        or (inspect.isasyncgenfunction(step))
    ):
        # Calling one runs none of its body: the profile would be an empty one.
        raise UserError(
            f"step {path!r} is a generator or async function: calling it runs none of its body",
            STEP_HINT,
        )
    return step


def step_exited(exc: UserCodeExit) -> UserError:
    """The one line for a step that called ``sys.exit()`` or raised another BaseException
    that is not an Exception: uncaught, it would end memprobe with the step's exit code, or
    a traceback, and no word of why."""
    return UserError(str(exc), "a step returns when it is done; remove the exit")
