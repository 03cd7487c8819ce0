"""One JSON codec for memprobe's frozen dataclass records, in place of a hand-written
``to_json`` / ``from_json`` pair on each.

:func:`to_json` writes a record as an object of its fields in field order: nested
records recursively, tuples and lists as arrays, enums by value, paths as strings,
dicts by their values. Two declarations on a record change that, both read once per
class:

- ``JSON_KEYS``, a ``ClassVar`` tuple of names: the keys written, in that order. A name
  may be a property (a derived figure a reader wants, ``delta_bytes``); a field not named
  is not written. For outputs whose key order was fixed before their fields were
  (``--json`` schemas stay byte-identical), and for views that leave fields out.
- ``field(metadata=NOT_JSON)``: a field never written (a trace, a raw snapshot).

:func:`from_json` reads the same form back by the fields' type hints: records, tuples
(``tuple[X, ...]`` and fixed ``tuple[A, B]``), ``X | None``, ``Literal``, enums, paths,
``dict[str, X]`` and the scalars, checked as it goes; a key the record does not have
(a written property) is ignored, a missing one takes the field's default. A value of
the wrong type is a :class:`ValueError` that names where it is.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any, TypeVar

T = TypeVar("T")

# A field with this metadata is left out of the JSON form (and takes its default on reading).
NOT_JSON: Mapping[str, bool] = types.MappingProxyType({"json": False})


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data: dicts, lists, strings, numbers, booleans and None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {key: to_json(getattr(value, key)) for key in _keys(type(value))}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, PurePath):
        return str(value)
    return value


def from_json(cls: type[T], data: Any) -> T:
    """The record of type ``cls`` that :func:`to_json` wrote as ``data``."""
    value: T = _decode(cls, data, cls.__name__)
    return value


@functools.cache
def _keys(cls: type) -> tuple[str, ...]:
    declared = cls.__dict__.get("JSON_KEYS")
    if declared is not None:
        return tuple(declared)
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("json", True))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in names}


@functools.cache
def _required(cls: type) -> frozenset[str]:
    """The fields without a default: a JSON form must hold them."""
    missing = dataclasses.MISSING
    return frozenset(
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is missing and f.default_factory is missing
    )


def _wrong(where: str, hint: Any, data: Any) -> ValueError:
    name = getattr(hint, "__name__", str(hint))
    return ValueError(f"{where}: expected {name}, got {type(data).__name__} {data!r:.60}")


def _decode(hint: Any, data: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return data
    if origin is typing.Union or origin is types.UnionType:
        if data is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _decode(options[0], data, where)
        for option in options:  # a union of scalars (``int | str``): the one it is
            if isinstance(option, type) and _is_scalar(option, data):
                return data
        raise _wrong(where, hint, data)
    if origin is typing.Literal:
        if data not in args:
            raise ValueError(f"{where}: expected one of {args}, got {data!r:.60}")
        return data
    if origin is tuple:
        if not isinstance(data, list):
            raise _wrong(where, hint, data)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise ValueError(f"{where}: expected {len(args)} items, got {len(data)}")
        return tuple(
            _decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True))
        )
    if origin is list:
        if not isinstance(data, list):
            raise _wrong(where, hint, data)
        return [_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        if not isinstance(data, dict):
            raise _wrong(where, hint, data)
        return {k: _decode(args[1], v, f"{where}[{k!r}]") for k, v in data.items()}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(data, dict):
            raise _wrong(where, hint, data)
        hints = _hints(hint)
        missing = _required(hint) - data.keys()
        if missing:
            raise ValueError(f"{where}: missing {', '.join(sorted(missing))}")
        kwargs = {
            name: _decode(h, data[name], f"{where}.{name}")
            for name, h in hints.items()
            if name in data
        }
        return hint(**kwargs)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(data)
    if hint is Path:
        if not isinstance(data, str):
            raise _wrong(where, hint, data)
        return Path(data)
    if isinstance(hint, type) and _is_scalar(hint, data):
        return data
    raise _wrong(where, hint, data)


def _is_scalar(hint: type, data: Any) -> bool:
    """``data`` is a JSON value of the scalar type ``hint`` (an int counts as a float;
    a bool is no int)."""
    if hint is float:
        return isinstance(data, (int, float)) and not isinstance(data, bool)
    if hint is int:
        return isinstance(data, int) and not isinstance(data, bool)
    return hint in (str, bool) and isinstance(data, hint)


def nests_past(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists or dicts more than ``limit`` deep (walked without
    recursion, so that asking never overflows the stack)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False
