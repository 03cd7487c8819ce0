"""Meta ops answered from what the same op answered before.

On meta, an op computes no data, only its outputs' metadata: shape, strides, dtype and
which inputs it wrote in place. That is a function of the op, its inputs' metadata and
its other arguments, and a chunk loop asks for the same answer once per chunk. Torch
computes it in Python for many ops (``_log_softmax`` runs its decomposition, about 0.7
ms of CPU each, ``clamp`` and ``add`` their reference implementations), so a
simulation spent most of its time re-deriving answers it already had.

:func:`call` runs ``func`` once per distinct key and, for the same key again, makes the
outputs with ``torch.empty_strided`` (what the op would have allocated) or returns the
input it wrote in place. Only the plainest calls are remembered: every tensor a plain
meta tensor (or a Parameter), every other argument a plain value, every output either
fresh storage of exactly ``empty_strided``'s size or an input returned as is, and no
input's metadata or storage changed by the call (``resize_``, ``set_``, ``t_`` are
always run). Views are always run: they share their input's storage and torch tracks
their base.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_SCALARS = frozenset((int, float, bool, type(None)))
_PLAIN_VALUES = (
    str,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    enum.Enum,
)
# Distinct keys kept; a plan at the headline shape makes about a thousand.
_MAX_KEYS = 8192


class _Uncacheable(Exception):
    """An argument or output this module does not reason about: the op just runs."""


# What one call's outputs were: ("new", size, stride, dtype) for fresh storage, ("arg", i)
# for the i-th input tensor returned as is; a tuple or list output, (its type, its items).
_Answer = tuple[Any, ...]
_answers: OrderedDict[tuple[Any, ...], tuple[bool, _Answer]] = OrderedDict()
_enabled = [True]


def _walk(value: Any, tensors: list[torch.Tensor]) -> Any:
    """A hashable stand-in for an argument; its tensors appended to ``tensors``."""
    kind = type(value)
    if kind in _PLAIN_TENSORS:
        if not value.is_meta or value.layout != torch.strided or value.dtype.is_complex:
            raise _Uncacheable  # complex: conjugate and negative views carry a bit
        tensors.append(value)
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype)
    if kind in _SCALARS:
        # The type is part of the key: 1 == 1.0 == True, but add(t, 1) keeps an integer
        # tensor's dtype where add(t, 1.0) promotes it.
        return (kind, value)
    if kind is tuple or kind is list:
        return (kind, *[_walk(item, tensors) for item in value])
    if kind is dict:
        return (kind, *[(k, _walk(value[k], tensors)) for k in sorted(value)])
    if isinstance(value, _PLAIN_VALUES):
        return (kind, value)
    raise _Uncacheable  # a tensor subclass, a SymInt, a storage, a generator


def _state(tensors: list[torch.Tensor]) -> list[tuple[Any, ...]]:
    """What an op may change on its inputs: metadata and the storage behind them."""
    return [
        (
            tuple(t.shape),
            t.stride(),
            t.storage_offset(),
            t.dtype,
            t.untyped_storage()._cdata,
            t.untyped_storage().nbytes(),
        )
        for t in tensors
    ]


def _fresh_bytes(tensor: torch.Tensor) -> int:
    """The storage ``empty_strided`` gives a tensor of this size and stride."""
    if tensor.numel() == 0:
        return 0
    span = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    return span * tensor.element_size()


def _describe(out: Any, tensors: list[torch.Tensor], seen: set[int]) -> _Answer:
    if isinstance(out, (tuple, list)) and not isinstance(out, torch.Tensor):
        return (type(out), tuple(_describe(item, tensors, seen) for item in out))
    if type(out) not in _PLAIN_TENSORS:
        raise _Uncacheable  # None, a scalar, a subclass
    for i, tensor in enumerate(tensors):
        if out is tensor:
            return ("arg", i)
    storage = out.untyped_storage()
    if (
        out.device.type != "meta"
        or out.layout != torch.strided
        or out.is_conj()
        or out.is_neg()
        or out.storage_offset() != 0
        or any(not isinstance(n, int) for n in out.shape)
        or storage.nbytes() != _fresh_bytes(out)
        or storage._cdata in seen
        or any(storage._cdata == t.untyped_storage()._cdata for t in tensors)
    ):
        raise _Uncacheable  # a view, a shared or oversized buffer, a symbolic shape
    seen.add(storage._cdata)
    return ("new", tuple(out.shape), out.stride(), out.dtype)


def _make(answer: _Answer, tensors: list[torch.Tensor]) -> Any:
    kind = answer[0]
    if kind == "arg":
        return tensors[answer[1]]
    if kind == "new":
        _, size, stride, dtype = answer
        return torch.empty_strided(size, stride, dtype=dtype, device="meta")
    return kind(tuple(_make(item, tensors) for item in answer[1]))


def call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)``, or the same outputs made from a remembered answer."""
    # Only where nothing else sees the op below memprobe: a mode of the user's under the
    # tracker would miss the ops answered here.
    # A view shares its input's storage and torch tracks its base: always run.
    if not _enabled[0] or torch._C._len_torch_dispatch_stack() or getattr(func, "is_view", True):
        return func(*args, **kwargs)
    tensors: list[torch.Tensor] = []
    try:
        key = (func, torch.get_default_dtype(), _walk(args, tensors), _walk(kwargs, tensors))
    except _Uncacheable:
        return func(*args, **kwargs)
    known = _answers.get(key)
    if known is not None:
        _answers.move_to_end(key)
        cacheable, answer = known
        if cacheable:
            return _make(answer, tensors)
        return func(*args, **kwargs)
    before = _state(tensors)
    out = func(*args, **kwargs)
    try:
        if _state(tensors) != before:
            raise _Uncacheable
        entry = (True, _describe(out, tensors, set()))
    except _Uncacheable:
        entry = (False, ())
    _answers[key] = entry
    if len(_answers) > _MAX_KEYS:
        _answers.popitem(last=False)
    return out


class uncached:
    """Within: every op runs (a check that remembered answers change nothing)."""

    def __enter__(self) -> None:
        self._was = _enabled[0]
        _enabled[0] = False

    def __exit__(self, *exc: object) -> None:
        _enabled[0] = self._was


def remembered() -> Iterator[tuple[Any, bool]]:
    """The remembered keys' ops and whether each is answered without running."""
    for key, (cacheable, _) in _answers.items():
        yield key[0], cacheable
