"""memprobe's own modules as user code may change them, put back after each call and
import of it (:func:`memprobe.kernels.user.user_code`).

A user's kernel or step imports memprobe (``from memprobe.kernels import get_kernel``),
and from there can reach all of it: a kernel's module that set
``registry.KERNELS["unchunked"]`` to another kernel's spec had the sweep's unchunked row
read local_chunked's 66,304 B, ok, where unchunked holds 114,944 B; one that emptied
KERNELS ended the sweep as "unknown kernel 'unchunked'"; one that set
``SWEEP_FILTERS["filtered"]["top_k"] = 1`` had filtered measured at top_k=1; a property
put on the AllocationTracker class, or another ``__code__`` given to one of memprobe's
kernels, failed every row. memprobe's state is not the user's to lend: what the code
changes of it is undone as the code returns, and its own later work reads its own.

What is kept, for every memprobe module imported: its names (rebound or deleted; a name
added stays, as an imported submodule is one), the dicts, lists and sets it holds and
those they hold, the attributes of the frozen memprobe objects among them (a KernelSpec),
the attributes of its classes (an added one is taken off: it shadows what the class
inherits), and the code and defaults of its functions and methods. The guards' own
records (what user code left, lent back to it) are left to the guards.
"""

from __future__ import annotations

import contextlib
import operator
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any

from memprobe.io.text import printable

_GONE = object()
_GUARDS = ("memprobe.kernels.user",)  # user.py and its user_*.py guard modules


def _ours(value: Any) -> bool:
    module = getattr(value, "__module__", None)
    return isinstance(module, str) and (module == "memprobe" or module.startswith("memprobe."))


@dataclass
class _Holders:
    """Where memprobe's state lives: namespaces whose names are kept (modules; classes and
    objects, whose added names are taken off too), functions, containers."""

    modules: list[Any] = field(default_factory=list)
    objects: list[Any] = field(default_factory=list)
    functions: list[types.FunctionType] = field(default_factory=list)
    containers: list[Any] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)

    def add(self, value: Any, depth: int = 0) -> None:
        if id(value) in self.seen:
            return
        if isinstance(value, types.FunctionType):
            if _ours(value):
                self.seen.add(id(value))
                self.functions.append(value)
        elif isinstance(value, type):
            if _ours(value):
                self.seen.add(id(value))
                self.objects.append(value)
                for member in list(vars(value).values()):
                    self.add(getattr(member, "__func__", member), depth)
        elif isinstance(value, (dict, list, set)):
            self.seen.add(id(value))
            self.containers.append(value)
            if depth < 2:
                for item in list(value.values() if isinstance(value, dict) else value):
                    self.add(item, depth + 1)
        elif _ours(type(value)) and _frozen(value):
            self.seen.add(id(value))
            self.objects.append(value)


def _frozen(value: Any) -> bool:
    """A frozen dataclass's instance (a KernelSpec), which memprobe never changes: its other
    objects (a tracker, counting what the user's kernel allocates) are its work in progress."""
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(getattr(params, "frozen", False)) and hasattr(value, "__dict__")


@dataclass
class _Found:
    """The holders found last, for memprobe's modules of those names (looked up again only
    when the count of all imported modules changed). Keyed by that count alone, every user
    module a test or a kernel imported, and each module torch imports lazily as a command
    runs, walked all of memprobe's objects again: half the calls, most of the guard's cost."""

    count: int = -1
    names: tuple[str, ...] = ()
    holders: _Holders | None = None


_FOUND = _Found()


def _holders() -> _Holders:
    count = len(sys.modules)
    if count != _FOUND.count or _FOUND.holders is None:
        names = tuple(
            name
            for name, module in list(sys.modules.items())
            if (name == "memprobe" or name.startswith("memprobe."))
            and not name.startswith(_GUARDS)
            and isinstance(module, types.ModuleType)
        )
        if names != _FOUND.names or _FOUND.holders is None:
            _FOUND.names, _FOUND.holders = names, _collect(names)
        _FOUND.count = count
    return _FOUND.holders


def _collect(names: tuple[str, ...]) -> _Holders:
    holders = _Holders()
    for name in names:
        module = sys.modules[name]
        holders.modules.append(module)
        for key, value in list(vars(module).items()):
            # Not a module's own dunders: __builtins__ is Python's builtins dict.
            if not key.startswith("__") and not isinstance(value, types.ModuleType):
                holders.add(value)
    return holders


def _changed(space: Any, saved: dict[str, Any]) -> bool:
    """Whether the mapping ``space`` holds other names or objects than ``saved``."""
    if len(space) != len(saved):
        return True
    return any(map(operator.is_not, saved.values(), map(space.get, saved, repeat(_GONE))))


def _put_back_names(owner: Any, saved: dict[str, Any], *, added: bool) -> None:
    """``owner``'s names as ``saved`` (``added``: names it did not have are taken off). A
    class through setattr (its namespace is read-only); a module or an object through its
    dict (a frozen dataclass refuses setattr)."""
    now = vars(owner)
    if not _changed(now, saved):
        return
    if not isinstance(owner, type):
        extra = {name: now[name] for name in now if name not in saved and not added}
        now.clear()
        now.update(saved, **extra)
        return
    for name, value in saved.items():
        if now.get(name, _GONE) is not value:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(owner, name, value)
    for name in [name for name in now if name not in saved]:
        with contextlib.suppress(AttributeError, TypeError):
            delattr(owner, name)


def _spaces(found: _Holders) -> tuple[list[Any], list[Any]]:
    """The namespaces and dicts of ``found`` (read by key), and its lists and sets."""
    spaces: list[Any] = [*map(vars, found.modules), *map(vars, found.objects)]
    spaces += [c for c in found.containers if isinstance(c, dict)]
    return spaces, [c for c in found.containers if not isinstance(c, dict)]


def _fingerprint(found: _Holders) -> tuple[list[Any], list[int]]:
    """Every object memprobe's state holds, in order, and the size of each holder: the
    same objects, the same state (a check in C over some 20,000 references; comparing
    holder by holder in Python cost 3 ms a call)."""
    spaces, sequences = _spaces(found)
    functions = found.functions
    held = list(
        chain(
            chain.from_iterable(map(_KEYS, spaces)),
            chain.from_iterable(map(_VALUES, spaces)),
            chain.from_iterable(sequences),
            map(_CODE, functions),
            map(_DEFAULTS, functions),
            map(_KWDEFAULTS, functions),
        )
    )
    return held, [*map(len, spaces), *map(len, sequences)]


_KEYS, _VALUES = operator.methodcaller("keys"), operator.methodcaller("values")
_CODE, _DEFAULTS = operator.attrgetter("__code__"), operator.attrgetter("__defaults__")
_KWDEFAULTS = operator.attrgetter("__kwdefaults__")


class MemprobeChanged(RuntimeError):
    """A call of user code changed memprobe's own state (put back as it returned): what
    memprobe measured of it while changed was not measured by memprobe's own code."""


@contextlib.contextmanager
def memprobe_kept(importing: bool = False) -> Iterator[None]:
    """memprobe's own state as it was, around user code. What a module changes as it is
    imported is undone before anything is measured; what a call changes may have changed
    its own figures (a property that answers the tracker's peak, a class's dispatch made
    to record nothing): that call fails, with what it changed."""
    found = _holders()
    before = _fingerprint(found)
    failed = False
    try:
        yield
    except BaseException:
        failed = True  # its own failure says more
        raise
    finally:
        after = _fingerprint(found)
        if after[1] != before[1] or any(map(operator.is_not, before[0], after[0])):
            changed = _put_back(found, *before)
            if not (importing or failed):
                raise MemprobeChanged(
                    f"the code changed memprobe's own {changed} (put back as it returned), "
                    "so what memprobe measured of it was not measured by memprobe's own code: "
                    "leave memprobe's modules as they are"
                )


def _name(owner: Any) -> str:
    if isinstance(owner, types.ModuleType):
        return owner.__name__
    cls = owner if isinstance(owner, type) else type(owner)
    return f"{cls.__module__}.{cls.__qualname__}"


def _put_back(found: _Holders, held: list[Any], sizes: list[int]) -> str:
    """What user code changed of ``found``, put back from its fingerprint; the first thing
    changed, named."""
    changed: list[str] = []
    spaces, sequences = _spaces(found)
    owners = [*found.modules, *found.objects, *spaces[len(found.modules) + len(found.objects) :]]
    total = sum(sizes[: len(spaces)])
    at = 0
    for owner, space, size in zip(owners, spaces, sizes, strict=False):
        saved = dict(zip(held[at : at + size], held[total + at : total + at + size], strict=True))
        at += size
        if not _changed(space, saved):
            continue
        if owner is space:  # a dict of memprobe's
            changed.append(f"dict of {', '.join(map(repr, list(saved)[:3]))}")
            space.clear()
            space.update(saved)
        else:  # a module keeps the names added (its submodules); a class or object not
            names = [n for n in {*saved, *space} if saved.get(n, _GONE) is not space.get(n, _GONE)]
            changed.append(f"{_name(owner)}.{sorted(names)[0]}")
            _put_back_names(owner, saved, added=not isinstance(owner, types.ModuleType))
    at = 2 * total
    for sequence, size in zip(sequences, sizes[len(spaces) :], strict=True):
        saved_items = held[at : at + size]
        at += size
        if len(sequence) != size or any(map(operator.is_not, sequence, saved_items)):
            changed.append(f"{type(sequence).__name__} of {len(saved_items)} items")
            if isinstance(sequence, list):
                sequence[:] = saved_items
            else:
                sequence.clear()
                sequence.update(saved_items)
    count = len(found.functions)
    for i, fn in enumerate(found.functions):
        body, defaults, keywords = held[at + i], held[at + count + i], held[at + 2 * count + i]
        if fn.__code__ is not body or fn.__defaults__ is not defaults:
            changed.append(f"{fn.__module__}.{fn.__qualname__}")
            fn.__code__, fn.__defaults__ = body, defaults
        if fn.__kwdefaults__ is not keywords:
            fn.__kwdefaults__ = keywords
    return printable(changed[0] if changed else "state")[:200]
