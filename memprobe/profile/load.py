"""A step by import path, ``package.module:function``: the rules of ``--kernel pkg.mod:fn``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memprobe.errors import UserError
from memprobe.kernels.user import UserCodeExit, body_not_run, called_function, import_callable

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
        # A torch.nn.Module's __call__ takes anything: its forward tells (as a kernel's).
        inspect.signature(called_function(step)).bind(None)
    except TypeError:
        raise UserError(
            f"step {path!r} does not take one argument (the device)", STEP_HINT
        ) from None
    except ValueError:
        pass  # no signature to read (a builtin): let the call tell
    kind = body_not_run(step)
    if kind is not None:
        # Calling one runs none of its body: the profile would be an empty one.
        raise UserError(
            f"step {path!r} is a generator or async function: calling it runs none of its body",
            STEP_HINT,
        )
    return step


def check_returned(result: object) -> None:
    """What a step returns is dropped; a generator, coroutine or other awaitable stands for a
    body that has not run (a plain function around an async step, ``return main(device)``):
    the profile would be of nothing. Closed (no "never awaited" warning), then one line."""
    if inspect.isgenerator(result) or inspect.iscoroutine(result):
        kind = "a generator" if inspect.isgenerator(result) else "a coroutine"
        result.close()
    elif inspect.isasyncgen(result):
        kind = "an async generator"
    elif inspect.isawaitable(result):
        kind = "an awaitable"
    else:
        return
    raise UserError(
        f"the step returned {kind} ({type(result).__name__}): none of its body ran",
        "run it to the end inside the step (asyncio.run(...), list(...)) and return nothing",
    )


def step_exited(exc: UserCodeExit) -> UserError:
    """The one line for a step that called ``sys.exit()`` or raised another BaseException
    that is not an Exception: uncaught, it would end memprobe with the step's exit code, or
    a traceback, and no word of why."""
    return UserError(str(exc), "a step returns when it is done; remove the exit")
