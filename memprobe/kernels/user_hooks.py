"""Python's process-wide hooks user code may set and leave behind, put back after each
call and import of it (:func:`memprobe.kernels.user.user_code`): the root logger's
handlers and level, the trace and profile functions, and sys.modules; and the finders and
path hooks it adds, seen through a wrapper that forgives their exceptions. Left in place,
they ran in (or broke) memprobe's own work after the code returned: what they wrote reached
`--json`'s standard output (user code's own output goes to standard error only while it
runs), and a blocked import ended the command in a traceback."""

from __future__ import annotations

import contextlib
import copy
import logging
import operator
import sys
import threading
from collections.abc import Iterator
from itertools import repeat
from typing import Any

from memprobe.kernels.user_guards import differs

# What user code left on the root logger (``logging.basicConfig(stream=sys.stdout,
# level=logging.DEBUG)`` as its module is imported): its handlers, and its level (None:
# the code left the level as it found it). Swapped in while user code runs, so its own
# records go where it sent them; swapped out as it returns. Left on, every record of
# what memprobe runs later went through them: matplotlib's DEBUG lines, drawing a sweep's
# report or `profile --html`'s page, went into `--json`'s object on standard output.
_ROOT_LEFT: dict[str, Any] = {"handlers": [], "level": None}


@contextlib.contextmanager
def logging_kept(theirs: bool = True) -> Iterator[None]:
    """The root logger as memprobe had it, around user code (``theirs``: the code is the
    user's, and sees what it left there before). Only the root's: the one that
    ``basicConfig`` and a bare ``logging.debug()`` set up, which every logger's records
    reach; a handler the code adds to a logger of its own is its own."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    if theirs:
        root.handlers.extend(h for h in _ROOT_LEFT["handlers"] if h not in root.handlers)
        if _ROOT_LEFT["level"] is not None:
            root.setLevel(_ROOT_LEFT["level"])
    lent = list(root.handlers), root.level
    try:
        yield
    finally:
        if (list(root.handlers), root.level) != lent:  # the code changed them
            _ROOT_LEFT["handlers"] = [h for h in root.handlers if h not in handlers]
            _ROOT_LEFT["level"] = None if root.level == level else root.level
        root.handlers[:] = handlers
        if root.level != level:
            root.setLevel(level)


@contextlib.contextmanager
def tracing_kept() -> Iterator[None]:
    """Put back the trace and profile functions user code set (``sys.settrace``,
    ``sys.setprofile``, and threading's for the threads started later): left on, the
    code's function ran at every call of memprobe's own code after it, what it printed
    went into `--json`'s object, and one that raised ended the command in a traceback."""
    trace, profile = sys.gettrace(), sys.getprofile()
    threads = _thread_hooks()
    try:
        yield
    finally:
        if sys.gettrace() is not trace:
            sys.settrace(trace)
        if sys.getprofile() is not profile:
            sys.setprofile(profile)
        if _thread_hooks() != threads:
            threading.settrace(threads[0])
            threading.setprofile(threads[1])


def _thread_hooks() -> tuple[Any, Any]:
    # threading.gettrace and getprofile are Python 3.10's; memprobe requires 3.10.
    return threading.gettrace(), threading.getprofile()


# The entries of sys.modules user code removed or replaced, and the import blockers it
# added (``sys.modules["matplotlib"] = None``, the way to make a module unimportable): by
# name, the code's value (_GONE: removed). Swapped in while user code runs; memprobe's
# own are back as it returns. Left in place, what memprobe imports later ended the
# command in "ModuleNotFoundError: import of matplotlib halted; None in sys.modules",
# a traceback after the sweep (its report, `profile --html`).
_MODULES_LEFT: dict[str, Any] = {}
_GONE = object()


def no_modules_left() -> bool:
    """Whether no user code has left an entry of sys.modules removed, replaced or blocked."""
    return not _MODULES_LEFT


@contextlib.contextmanager
def modules_kept(theirs: bool = True) -> Iterator[None]:
    """sys.modules as memprobe had it, around user code (``theirs``: the code is the
    user's, and sees what it left there before). Modules the code imports stay."""
    modules = sys.modules
    own = dict(modules)
    if theirs:
        for name, value in _MODULES_LEFT.items():
            if value is _GONE:
                modules.pop(name, None)
            else:
                modules[name] = value
    try:
        yield
    finally:
        blocked = any(map(operator.is_, modules.values(), repeat(None)))
        # Mostly the code left every entry as it found it: then there is nothing to keep.
        left = _modules_left(own) if blocked or differs(own, modules, _GONE) else {}
        if theirs:
            _MODULES_LEFT.clear()
            _MODULES_LEFT.update(left)
        for name in left:
            if name in own:
                modules[name] = own[name]
            else:  # a blocker the code added
                modules.pop(name, None)


def _modules_left(own: dict[str, Any]) -> dict[str, Any]:
    """What user code left in sys.modules that differs from ``own``: removed (_GONE),
    replaced, or blocked (None)."""
    modules = sys.modules
    left = {name: modules.get(name, _GONE) for name in own}
    left = {name: value for name, value in left.items() if value is not own[name]}
    left.update((name, None) for name, value in modules.items() if value is None)
    return left


# The import machinery user code adds to (a finder on sys.meta_path, a hook on
# sys.path_hooks) stays: six's importer, a plugin system's, may be what the code's own later
# imports need. But one that raised for a name not its own (``find_spec`` raising
# ImportError or RuntimeError for anything it does not serve) ended the command in its
# traceback when memprobe imported something after the code returned: pandas writing
# results.csv, matplotlib drawing the report. So, while memprobe's own work runs, each
# entry user code added is seen through a wrapper for which such an exception means "not
# mine", and Python goes on to the next; while user code runs, its entries are as it left
# them. Only an Exception: a KeyboardInterrupt (Ctrl-C) or SystemExit (torchrun's stop)
# that fires while the finder runs must still stop memprobe, as anywhere else. By the
# wrapped entry's identity, its wrapper (one per entry, so that a guard that compares
# entries by identity finds it again).
_WRAPPERS: dict[int, Any] = {}


class _ForgivingFinder:
    """A meta path finder user code added, as memprobe's own imports see it."""

    def __init__(self, finder: Any) -> None:
        self.finder = finder

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        spec = _found(self.finder, name, path, target)
        # A module memprobe's own finders find is theirs to load: a finder that claimed
        # every name (matplotlib's with a loader that raised) ended the report likewise.
        if spec is not None and any(
            _found(finder, name, path, target) is not None
            for finder in sys.meta_path
            if not isinstance(finder, _WRAPPED)
        ):
            return None
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec = copy.copy(spec)  # the finder's own, maybe given again to its code
            spec.loader = _ForgivingLoader(spec.loader)
        return spec

    def invalidate_caches(self) -> None:
        with contextlib.suppress(Exception):
            self.finder.invalidate_caches()

    def find_distributions(self, *args: Any, **kwargs: Any) -> list[Any]:
        # importlib.metadata asks every meta path finder for distributions (a package's
        # version, its entry points); none is what a finder without the method gives.
        try:
            return list(self.finder.find_distributions(*args, **kwargs))
        except Exception:
            return []

    def __repr__(self) -> str:
        return f"<memprobe's view of {self.finder!r}>"


class _ForgivingLoader:
    """The loader of a module only a user's finder serves, as memprobe's own imports see it:
    its failure is ModuleNotFoundError, so that an optional import (sympy's ``try: import
    flint except ImportError``, as memprobe's kernels first run) goes on without it."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        create = getattr(self.loader, "create_module", None)
        return self._forgiven(spec.name, create, spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        self._forgiven(module.__name__, self.loader.exec_module, module)

    def _forgiven(self, name: str, load: Any, what: Any) -> Any:
        try:
            return load(what)
        except Exception as exc:
            raise ModuleNotFoundError(f"{name}: {exc!r} from {self.loader!r}", name=name) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _found(finder: Any, name: str, path: Any, target: Any) -> Any:
    """The spec ``finder`` finds for ``name``, None for any Exception it raises."""
    try:
        find = getattr(finder, "find_spec", None)
        if find is not None:
            return find(name, path, target)
        if sys.version_info < (3, 12) and hasattr(finder, "find_module"):
            # Python before 3.12 still asked a finder without find_spec this way.
            import importlib.util

            loader = finder.find_module(name, path)
            return None if loader is None else importlib.util.spec_from_loader(name, loader)
    except Exception:
        pass
    return None


class _ForgivingHook:
    """A path hook user code added, as memprobe's own imports see it: ImportError, what a
    hook raises for a path entry it does not handle, for any Exception it raises."""

    def __init__(self, hook: Any) -> None:
        self.finder = hook

    def __call__(self, entry: str) -> Any:
        try:
            return self.finder(entry)
        except ImportError:
            raise
        except Exception:
            raise ImportError(f"not handled by {self.finder!r}", path=entry) from None


_WRAPPER_OF = {"meta_path": _ForgivingFinder, "path_hooks": _ForgivingHook}
_WRAPPED = (_ForgivingFinder, _ForgivingHook)


@contextlib.contextmanager
def importers_kept(theirs: bool = True) -> Iterator[None]:
    """The finders and path hooks user code added, as it left them while it runs
    (``theirs``: the code is the user's) and seen through their wrappers as it returns;
    those it removed, put back.

    Removed: a module that cleared sys.path_hooks (or sys.meta_path) as it was imported
    left memprobe unable to import anything after it: the sweep ended in a
    ModuleNotFoundError from pandas writing results.csv, a traceback and no results."""
    before = {name: list(getattr(sys, name)) for name in _WRAPPER_OF}
    cache = sys.path_importer_cache
    cached = dict(cache)
    own: dict[str, list[Any]] = {}
    for name in _WRAPPER_OF:
        entries = getattr(sys, name)
        if isinstance(entries, list):
            wrapped = [isinstance(e, _WRAPPED) for e in entries]
            own[name] = [e for e, w in zip(entries, wrapped, strict=True) if not w]
            if theirs:
                entries[:] = [e.finder if w else e for e, w in zip(entries, wrapped, strict=True)]
    try:
        yield
    finally:
        for name, wrapper in _WRAPPER_OF.items():
            entries = getattr(sys, name)
            if isinstance(entries, list) and name in own:
                entries[:] = [
                    e
                    if isinstance(e, _WRAPPED) or any(e is o for o in own[name])
                    else _wrap(e, wrapper)
                    for e in entries
                ]
        _put_back_cached(cache, cached)
        _put_back_removed(before)


def _put_back_cached(cache: dict[str, Any], cached: dict[str, Any]) -> None:
    """The finders Python had cached for sys.path's entries, where user code put another
    in one's place: a module that set them to None ("no finder here") or to a finder that
    raised left memprobe unable to import from site-packages after it, and the sweep ended
    in a traceback from pandas writing results.csv. Python adds an entry only for a path it
    has not cached, so a changed one is the code's; one it removed is found again."""
    if sys.path_importer_cache is not cache:
        sys.path_importer_cache = cache
    for path, finder in cached.items():
        if cache.get(path, finder) is not finder:
            cache[path] = finder


def _put_back_removed(before: dict[str, list[Any]]) -> None:
    for name, entries in before.items():
        now = getattr(sys, name)
        if not isinstance(now, list):  # replaced by something else altogether
            now = []
            setattr(sys, name, now)
        missing = [entry for entry in entries if not any(entry is e for e in now)]
        if missing:
            now.extend(missing)
            if name == "path_hooks":
                sys.path_importer_cache.clear()  # entries found no finder without them


def _wrap(entry: Any, wrapper: type[Any]) -> Any:
    """The one wrapper of ``entry`` (kept with it: its id names no other object)."""
    if id(entry) not in _WRAPPERS:
        _WRAPPERS[id(entry)] = wrapper(entry)
    return _WRAPPERS[id(entry)]
