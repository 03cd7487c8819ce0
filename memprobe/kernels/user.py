"""Your own kernel, by import path: ``package.module:function`` → a :class:`KernelSpec`.

memprobe measures any callable that follows one of its two input protocols:

* logits: ``fn(logits, targets, *, chunk_size=None) -> Tensor[B, S]``
* hidden: ``fn(hidden, weight, targets, *, chunk_size=None) -> Tensor[B, S]``

How the protocol is told (the rule, in order):

1. an attribute ``fn.memprobe_inputs = "logits"`` or ``"hidden"`` decides;
2. otherwise the signature does: the number of positional parameters without
   a default, 2 → logits, 3 → hidden. A ``*args`` parameter makes the count
   ambiguous, so such a callable needs the attribute.

Either way the callable must accept ``chunk_size`` as a keyword (a parameter of
that name, or ``**kwargs``). ``fn.memprobe_consumes_logits = True`` tells
memprobe that backward writes the gradient into the logits (their floor then
counts no separate gradient). The spec's name is the import path itself.

When ``package`` is not importable as installed, the current directory is
tried as well (as ``python -m`` would), so a kernel in the project being
tested resolves from the project root.

Every failure (import error, missing attribute, not callable, wrong
signature) raises :class:`memprobe.errors.UserError`: one line and a hint.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Iterator
from functools import cache
from typing import Any

from memprobe.errors import Unwind, UserError
from memprobe.io.text import exception_text, quoted
from memprobe.kernels import user_process as process
from memprobe.kernels.spec import INPUT_PROTOCOLS, KernelSpec
from memprobe.kernels.user_guarded import guarded as _guarded

_PROTOCOL_ARITY = {2: "logits", 3: "hidden"}
_SIGNATURES = {
    "logits": "fn(logits, targets, *, chunk_size=None)",
    "hidden": "fn(hidden, weight, targets, *, chunk_size=None)",
}
_SHAPE_HINT = (
    f"a kernel is {_SIGNATURES['logits']} or {_SIGNATURES['hidden']}, "
    "given as package.module:function"
)


class UserCodeExit(RuntimeError):
    """User code (a kernel, a step, a module being imported) ended by a BaseException that
    is not an Exception: ``sys.exit()``, ``GeneratorExit``, pytest's ``skip()``, a class of
    its own. Uncaught, each would end memprobe with a traceback or the code's own status."""


class UserCodeError(RuntimeError):
    """User code raised memprobe's own :class:`~memprobe.errors.UserError`: its failure."""


def how_it_left(exc: BaseException) -> str:
    """``exc``, a BaseException user code ended by, in words."""
    if isinstance(exc, SystemExit):
        # quoted: the code's own object, whose repr may raise (or run a megabyte long)
        return f"called sys.exit({quoted(exc.code)}) instead of returning"
    return f"raised {exception_text(exc)} (a BaseException, not an Exception)"


@contextlib.contextmanager
def user_code(who: str, *, part: str = "", its_state: bool = True) -> Iterator[None]:
    """Around every call into a user's code (``who``: "the step", a kernel's name; ``part``
    the part of it that runs, as the one line names it: "'s backward"; ``its_state``: what
    the user's code left of torch and the process is swapped in while it runs).

    The current directory the code changes is put back (:func:`cwd_kept`), and a
    BaseException that is not an Exception becomes :class:`UserCodeExit`, handled as the
    code's failure; KeyboardInterrupt (Ctrl-C) still ends the run, and memprobe's own
    :class:`~memprobe.errors.Unwind` (another rank's failure) passes as it is.
    """
    users = is_import_path(who) or (who == "the step" and its_state)  # not a model's step
    try:
        # memprobe's own kernels run under these guards too (a sweep calls every kernel
        # alike); what user code replaced of torch is swapped in for the user's alone.
        with _guarded(theirs=its_state and users, users=users):
            yield
    except process.StreamsLost as exc:  # what the code did to memprobe's process: ends it
        raise process.StreamsLost(f"{who}{part} {exc.message}", exc.hint) from None
    except UserError as exc:
        if not users:  # memprobe's own; raised by user code, it ended a whole sweep as
            raise  # memprobe's line, with the code's message and the other kernels unrun
        raise UserCodeError(f"{who}{part} raised UserError: {exc.one_line()}") from None
    except Unwind as exc:
        if exc.is_issued():
            raise
        raise UserCodeExit(f"{who}{part} {how_it_left(exc)}") from None
    except (KeyboardInterrupt, Exception):
        raise
    except BaseException as exc:
        raise UserCodeExit(f"{who}{part} {how_it_left(exc)}") from None


def is_import_path(name: str) -> bool:
    """True for ``package.module:function`` names (user kernels), False for registered ones."""
    return ":" in name


@cache
def resolve_user_kernel(path: str) -> KernelSpec:
    """Import ``package.module:function`` and describe it as a :class:`KernelSpec`."""
    fn = import_callable(path, what="kernel", hint=_SHAPE_HINT)
    try:
        # The callable's own attributes are its code too: a __signature__ or __getattr__
        # that raises is the kernel's failure, said in one line.
        _returns_a_tensor(fn, path)
        inputs = _protocol(fn, path)
        doc = inspect.getdoc(fn)
        consumes = getattr(fn, "memprobe_consumes_logits", None)
        consumes = False if consumes is None else consumes  # None: not said, as unset
        if not isinstance(consumes, bool):
            # Read by its truth, "False" (or "no", 1) said it consumes its logits: the floor
            # dropped their gradient (16 KiB where it holds 32 KiB), and the kernel was told
            # to consume logits it keeps.
            text = str.__str__(consumes)[:40] if isinstance(consumes, str) else None
            held = repr(text) if text is not None else type(consumes).__name__
            raise UserError(
                f"kernel {path!r}: memprobe_consumes_logits is {held}, not True or False",
                "set it to True (the kernel writes into its logits) or False",
            )
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"kernel {path!r} cannot be read as a kernel: {exception_text(exc)}",
            "make it a plain function fn(logits, targets, *, chunk_size=None)",
        ) from None
    summary = doc.splitlines()[0] if doc else f"user kernel ({inputs} protocol)"
    return KernelSpec(
        path,
        fn,
        summary,
        # memprobe never pre-casts for a user kernel: what it casts is its own business.
        casts_per_chunk=True,
        consumes_logits=consumes,
        inputs=inputs,
    )


def import_callable(path: str, *, what: str, hint: str) -> Any:
    """Import ``package.module:function`` (the current directory tried as well) and return
    the callable; ``what`` names it in errors ("kernel", "step"), ``hint`` says what a
    valid one looks like. Every failure is a :class:`UserError`."""
    module_name, attr_path = _split(path, what, hint)
    module = _import(module_name, path, what)
    fn: Any = module
    for part in attr_path.split("."):
        try:
            fn = getattr(fn, part)
        except AttributeError:
            shadowed = _shadowed(module_name)
            if shadowed is not None:
                top = module_name.split(".")[0]
                raise UserError(
                    f"{what} {path!r}: {shadowed}", f"rename yours (e.g. my_{top}) and name that"
                ) from None
            if not inspect.ismodule(module):
                raise UserError(
                    f"{what} {path!r}: importing {module_name!r} gave a "
                    f"{type(module).__name__}, not a module (it replaced itself in "
                    f"sys.modules), with no attribute {attr_path!r}",
                    f"keep {attr_path} on what the module leaves in sys.modules[__name__]",
                ) from None
            raise UserError(
                f"{what} {path!r}: module {module_name!r} has no attribute {attr_path!r}",
                f"check the spelling; {module_name} defines "
                f"{_public_names(module) or 'no public names'}",
            ) from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            # A module's own __getattr__ (PEP 562) or a class property that raises
            # something else, or exits: a traceback out of memprobe without this.
            raise UserError(
                f"{what} {path!r}: reading {part!r} from {module_name!r} failed: "
                f"{exception_text(exc)}",
                hint,
            ) from None
    if not callable(fn):
        raise UserError(f"{what} {path!r} is a {type(fn).__name__}, not a callable", hint)
    return fn


def _shadowed(module_name: str) -> str | None:
    """Why the current directory's ``NAME.py`` (or ``NAME/``) was not the module imported:
    the name is already Python's or an installed package's (``copy``, ``typer``,
    ``memprobe``). Without this, a step in ``./copy.py`` read "module 'copy' has no
    attribute 'step' (check the spelling; copy defines Error, copy, deepcopy...)"."""
    top = module_name.split(".")[0]
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    local = next(
        (name for name in (f"{top}.py", top) if os.path.exists(os.path.join(cwd, name))), None
    )
    if local is None:
        return None
    where = getattr(sys.modules.get(top), "__file__", None)
    if not isinstance(where, str):
        # Built in, or the module here replaced itself in sys.modules (None, an object of
        # its own), which was read as "a module built into Python": rename it, it said.
        if top not in sys.builtin_module_names:
            return None
        return f"{top!r} is a module built into Python, so ./{local} is not what that name imports"
    if os.path.realpath(where).startswith(os.path.realpath(cwd) + os.sep):
        return None  # the module imported is the one here: its attribute is what is missing
    taken = f"already the module at {where}"
    return f"{top!r} is {taken}, so ./{local} is not what that name imports"


def _split(path: str, what: str, hint: str) -> tuple[str, str]:
    module_name, sep, attr_path = path.partition(":")
    names = [*module_name.split("."), *attr_path.split(".")]
    if not sep or ":" in attr_path or not all(n.isidentifier() for n in names):
        meant = meant_import_path(path)
        advice = " ".join(meant) if meant else hint
        raise UserError(f"{what} {path!r} is not an import path", advice)
    return module_name, attr_path


# Files memprobe reads or writes that are no Python module (a snapshot, results, a config).
_DATA_FILES = (".pickle", ".pkl", ".pt", ".pth", ".json", ".toml", ".html", ".csv", ".png")
# Where a spelling names no function, the place one goes in the example.
FUNCTION = "<function>"


def meant_import_path(path: str) -> tuple[str, str] | None:
    """The import path a mistaken spelling most likely meant, after the advice that leads
    to it (``("name the module, not its file:", "mine:step")``), or None when none can be
    read from it. A file's path (``./mine.py:step``, ``pkg/mine:step``, one from
    ``/``), a dot where the colon goes (``mine.step``) and stray blanks were all answered
    with the bare rule, where ``mine.py:step`` already got the spelling that works."""
    text = "".join(path.split())
    if ":" not in text and text.lower().endswith(_DATA_FILES):
        return None  # `profile step.pickle`: "e.g. step:pickle" named a function `pickle`
    if ":" not in text and text.endswith(".py"):
        # A file named without its function (`mine.py`, `pkg/mine.py`): read as a dot for
        # the colon, it was answered "mine:py", a function named `py`.
        module_path, sep, attr = text, ":", FUNCTION
    else:
        module_path, sep, attr = text.rpartition(":") if ":" in text else text.rpartition(".")
    if not sep or not (attr.isidentifier() or attr == FUNCTION):
        return None
    folder, _, file = module_path.removesuffix(".py").rpartition("/")
    names = [n for n in folder.split("/") if n not in ("", ".")] if folder else []
    if module_path.startswith("/") or ".." in names:
        # From a folder elsewhere, the module is its file's name, run from that folder.
        where = os.path.dirname(module_path) or "/"
        names = []
        lead = f"run memprobe from {where} and name the module:"
    else:
        # A dot for the colon is a guess (`pkg.mod` may be a module, its function left
        # out): the rule, with the likeliest spelling as its example.
        lead = (
            "name the module and a function in it, not the file:"
            if attr == FUNCTION
            else "name the module, not its file:"
            if "/" in module_path
            else "write"
            if ":" in text  # the colon was there: a blank around a name was the mistake
            else "separate the module from its function with ':', e.g."
        )
    dotted = [*names, *file.split(".")]
    if not all(n.isidentifier() for n in dotted):
        return None
    return lead, f"{'.'.join(dotted)}:{attr}"


def _importing() -> contextlib.AbstractContextManager[None]:
    """The guards around the import of a user's module: what it runs as it is imported
    (a library's logging.basicConfig, a print) is user code too."""
    return _guarded(theirs=True, importing=True)


def _import(module_name: str, path: str, what: str) -> Any:
    try:
        with _importing():
            return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing: ModuleNotFoundError = exc
    except KeyboardInterrupt:
        raise
    # The module itself raised while importing, called sys.exit (which would end
    # memprobe with the module's status and no word), or raised another BaseException.
    except BaseException as exc:
        raise _import_failed(module_name, path, exc, what) from None
    cwd = os.getcwd()
    if missing.name == module_name.split(".")[0] and cwd not in sys.path and "" not in sys.path:
        # Not installed: try the current directory, as `python -m` would.
        # Only for this import: left first on sys.path, the project's own modules would
        # shadow the standard library's for the rest of the run (a colorsys.py).
        sys.path.insert(0, cwd)
        try:
            # Shielded as the first try is: found here (the console script's sys.path holds
            # no current directory), a print at import went into `--json`'s object.
            with _importing():
                return importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise _import_failed(module_name, path, exc, what) from None
        finally:
            sys.path.remove(cwd)
    hint = "install the package or run memprobe from the directory that holds it"
    if module_name.endswith(".py"):
        # A file name, not a module: `my_step.py:train_step` is `my_step:train_step`.
        attr = path.partition(":")[2]
        hint = f"name the module, not its file: {module_name.removesuffix('.py')}:{attr}"
    raise UserError(f"{what} {path!r}: cannot import {module_name!r} ({missing})", hint)


def _import_failed(module_name: str, path: str, exc: BaseException, what: str) -> UserError:
    return UserError(
        f"{what} {path!r}: importing {module_name!r} failed: {exception_text(exc)}",
        f"run python -c 'import {module_name}' to see the traceback",
    )


def _public_names(module: Any) -> str:
    try:
        # What the import gave: a module that replaced itself in sys.modules gives its
        # replacement (None, an object without a __dict__), and vars() raises.
        found = dict(vars(module))
    except TypeError:
        return ""
    names = [n for n in found if not n.startswith("_") and callable(found[n])]
    return ", ".join(sorted(names)[:8]) + (" ..." if len(names) > 8 else "")


def body_not_run(fn: Any) -> str | None:
    """What ``fn`` is when calling it runs none of its body ("a generator function", "an
    async function"), looking through functools.partial and an instance's ``__call__``;
    None for a callable whose call runs it."""
    call = fn if inspect.isroutine(fn) or not callable(fn) else type(fn).__call__
    for target in (fn, call, called_function(fn)):
        if inspect.isasyncgenfunction(target):
            return "an async generator function"
        if inspect.iscoroutinefunction(target):
            return "an async function"
        if inspect.isgeneratorfunction(target):
            return "a generator function"
    return None


def called_function(fn: Any) -> Any:
    """What a call of ``fn`` runs with the arguments it is given: a torch.nn.Module's
    ``forward`` (its ``__call__`` takes ``*args, **kwargs`` and passes them on), else
    ``fn``. A loss module named as the kernel was refused as "takes *args, so its protocol
    is ambiguous", whatever its forward took, and one whose forward lacked chunk_size, told
    to declare its protocol, then failed in every case."""
    torch = sys.modules.get("torch")  # a Module instance means torch is imported
    if torch is not None and isinstance(fn, torch.nn.Module):
        return getattr(fn, "forward", fn)
    return fn


def _returns_a_tensor(fn: Any, path: str) -> None:
    """Refuse a callable whose call can never give a tensor, before any case runs: each
    case of a sweep (and a plan, a what-if, a step) failed on its own, a step's line
    blamed the model's config, an async one left Python's "never awaited" warning."""
    if inspect.isclass(fn):
        raise UserError(
            f"kernel {path!r} is a class: calling it makes an instance, not the log-probs",
            "name a function, an instance with __call__, or a function that calls a "
            "torch.autograd.Function's apply",
        )
    kind = body_not_run(fn)
    if kind is not None:
        raise UserError(
            f"kernel {path!r} is {kind}: calling it returns {_RETURNS[kind]}, not a tensor",
            f"make it a plain function; {_SHAPE_HINT}",
        )
    try:
        params = inspect.signature(called_function(fn)).parameters.values()
    except (TypeError, ValueError):
        return  # no signature to read: _protocol says so
    # memprobe passes the inputs and chunk_size alone: a keyword it must have is never given.
    needed = [
        p.name
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY
        and p.default is inspect.Parameter.empty
        and p.name != "chunk_size"
    ]
    if needed:
        raise UserError(
            f"kernel {path!r} requires keyword {needed[0]!r}, which memprobe never passes",
            f"give it a default, or bind it: k = functools.partial(fn, {needed[0]}=...) and name k",
        )


_RETURNS = {
    "a generator function": "a generator",
    "an async function": "a coroutine",
    "an async generator function": "an async generator",
}


def _protocol(fn: Any, path: str) -> str:
    declared = getattr(fn, "memprobe_inputs", None)
    if isinstance(declared, str):
        # As the characters it holds: a str subclass's own __eq__ or __str__ passed "bogus"
        # (a KeyError as each case's error) or read "logits" as "hidden".
        declared = str.__str__(declared)
    if declared is not None and declared not in INPUT_PROTOCOLS:
        raise UserError(
            f"kernel {path!r}: memprobe_inputs = {declared!r}",
            f"use one of {', '.join(map(repr, INPUT_PROTOCOLS))}",
        )
    try:
        params = list(inspect.signature(called_function(fn)).parameters.values())
    except (TypeError, ValueError):
        # No signature to read (some builtins): trust the attribute if any.
        if declared is not None:
            return str(declared)
        raise UserError(
            f"kernel {path!r}: its signature cannot be read",
            "set fn.memprobe_inputs = 'logits' or 'hidden'",
        ) from None
    kinds = inspect.Parameter
    takes_chunk = any(
        p.kind is kinds.VAR_KEYWORD
        or (p.name == "chunk_size" and p.kind in (kinds.KEYWORD_ONLY, kinds.POSITIONAL_OR_KEYWORD))
        for p in params
    )
    if not takes_chunk:
        raise UserError(f"kernel {path!r} takes no chunk_size keyword", f"{_SHAPE_HINT}")
    if declared is not None:
        return str(declared)
    if any(p.kind is kinds.VAR_POSITIONAL for p in params):
        raise UserError(
            f"kernel {path!r} takes *args, so its protocol is ambiguous",
            "set fn.memprobe_inputs = 'logits' or 'hidden'",
        )
    required = [
        p
        for p in params
        if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        and p.default is kinds.empty
        and p.name != "chunk_size"
    ]
    protocol = _PROTOCOL_ARITY.get(len(required))
    if protocol is None:
        names = ", ".join(p.name for p in required) or "none"
        raise UserError(
            f"kernel {path!r} takes {len(required)} positional "
            f"argument{'' if len(required) == 1 else 's'} ({names}), "
            "expected 2 (logits protocol) or 3 (hidden protocol)",
            _SHAPE_HINT,
        )
    return protocol
