"""torch's thread-local dispatch state user code may leave behind: the dispatch keys it
includes and excludes, and inference mode. :func:`memprobe.kernels.user_torch.torch_state_kept`
reads it before user code runs and puts it back as the code returns.

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

import functools
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
