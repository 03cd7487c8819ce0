"""Meta ops answered from memory: repeated ops skip torch's meta kernels.

On meta an op computes nothing but its outputs' metadata, and many of torch's meta
kernels are Python (``torch._refs``, ``torch._meta_registrations``): a whole training
step of an 8B model spends most of its simulation there. Yet a transformer runs the
same ops on the same shapes in every layer, and a chunked kernel in every chunk, so the
answer to an op is already known from the first layer or chunk (``_log_softmax``'s
meta kernel alone is 0.7 ms of CPU). :class:`MetaMemo` remembers, per op and exact input
metadata, what the op returned, and afterwards makes fresh tensors of that metadata
instead of running the kernel again.

Only ops where that is exactly what the kernel would do are remembered:

- the op is torch's own (``aten``, ``prims``): another namespace's meta kernel is user
  code, which may answer from more than its arguments;
- the op's first run left every tensor input as it was: same shape, strides, storage
  offset, dtype and storage of the same size (``resize_``, ``t_``, ``set_``, an ``out=``
  that is resized always run again);
- each tensor it returned was either one of its tensor inputs, the same object (an
  in-place op returns the tensor it wrote into: answered with the input at that
  position), or a plain, dense-from-zero meta tensor of its own storage: storage offset
  0 and the storage exactly as large as its shape and strides need, so
  ``torch.empty_strided`` with the same shape, strides and dtype makes the same
  allocation (same bytes, same shape, same dtype, a new storage); a view (a new tensor
  on an input's storage) is never remembered;
- every tensor input is on meta, and the key holds its shape, strides, storage offset,
  dtype, layout and conjugate/negative bits,
  and every other argument by type and value (``1`` and ``1.0`` and ``True`` promote
  differently), and the default dtype (a factory op without a dtype uses it); an argument
  of any other type is never remembered.

A meta op writes no values, so an in-place op answered from memory skips nothing but
its meta kernel: the version counter it bumps is bumped above the dispatch mode that
calls the memo, whether or not the kernel runs.

Anything else runs the real kernel. Meta tensors hold no values, so a meta kernel's
answer depends on nothing else; the tests compare a remembered trace with a plain one
event by event.

For the same reason one memory serves every trace in the process (:func:`trace_memo`): a
plan's search and a sweep's cases ask the same ops again from trace to trace (a chunk
loop's chunk at every token count, each weight's update at every count), 10-20% of their
CPU, and a program that calls memprobe's library again (a notebook, a test suite) asks
them again from call to call. It holds at most ``MetaMemo.LIMIT`` answers, then starts
afresh: a few hundred bytes each, and a whole 8B step asks a few thousand.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from memprobe.measure.tracker import tensors_in

# A remembered answer: the output's tree and, per leaf, ("t", shape, stride, dtype) for a
# tensor to make afresh, ("a", i) for the op's i-th tensor input (what an in-place op
# returns), or ("v", value) for a value to return as it was.
_Recipe = tuple[Any, tuple[tuple[Any, ...], ...]]
_NOT_REMEMBERED = object()
_SCALARS = (
    bool,
    int,
    float,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


class _Unkeyable(Exception):
    pass


def _arg_key(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        if (
            type(arg) is not torch.Tensor
            or arg.layout != torch.strided
            or arg.device.type != "meta"
        ):
            raise _Unkeyable
        return (
            "T",
            tuple(arg.shape),
            arg.stride(),
            arg.storage_offset(),
            arg.dtype,
            arg.device,
            arg.is_conj(),
            arg.is_neg(),
        )
    if isinstance(arg, (list, tuple)):
        return (type(arg).__name__, tuple(_arg_key(a) for a in arg))
    if isinstance(arg, dict):
        return ("dict", tuple(sorted((k, _arg_key(v)) for k, v in arg.items())))
    if isinstance(arg, _SCALARS):
        if isinstance(arg, float) and math.isnan(arg):
            raise _Unkeyable  # nan != nan: never found again
        return (type(arg).__name__, arg)
    raise _Unkeyable


def _dense_nbytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return span * t.element_size()


def _state(t: torch.Tensor) -> tuple[Any, ...]:
    """What an op that changes a tensor's metadata or storage changes."""
    storage = t.untyped_storage()
    return (
        tuple(t.shape),
        t.stride(),
        t.storage_offset(),
        t.dtype,
        storage._cdata,
        storage.nbytes(),
    )


def _recipe(out: Any, inputs: list[torch.Tensor]) -> _Recipe | None:
    """How to make ``out`` again, or None when fresh tensors (or the inputs at the same
    positions) would not be the same."""
    leaves, spec = tree_flatten(out)
    made: list[tuple[Any, ...]] = []
    storages = {t.untyped_storage()._cdata for t in inputs}
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            same = [i for i, t in enumerate(inputs) if t is leaf]
            if same:
                if len(same) > 1:
                    return None  # one tensor given twice: which position it stands for is unknown
                made.append(("a", same[0]))
                continue
            if (
                type(leaf) is not torch.Tensor
                or leaf.device.type != "meta"
                or leaf.layout != torch.strided
                or leaf.is_conj()
                or leaf.is_neg()
                or leaf.storage_offset() != 0
            ):
                return None
            storage = leaf.untyped_storage()
            key = storage._cdata
            if key in storages or storage.nbytes() != _dense_nbytes(leaf):
                return None
            storages.add(key)
            made.append(("t", tuple(leaf.shape), leaf.stride(), leaf.dtype))
        elif isinstance(leaf, (bool, int, float, type(None))):
            made.append(("v", leaf))
        else:
            return None
    return spec, tuple(made)


def _make(recipe: _Recipe, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    spec, made = recipe
    inputs: list[torch.Tensor] | None = None
    leaves = []
    for m in made:
        if m[0] == "t":
            leaves.append(torch.empty_strided(m[1], m[2], dtype=m[3], device="meta"))
        elif m[0] == "a":
            if inputs is None:
                inputs = list(tensors_in((args, kwargs)))
            leaves.append(inputs[m[1]])
        else:
            leaves.append(m[1])
    return tree_unflatten(leaves, spec)


# The namespaces of torch's own ops, whose meta kernels compute from their arguments alone.
# Any other namespace's op is user code (a torch.library op with a fake impl of its own)
# that may read anything: a kernel's op whose workspace came from a global the kernel set
# per chunk size was answered with the first case's size, its 1.08 MiB peak at chunk 256
# read as chunk 16's 144 KiB.
_TORCH_OWN = frozenset({"aten", "prims"})


def _may_remember(func: Any) -> bool:
    """One of torch's own ops that returns no view: what it returns is fresh or an input
    it wrote."""
    schema = getattr(func, "_schema", None)
    return (
        schema is not None
        and getattr(func, "namespace", None) in _TORCH_OWN
        and all(r.alias_info is None or r.alias_info.is_write for r in schema.returns)
    )


class MetaMemo:
    """Remembered meta ops (see the module notes). :meth:`call` runs ``func`` or makes
    its outputs afresh; ``hits`` counts the ops answered from memory."""

    LIMIT = 1 << 16  # answers held; the next one starts the memory afresh

    def __init__(self) -> None:
        self._answers: dict[Any, Any] = {}
        self._rememberable: dict[Any, bool] = {}
        self.hits = 0

    def call(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if torch._C._len_torch_dispatch_stack():
            # A dispatch mode below the caller's (a user's) would miss an op answered here.
            return func(*args, **kwargs)
        rememberable = self._rememberable.get(func)
        if rememberable is None:
            rememberable = self._rememberable[func] = _may_remember(func)
        if not rememberable:
            return func(*args, **kwargs)
        try:
            # The default dtype decides a factory op's dtype when none is given, and
            # model building changes it for a while (transformers' ``dtype=``).
            key = (func, torch.get_default_dtype(), _arg_key(args), _arg_key(kwargs))
        except _Unkeyable:
            return func(*args, **kwargs)
        answer = self._answers.get(key)
        if answer is None:
            inputs = list(tensors_in((args, kwargs)))
            before = [_state(t) for t in inputs]
            out = func(*args, **kwargs)
            recipe = _recipe(out, inputs) if [_state(t) for t in inputs] == before else None
            if len(self._answers) >= self.LIMIT:
                self._answers.clear()
            self._answers[key] = recipe if recipe is not None else _NOT_REMEMBERED
            return out
        if answer is _NOT_REMEMBERED:
            return func(*args, **kwargs)
        self.hits += 1
        return _make(answer, args, kwargs)


_PROCESS = MetaMemo()


def trace_memo() -> MetaMemo:
    """The memory every remembering trace in the process answers from."""
    return _PROCESS
