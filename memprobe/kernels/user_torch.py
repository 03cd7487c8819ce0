"""torch's process-wide state user code may change, kept around each call and import of it
(:func:`memprobe.kernels.user.user_code`) and around a test body the pytest marker measures:
its defaults (gradients, dtype, device), the settings that decide how it computes (threads,
matmul precision, determinism, anomaly detection, autocast, cuDNN), the global hooks every
nn.Module and optimizer runs, and the contexts it keeps on stacks (function and dispatch
modes, saved-tensor hooks).

What a call changes is undone as it returns. What a module sets as it is imported
(``torch.set_default_dtype(torch.float64)``, a mode entered at module level) is the
module's own: swapped in whenever user code runs, so its kernel or step sees what its
module set up, and swapped out for memprobe's own kernels, reference and figures. Left in
place, module-level gradients off failed every case of a sweep, memprobe's own too; a
default dtype of float64 changed memprobe's kernels' peaks and errors (unchunked's 114,944
B read 115,200 B); a default device of meta ended the sweep in a traceback; a function
mode failed every case (NotImplementedError)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from memprobe.kernels.user_dispatch import (
    dispatch_state,
    put_back_dispatch_state,
    python_dispatch_turned_off,
)

_UNSET = object()
Setting = tuple[Callable[[], Any], Callable[[Any], None]]  # how one setting is read, written


@dataclass
class _Left:
    """What user code's modules left of torch's state as they were imported: the settings
    that differ from memprobe's (by name), the modes and hooks they pushed (bottom first),
    and torch's global default-device context (_UNSET: the one memprobe had)."""

    settings: dict[str, Any] = field(default_factory=dict)
    functions: list[Any] = field(default_factory=list)
    dispatches: list[Any] = field(default_factory=list)
    hooks: list[tuple[Any, Any]] = field(default_factory=list)
    device_context: Any = _UNSET


_LEFT = _Left()


def forget_left() -> None:
    """Forget what imported modules left (a test's modules are not the next test's)."""
    global _LEFT
    _LEFT = _Left()


@contextlib.contextmanager
def torch_state_kept(theirs: bool = False, *, importing: bool = False) -> Iterator[None]:
    """torch's process-wide state as memprobe had it, around user code (``theirs``: the
    code is the user's, and runs with what its modules left as they were imported;
    ``importing``: what the code leaves is such a module's own, kept for its later code)."""
    import torch

    settings = _settings()
    own = {name: read() for name, (read, _) in settings.items()}
    stacks = _stacks()
    keys = dispatch_state()
    failed = False
    try:
        if theirs:
            _lend(settings)
        yield
    except BaseException:
        failed = True  # its own failure says more than what it left
        raise
    finally:
        left_keys = dispatch_state()
        popped = _put_back_stacks(stacks)
        if importing:
            _keep_left(settings, own, stacks, popped)
        autocast = _autocast_state()
        for name, (read, write) in settings.items():
            if read() != own[name]:
                write(own[name])
        if autocast != own["autocast"]:
            torch.clear_autocast_cache()  # casts made under the code's autocast are not ours
        if dispatch_state() != keys:  # after the settings: autocast's are keys too
            put_back_dispatch_state(keys)
        if stacks.dispatches and python_dispatch_turned_off(keys, left_keys) and not failed:
            raise ModesRemoved(
                "the code left torch's Python dispatch turned off (a torch._C."
                "_DisableTorchDispatch entered and never left), so memprobe's allocation "
                "tracker saw nothing it did after that: leave every guard it enters"
            )
        if popped.removed and not failed:
            raise ModesRemoved(
                f"the code took off {popped.removed} of the torch dispatch modes it ran under "
                "(memprobe's allocation tracker is one), so what it did after that was not "
                "tracked: pop only a mode the code pushed itself (torch.utils._python_dispatch"
                "._pop_mode)"
            )


def _lend(settings: dict[str, Setting]) -> None:
    """Swap in what the user's modules left as they were imported."""
    import torch
    from torch.utils._python_dispatch import _push_mode

    autograd: Any = torch._C._autograd  # private: not in its stubs
    for pack, unpack in _LEFT.hooks:
        autograd._push_saved_tensors_default_hooks(pack, unpack)
    for mode in _LEFT.dispatches:
        _push_mode(mode)
    for mode in _LEFT.functions:
        torch._C._push_on_torch_function_stack(mode)
    if _LEFT.device_context is not _UNSET:
        _set_device_context(_LEFT.device_context)
    # After the hooks: pushing one fails where the module disabled them.
    for name, value in _LEFT.settings.items():
        if name == _GLOBAL_HOOKS:
            _add_global_hooks(value)  # beside memprobe's own (its step tracker's)
        else:
            settings[name][1](value)


def _keep_left(
    settings: dict[str, Setting], own: dict[str, Any], stacks: _Stacks, popped: _Stacks
) -> None:
    """Keep what an imported module left (``popped``: what it pushed and left, taken off
    the stacks) as the module's own."""
    now = {name: read() for name, (read, _) in settings.items()}
    changed = {name: value for name, value in now.items() if value != own[name]}
    if _GLOBAL_HOOKS in changed:
        changed[_GLOBAL_HOOKS] = now[_GLOBAL_HOOKS].added_to(own[_GLOBAL_HOOKS])
    left = _Left(
        settings=changed,
        functions=[m for m in popped.functions if not any(m is o for o in stacks.functions)],
        dispatches=popped.dispatches,
        hooks=popped.hooks,
    )
    if popped.device_context is not stacks.device_context:
        left.device_context = popped.device_context
    global _LEFT
    _LEFT = left


# -- the settings: by name, how each is read and written ---------------------------------


@functools.cache
def _settings() -> dict[str, Setting]:
    """Each of torch's process-wide settings user code may change, read and written.

    Beyond the defaults: a kernel that set torch.set_num_threads(1) ran every case after
    its own, the reference and the report on one thread; set_float32_matmul_precision
    ("medium") ran memprobe's fp32 matmuls in bf16 (oneDNN on a CPU that has it, TF32 on
    CUDA); use_deterministic_algorithms(True) failed memprobe's CUDA kernels whose
    backward has no deterministic implementation, and with fill_uninitialized_memory
    filled every empty tensor of theirs."""
    import torch
    import torch.utils.deterministic

    def flag(owner: Any, name: str) -> Setting:
        return (lambda: getattr(owner, name), lambda value: setattr(owner, name, value))

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    return {
        "gradients": (torch.is_grad_enabled, _set_gradients),
        "dtype": (torch.get_default_dtype, torch.set_default_dtype),
        # Anomaly detection reads every gradient's values: left on, it failed memprobe's
        # own kernels on meta ("Tensor.item() cannot be called on meta tensors").
        "anomaly": (
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda value: torch.set_anomaly_enabled(*value),
        ),
        "autocast": (_autocast_state, _set_autocast),
        "saved-tensor hooks": (_hooks_disabled, _disable_hooks),
        "threads": (torch.get_num_threads, torch.set_num_threads),
        "matmul precision": (_precision, _set_precision),
        "deterministic": (
            lambda: (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1]),
        ),
        "fill uninitialized": flag(torch.utils.deterministic, "fill_uninitialized_memory"),
        "warn always": (torch.is_warn_always_enabled, torch.set_warn_always),
        "cudnn enabled": flag(cudnn, "enabled"),
        "cudnn benchmark": flag(cudnn, "benchmark"),
        "cudnn deterministic": flag(cudnn, "deterministic"),
        "fp16 reduction": flag(matmul, "allow_fp16_reduced_precision_reduction"),
        "bf16 reduction": flag(matmul, "allow_bf16_reduced_precision_reduction"),
        _GLOBAL_HOOKS: (_global_hooks, _set_global_hooks),
    }


# -- global hooks: every nn.Module's and every optimizer's --------------------------------
# A kernel's module that registered a global hook as it was imported (a module forward
# hook, a parameter registration hook, an optimizer step hook) had it run in the model of
# `memprobe step`, memprobe's own: one that raised failed the step, blamed on config.json's
# sizes ("check the config's sizes"); one that allocated changed the step's peak. A hook is
# the code's own, as a mode it entered is: lent beside memprobe's while its code runs.
_GLOBAL_HOOKS = "global hooks"
_REGISTRIES = (
    (
        "torch.nn.modules.module",
        (
            "_global_backward_pre_hooks",
            "_global_backward_hooks",
            "_global_forward_pre_hooks",
            "_global_forward_hooks",
            "_global_forward_hooks_always_called",
            "_global_forward_hooks_with_kwargs",
            "_global_buffer_registration_hooks",
            "_global_module_registration_hooks",
            "_global_parameter_registration_hooks",
        ),
    ),
    ("torch.optim.optimizer", ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")),
)
_FULL_BACKWARD = "_global_is_full_backward_hook"  # set by a full backward hook's registration


@dataclass(frozen=True, eq=False)
class _Hooks:
    """What each registry held (its (handle id, hook) pairs), and the full-backward flag;
    equal by the hooks' identity (a hook's own ``__eq__`` is user code)."""

    items: tuple[tuple[tuple[Any, Any], ...], ...]
    full_backward: Any

    def _ids(self) -> tuple[Any, ...]:
        pairs = tuple(tuple((key, id(hook)) for key, hook in kept) for kept in self.items)
        return pairs, id(self.full_backward)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Hooks) and self._ids() == other._ids()

    def __hash__(self) -> int:
        return hash(self._ids())

    def added_to(self, own: _Hooks) -> _Hooks:
        """The hooks of these that ``own`` lacks (what an import registered)."""
        added = tuple(
            tuple((key, hook) for key, hook in kept if key not in dict(before))
            for kept, before in zip(self.items, own.items, strict=True)
        )
        return _Hooks(added, self.full_backward)


def _registries() -> list[dict[Any, Any]]:
    import importlib

    found: list[dict[Any, Any]] = []
    for module_name, names in _REGISTRIES:
        module = importlib.import_module(module_name)
        found.extend(getattr(module, name) for name in names if hasattr(module, name))
    return found


def _full_backward_owner() -> Any:
    import torch.nn.modules.module

    return torch.nn.modules.module


def _global_hooks() -> _Hooks:
    items = tuple(tuple(registry.items()) for registry in _registries())
    return _Hooks(items, getattr(_full_backward_owner(), _FULL_BACKWARD, None))


def _set_global_hooks(hooks: _Hooks) -> None:
    for registry, kept in zip(_registries(), hooks.items, strict=True):
        registry.clear()
        registry.update(kept)
    setattr(_full_backward_owner(), _FULL_BACKWARD, hooks.full_backward)


def _add_global_hooks(hooks: _Hooks) -> None:
    for registry, kept in zip(_registries(), hooks.items, strict=True):
        registry.update(kept)
    if hooks.full_backward is not None:
        setattr(_full_backward_owner(), _FULL_BACKWARD, hooks.full_backward)


def _hooks_disabled() -> str | None:
    """Why saved-tensor hooks are disabled (None: they are not)."""
    import torch

    return torch._C._autograd._saved_tensors_hooks_get_disabled_error_message()


def _disable_hooks(message: str | None) -> None:
    import torch

    autograd: Any = torch._C._autograd  # private: not in its stubs
    if message is None:
        autograd._saved_tensors_hooks_enable()
    else:
        autograd._saved_tensors_hooks_disable(message)


def _set_gradients(on: bool) -> None:
    import torch

    torch.set_grad_enabled(on)  # a class: calling it sets the mode (and makes a context)


def _precision_owners() -> list[Any]:
    """Where torch (2.9 and later) keeps each backend's fp32 precision, parents first:
    set_float32_matmul_precision writes some of them, and the old flags (allow_tf32)
    read them."""
    import torch

    b: Any = torch.backends
    owners = [b, b.cuda.matmul, b.cudnn, b.cudnn.conv, b.cudnn.rnn]
    owners += [b.mkldnn, b.mkldnn.matmul, b.mkldnn.conv, b.mkldnn.rnn]
    return [owner for owner in owners if hasattr(owner, "fp32_precision")]


def _precision() -> tuple[str | None, tuple[str, ...]]:
    """The float32 matmul precision (None: unreadable, where torch's old and new settings
    were mixed) and each backend's."""
    import torch

    try:
        legacy: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:
        legacy = None
    return legacy, tuple(owner.fp32_precision for owner in _precision_owners())


def _set_precision(value: tuple[str | None, tuple[str, ...]]) -> None:
    import torch

    legacy, backends = value
    if legacy is not None:
        torch.set_float32_matmul_precision(legacy)
    for owner, precision in zip(_precision_owners(), backends, strict=True):
        if owner.fp32_precision != precision:
            owner.fp32_precision = precision


# Autocast is process-wide too: a context user code entered and never left
# (``torch.autocast("cpu").__enter__()``) ran memprobe's fp32 linear kernels' matmuls in
# bf16 (a larger peak, an error of 0.05 where it is 3e-6, both reported as measured).
_AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_state() -> tuple[tuple[bool, Any], ...]:
    import torch

    return tuple(
        (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES
    )


def _set_autocast(saved: tuple[tuple[bool, Any], ...]) -> None:
    import torch

    for device, (enabled, dtype) in zip(_AUTOCAST_DEVICES, saved, strict=True):
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)


# -- the stacks: modes, hooks and the default device --------------------------------------
# A context user code entered and never left stayed on for every case after its own:
# saved-tensor hooks (a ``save_on_cpu()`` it forgot to close) moved what autograd saves off
# the device (on meta: "Cannot copy out of meta tensor" for every later kernel), a
# function or dispatch mode failed them all, a default device ended a sweep in a traceback.


@dataclass
class _Stacks:
    """The saved-tensor hooks (bottom first: the top alone for memprobe's, None where none
    is pushed), the dispatch modes, the function modes, and torch's global default-device
    context (and the device it last entered); ``removed``: how many of the dispatch modes
    the code ran under it took off (in what :func:`_put_back_stacks` returns)."""

    hooks: list[Any]
    dispatches: list[Any]
    functions: list[Any]
    device_context: Any
    current_device: Any
    removed: int = 0


class ModesRemoved(RuntimeError):
    """User code took off a dispatch mode it did not push (memprobe's allocation tracker
    among those it runs under): put back, but what the code did after was not seen."""


def _stacks() -> _Stacks:
    import torch
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    autograd: Any = torch._C._autograd  # private: not in its stubs
    return _Stacks(
        [autograd._top_saved_tensors_default_hooks(False)],
        _get_current_dispatch_mode_stack(),
        _get_current_function_mode_stack(),
        _device_context(),
        _current_device(),
    )


def _put_back_stacks(saved: _Stacks) -> _Stacks:
    """Put the stacks back as ``saved`` (what user code popped of memprobe's too); returns
    what the code pushed and left (bottom first), taken off, and the default-device context
    it left."""
    import torch
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode, _push_mode

    autograd: Any = torch._C._autograd  # private: not in its stubs
    hooks: list[Any] = []
    # A stack's depth is not readable for hooks: pop until memprobe's top is on top again
    # (bounded: a code that popped it leaves an empty stack, and the loop ends there).
    for _ in range(10_000):
        top = autograd._top_saved_tensors_default_hooks(False)
        if top is None or top == saved.hooks[0]:
            break
        hooks.insert(0, top)
        autograd._pop_saved_tensors_default_hooks()
    # The dispatch modes it ran under, from the first one it took off: a step that popped
    # memprobe's tracker (``_pop_mode()``) failed as memprobe left the tracker, with torch's
    # "trying to pop from empty mode stack" and a hint about meta tensors' values; one that
    # popped it and then allocated passed a marker's limit with a peak of what came before.
    now = _get_current_dispatch_mode_stack()
    kept = 0
    while kept < min(len(now), len(saved.dispatches)) and now[kept] is saved.dispatches[kept]:
        kept += 1
    dispatches: list[Any] = []
    while torch._C._len_torch_dispatch_stack() > kept:
        dispatches.insert(0, _pop_mode())
    for mode in saved.dispatches[kept:]:
        _push_mode(mode)
    dispatches = [m for m in dispatches if not any(m is s for s in saved.dispatches)]
    functions = _get_current_function_mode_stack()
    if len(functions) != len(saved.functions) or any(
        a is not b for a, b in zip(functions, saved.functions, strict=False)
    ):
        # Exactly as it was: torch.set_default_device, and ``torch.device(...)`` entered,
        # replace the device mode at the bottom of the stack, under memprobe's own.
        while torch._C._len_torch_function_stack():
            torch._C._pop_torch_function_stack()
        for mode in saved.functions:
            torch._C._push_on_torch_function_stack(mode)
    left = _Stacks(hooks, dispatches, functions, _device_context(), _current_device())
    left.removed = len(saved.dispatches) - kept
    _set_device_context(saved.device_context)
    _set_current_device(saved.current_device)
    return left


def _device_context() -> Any:
    """The context torch.set_default_device entered (None: none), per thread."""
    import torch

    holder: Any = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    return getattr(holder, "device_context", None)


def _set_device_context(context: Any) -> None:
    import torch

    holder: Any = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if isinstance(holder, threading.local):
        holder.device_context = context


def _current_device() -> Any:
    from torch.utils import _device

    return getattr(_device, "CURRENT_DEVICE", None)


def _set_current_device(device: Any) -> None:
    from torch.utils import _device

    if hasattr(_device, "CURRENT_DEVICE"):
        _device.CURRENT_DEVICE = device
