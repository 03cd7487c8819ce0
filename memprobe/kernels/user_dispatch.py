"""torch's thread-local dispatch state user code may leave behind: the dispatch keys it
includes and excludes, and inference mode (and torch's operators it replaces, below).
:func:`memprobe.kernels.user_torch.torch_state_kept` reads it before user code runs and
puts it back as the code returns.

Each is a guard torch enters and leaves in pairs (``torch._C._DisableTorchDispatch()``,
``torch.inference_mode()``, ``torch._C._AutoDispatchBelowAutograd()``); one user code
entered and kept (``g = ...; g.__enter__()``, never left) stayed on for everything memprobe
ran after it. A kernel's module that kept torch dispatch off as it was imported failed every
case of its sweep, memprobe's own kernels' too ("the kernel's result was allocated where
memprobe cannot see it"), and `profile` said the step "made no tensor on meta"; inference
mode kept on failed memprobe's kernels as "does not require grad" and "Inference tensors
cannot be saved for backward". Not lent back to the code's later calls as the settings of
:mod:`memprobe.kernels.user_torch` are: a guard left entered is a leak, not a setting.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

# (included keys, excluded keys: DispatchKeySet.raw_repr(), inference mode on)
DispatchState = tuple[int, int, bool]

# The inference-mode guards entered to turn it off again, kept for good: leaving one
# would put back the state of its own entry, whatever came since.
_HELD: list[Any] = []


def dispatch_state() -> DispatchState:
    import torch

    c: Any = torch._C  # private: not in its stubs
    return (
        c._dispatch_tls_local_include_set().raw_repr(),
        c._dispatch_tls_local_exclude_set().raw_repr(),
        bool(torch.is_inference_mode_enabled()),
    )


def python_dispatch_turned_off(own: DispatchState, left: DispatchState) -> bool:
    """Whether the code left torch's Python dispatch (every dispatch mode, memprobe's
    allocation tracker among them) turned off where it was on."""
    import torch

    c: Any = torch._C
    python = c.DispatchKey.Python
    excluded = [c.DispatchKeySet.from_raw_repr(state[1]).has(python) for state in (own, left)]
    return excluded == [False, True]


def put_back_dispatch_state(own: DispatchState) -> None:
    """Inference mode and every dispatch key as in ``own``."""
    import torch

    c: Any = torch._C
    if bool(torch.is_inference_mode_enabled()) != own[2]:
        guard = c._InferenceMode(own[2])
        guard.__enter__()  # sets the keys too: put back exactly below
        _HELD.append(guard)
    include, exclude = (c.DispatchKeySet.from_raw_repr(raw) for raw in own[:2])
    for key in _keys():
        if c._dispatch_tls_is_dispatch_key_excluded(key) != exclude.has(key):
            c._dispatch_tls_set_dispatch_key_excluded(key, exclude.has(key))
        if c._dispatch_tls_is_dispatch_key_included(key) != include.has(key):
            c._dispatch_tls_set_dispatch_key_included(key, include.has(key))


@functools.cache
def _keys() -> tuple[Any, ...]:
    import torch

    c: Any = torch._C
    return tuple(c.DispatchKey.__members__.values())


# -- torch's operators: a kernel's module that registered its own implementation of one
# of torch's (``torch.library.Library("aten", "IMPL").impl("_log_softmax", fn, "Meta")``)
# replaced it for every kernel in the process, memprobe's own too: its unchunked row failed
# in the replacement, and one that allocated differently would have changed its peak.
_TORCHS = ("aten", "prims")


class OpsReplaced(RuntimeError):
    """User code replaced an implementation of one of torch's operators (taken off again)."""


@contextlib.contextmanager
def torch_ops_kept() -> Iterator[None]:
    """Refuse, and take off, what user code registered in place of torch's own operators
    (an implementation for an operator and dispatch key torch already had one for; one that
    adds a key torch lacked, a meta kernel for an operator without one, is the code's).
    Seen as the code registers it: torch.library.Library.impl is wrapped while it runs."""
    import torch.library

    library: Any = torch.library.Library
    own = library.impl
    registered: list[tuple[Any, str, str]] = []

    def impl(self: Any, op_name: Any, fn: Any, dispatch_key: str = "", *a: Any, **k: Any) -> Any:
        done = own(self, op_name, fn, dispatch_key, *a, **k)
        name = op_name if isinstance(op_name, str) else getattr(op_name, "_name", "")
        registered.append((self, str(name), dispatch_key or "CompositeImplicitAutograd"))
        return done

    library.impl = impl
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        library.impl = own
        replaced = [(lib, op, key) for lib, op, key in registered if _replaces(lib.ns, op, key)]
        for lib in {id(lib): lib for lib, _, _ in replaced}.values():
            lib._destroy()  # all it registered: torch's own are active again
        if replaced and not failed:
            _, op, key = replaced[0]
            raise OpsReplaced(
                f"the code registered its own {replaced[0][0].ns}::{op.split('::')[-1]} for "
                f"{key} (torch.library), replacing torch's for every kernel here, memprobe's "
                "too: register yours in a namespace of your own (torch.library.custom_op)"
            )


def _replaces(ns: str, op: str, dispatch_key: str) -> bool:
    """Whether ``op`` of namespace ``ns`` now has an implementation for ``dispatch_key``
    in place of one torch had (the dispatcher lists the one replaced as inactive)."""
    import torch

    if ns not in _TORCHS:
        return False
    c: Any = torch._C
    try:
        dump = c._dispatch_dump(op if "::" in op else f"{ns}::{op}")
    except RuntimeError:
        return False
    return any(line.startswith(f"{dispatch_key} (inactive):") for line in dump.splitlines())
