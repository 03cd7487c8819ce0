"""What user code may change in memprobe's process, and memprobe puts back after each
call and import of it (:func:`memprobe.kernels.user.user_code`): the current directory,
the standard streams, the torch functions it replaces, the threads and forks it starts, the
environment variables memprobe reads, the umask, the recursion limit and sys.path."""

from __future__ import annotations

import atexit
import contextlib
import functools
import operator
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from itertools import repeat
from typing import Any, TextIO, cast

from memprobe.io.text import exception_text, printable
from memprobe.kernels.user_process import stderr_fd_kept, stdout_fd_kept
from memprobe.kernels.user_threads import OS_EXIT, USERS_THREADS, exit_unless_users_thread


@contextlib.contextmanager
def cwd_kept() -> Iterator[None]:
    """Put back the current directory user code moved to: memprobe's relative paths (an
    ``--out`` given before the code ran) keep meaning what they meant."""
    try:
        cwd: str | None = os.getcwd()
    except OSError:  # run from a directory since removed: nothing to put back
        cwd = None
    try:
        yield
    finally:
        if cwd is not None:
            try:
                moved = os.getcwd() != cwd
            except OSError:  # the code removed the directory it moved to
                moved = True
            if moved:
                with contextlib.suppress(OSError):
                    os.chdir(cwd)


# The variables memprobe, and what it calls after user code (matplotlib as it is imported
# to draw, torch.distributed between a sweep's cases), read: as the user set them, not as
# user code left them.
MEMPROBE_READS = (
    "MPLBACKEND",
    # Where matplotlib keeps its config and font cache: set by a kernel to a path that cannot
    # be one, the report's first import of matplotlib printed its warnings on stderr.
    "MPLCONFIGDIR",
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "COLUMNS",
    "TMPDIR",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "GITHUB_STEP_SUMMARY",
    # How rich draws memprobe's own output: a kernel that set FORCE_COLOR (or TERM) drew a
    # sweep's table on a pipe in terminal escapes, rules a screen wide.
    "FORCE_COLOR",
    "NO_COLOR",
    "TERM",
    "COLORTERM",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "LINES",
)


@contextlib.contextmanager
def environment_kept() -> Iterator[None]:
    """Put back the variables of :data:`MEMPROBE_READS`, the umask, the recursion limit and
    the resource limits (:data:`_LIMITS`) user code changed: a step that set MPLBACKEND
    ended `profile --html` in matplotlib's traceback; a kernel that set WORLD_SIZE failed
    its sweep after the last case, "WORLD_SIZE='two' in the environment", a variable the
    user never set; a umask of 0o777 left memprobe's outputs unreadable (mode 000); a
    recursion limit of 60 failed every case after the kernel's, memprobe's own kernels too,
    and the report's template ended in a RecursionError. The code's other variables are its
    own, left as it set them.

    sys.path too: entries the code removed (``sys.path[:] = [...]``) are put back at its
    end, so that what memprobe imports later (torch._dynamo at the first autograd op,
    matplotlib to draw) is found: a sweep's report lost its plots without a word, and
    attribute --html ended in a ModuleNotFoundError. Entries it added stay, after memprobe's
    own (a kernel may import from them later): first, a module there named like one
    memprobe imports later (a matplotlib.py) was imported in its place, and the sweep's
    report ended in its traceback. sys.meta_path and sys.path_hooks: see
    :func:`memprobe.kernels.user_hooks.importers_kept`."""
    saved = {name: os.environ.get(name) for name in MEMPROBE_READS}
    handlers = _signal_handlers()
    umask = os.umask(0o077)  # read by setting; put back at once
    os.umask(umask)
    depth = sys.getrecursionlimit()
    path = list(sys.path)
    limits = _limits()
    try:
        yield
    finally:
        _put_back_limits(limits)
        os.umask(umask)
        sys.setrecursionlimit(depth)
        if not isinstance(sys.path, list):  # replaced by something else altogether
            sys.path = []
        sys.path.extend(entry for entry in path if entry not in sys.path)
        added = [entry for entry in sys.path if entry not in path]
        if added and sys.path[-len(added) :] != added:
            sys.path[:] = [entry for entry in sys.path if entry in path] + added
        for name, value in saved.items():
            if os.environ.get(name) != value:
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value
        _put_back_signal_handlers(handlers)


# The resource limits that decide whether memprobe's own work after user code can run: a
# kernel that set RLIMIT_FSIZE to 100 bytes failed the sweep at its first snapshot
# ("cannot write snapshot ... File too large"), with no word of the kernel; a CPU-time
# limit ended the process (SIGXCPU) in whatever memprobe ran then, and open files,
# address space, data and processes failed it alike. Only the soft limits: a hard limit
# user code lowered cannot be raised again by an unprivileged process.
_LIMITS = (
    "RLIMIT_CPU",
    "RLIMIT_FSIZE",
    "RLIMIT_NOFILE",
    "RLIMIT_AS",
    "RLIMIT_DATA",
    "RLIMIT_NPROC",
)


def _limits() -> dict[int, tuple[int, int]]:
    try:
        import resource
    except ImportError:  # not on Unix: no limits to change
        return {}
    kinds = (getattr(resource, name) for name in _LIMITS if hasattr(resource, name))
    return {kind: resource.getrlimit(kind) for kind in kinds}


def _put_back_limits(saved: dict[int, tuple[int, int]]) -> None:
    """The soft limits of :data:`_LIMITS` user code changed, put back (as far as the hard
    limit it left allows)."""
    import resource

    for kind, (soft, _) in saved.items():
        now_soft, hard = resource.getrlimit(kind)
        if now_soft != soft:
            if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft > hard):
                soft = hard
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(kind, (soft, hard))


# The signals whose handlers decide how memprobe's process ends or waits: Ctrl-C and
# torchrun's stop (SIGTERM), a closed terminal, a reader gone (SIGPIPE: Python ignores it,
# so a write raises and memprobe goes on quietly), and its children (SIGCHLD ignored, the
# kernel reaps them and a wait finds none). A module that set SIGINT to SIG_IGN as it was
# imported (a library's graceful shutdown) kept a sweep of ten cases from being stopped by
# Ctrl-C: it ran to its end and exited 0.
# The alarms too (SIGALRM, SIGVTALRM, SIGPROF): a timer user code set and left running (a
# guard it forgot to cancel, signal.alarm(1)) went off later in memprobe's own work: its
# default action ended the sweep with "Alarm clock", exit 142 and no word, and a handler
# the code had set raised its TimeoutError in whatever case ran then.
_KEPT_SIGNALS = tuple(
    getattr(signal, name)
    for name in (
        "SIGINT",
        "SIGTERM",
        "SIGHUP",
        "SIGPIPE",
        "SIGCHLD",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
    )  # fmt: skip
    if hasattr(signal, name)
)
_TIMERS = tuple(
    getattr(signal, name)
    for name in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
    if hasattr(signal, name)
)


# And the signals blocked: a kernel that blocked SIGINT and SIGTERM (pthread_sigmask, a
# critical section it never left) left memprobe deaf to Ctrl-C and to torchrun's stop.
_Signals = tuple[dict[int, Any], set[int], set[int]]


def _signal_handlers() -> _Signals:
    """The handlers of :data:`_KEPT_SIGNALS`, which of :data:`_TIMERS` are idle, and the
    signals this thread blocks."""
    idle = {timer for timer in _TIMERS if signal.getitimer(timer) == (0.0, 0.0)}
    handlers = {sig: signal.getsignal(sig) for sig in _KEPT_SIGNALS}
    return handlers, idle, set(signal.pthread_sigmask(signal.SIG_BLOCK, ()))


def _put_back_signal_handlers(saved: _Signals) -> None:
    """The handlers of :data:`_KEPT_SIGNALS` user code replaced, put back (None: one set
    outside Python, which cannot be put back from here), and a timer it started where
    none ran, stopped (one that ran before is whoever started it's: left as it is)."""
    handlers, idle, blocked = saved
    if set(signal.pthread_sigmask(signal.SIG_BLOCK, ())) != blocked:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    for timer in idle:
        with contextlib.suppress(OSError, ValueError):
            signal.setitimer(timer, 0)
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a handler; user code there could not either
    for sig, handler in handlers.items():
        if handler is not None and signal.getsignal(sig) != handler:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, handler)


@contextlib.contextmanager
def process_kept() -> Iterator[None]:
    """What user code starts does not take memprobe's process with it. A thread it starts
    is a daemon: one left running (a worker that never returns) kept memprobe from exiting
    after its answer, for ever. A child it forks (``os.fork()``) ends where the user code
    returns or raises, with that outcome's status, instead of running the rest of memprobe
    as well: a second answer on standard output, every output written twice."""
    pid = os.getpid()
    start = threading.Thread.start

    def start_as_daemon(thread: threading.Thread) -> None:
        thread.daemon = True
        USERS_THREADS.add(thread)  # it outlives the call: its os._exit ends it alone
        start(thread)

    threading.Thread.start = start_as_daemon  # type: ignore[method-assign,assignment]
    atexit.register, atexit.unregister = _register_shielded, _unregister_shielded
    try:
        yield
    finally:
        threading.Thread.start = start  # type: ignore[method-assign]
        atexit.register, atexit.unregister = _REGISTER, _UNREGISTER
        if os.getpid() != pid:
            os._exit(0 if sys.exc_info()[0] is None else 1)


# A function user code registers with atexit runs after memprobe's answer, as the process
# ends: what it printed (a library's "goodbye", a summary) went to standard output after
# `--json`'s object, no longer JSON. It runs with its output on standard error, as the code
# that registered it did. Its wrappers are kept by the function's identity, so that
# unregister() finds them all, as atexit's own does.
_SHIELDED: dict[int, list[Callable[[], None]]] = {}
_REGISTER, _UNREGISTER = atexit.register, atexit.unregister


def _register_shielded(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    @functools.wraps(fn)
    def shielded() -> None:
        try:
            with streams_kept(), _exits_raise():
                exits = fn is OS_EXIT or fn is exit_unless_users_thread
                (_exit_raising if exits else fn)(*args, **kwargs)
        except (Exception, SystemExit) as exc:
            # Python would print its traceback after memprobe's answer, and exit 0 all the
            # same: one line says whose function failed and how.
            name = getattr(fn, "__qualname__", None) or type(fn).__name__
            sys.stderr.write(
                f"memprobe: warning: {printable(str(name))[:200]}, registered with atexit by "
                f"user code, raised {exception_text(exc)} as the process ended\n"
            )

    _SHIELDED.setdefault(id(fn), []).append(shielded)
    _REGISTER(shielded)
    return fn


# os._exit in one (``atexit.register(os._exit, 0)``, or called by it) ended the process
# there with the code's status: a sweep's 0 read 7, a failed gate's 1 read 0 and CI passed.
# memprobe's status is its own: there, it raises SystemExit, said as the function's failure.
# (OS_EXIT is the real one: threads_kept may have put its own in os._exit.)


def _exit_raising(status: int = 0, *_: Any) -> None:
    raise SystemExit(f"os._exit({status!r}), not run: memprobe's exit status is its own")


@contextlib.contextmanager
def _exits_raise() -> Iterator[None]:
    before = os._exit
    os._exit = _exit_raising  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = before


def _unregister_shielded(fn: Callable[..., Any], /) -> None:
    for shielded in _SHIELDED.pop(id(fn), []):
        _UNREGISTER(shielded)
    _UNREGISTER(fn)


class _Shielded:
    """A stream lent to user code: what it writes goes to ``target``; closing it does not
    close memprobe's stream."""

    def __init__(self, target: TextIO) -> None:
        self._target = target

    def write(self, text: str) -> int:
        return self._target.write(text)

    def flush(self) -> None:
        self._target.flush()

    def close(self) -> None:
        self._target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


@contextlib.contextmanager
def streams_kept() -> Iterator[None]:
    """While user code runs, what it prints goes to standard error: standard output is
    memprobe's answer (``--json`` is read by programs). Whatever the code does to
    ``sys.stdout`` and ``sys.stderr`` (closes them, replaces them) is undone."""
    out, err = sys.stdout, sys.stderr
    if err is not None:
        sys.stdout = sys.stderr = cast(TextIO, _Shielded(err))
    try:
        with stderr_fd_kept(), stdout_fd_kept(out):
            yield
    finally:
        sys.stdout, sys.stderr = out, err


# Every standard library module memprobe imports, whose functions user code may replace
# (kept apart below), not a hand-picked few: pickle.dumps,
# platform.node, datetime.datetime or copy.deepcopy (dataclasses.asdict's) raising failed
# a sweep after its last case in a traceback, io.open raising for writes as "cannot write
# run/run.json", statistics.median raising failed memprobe's own rows on cpu; and
# torch.autograd's functions and the methods of torch.nn.Module and torch.autograd.Function
# (torch.autograd.grad raising failed every cpu row; nn.Module.__call__ raising failed
# `memprobe step`, blamed on config.json's sizes). tests/commands/
# test_hostile_inputs_round25_r25_code.py keeps this list complete.
STDLIB_CALLED = (
    "abc", "atexit", "base64", "bisect", "codecs", "collections", "collections.abc",
    "concurrent.futures", "contextlib", "copy", "dataclasses", "datetime",
    "difflib", "enum", "errno", "faulthandler", "fnmatch", "fractions", "functools", "gc",
    "hashlib", "importlib", "importlib.util", "inspect", "io", "itertools", "json", "logging",
    "math", "multiprocessing", "multiprocessing.connection",
    "multiprocessing.context", "multiprocessing.forkserver", "numbers", "operator", "os",
    "os.path", "pathlib", "pickle", "pickletools", "platform", "re", "resource", "shlex",
    "shutil", "signal", "socket",
    "stat", "statistics", "struct", "sys", "tempfile", "threading", "time", "tomllib",
    "types", "typing", "unicodedata", "warnings", "weakref", "xml.etree.ElementTree", "zlib",
)  # fmt: skip

# Functions of torch's that user code replaces (``torch.Tensor.float = ...``, a library's
# ``F.cross_entropy = fast_ce`` as it is imported): left in place, memprobe's own kernels
# ran the replacement in every case after the code's and its peaks were reported as
# theirs (unchunked read 64 KiB where it holds 112 KiB, ok). Each replacement is kept and
# swapped in only while user code runs, so the code sees its own and memprobe torch's.
# By (namespace, name): the namespace, torch's own value (_ABSENT: inherited, on
# torch.Tensor, from torch's C base), the code's.
# Python's builtins too: a module that replaced builtins.open (a sandbox, a file-access
# tracer that raised for paths not its own) ended the sweep in its PermissionError as
# memprobe wrote the report, after every case had run.
# And the functions of torch.nn and torch.optim, and of the standard library modules
# memprobe's own work calls (STDLIB_CALLED above): a kernel's module that replaced
# torch.optim.AdamW or torch.nn.Linear had `memprobe step` build memprobe's
# model with its class (a wrong peak, said as the model's); sys.exit = a no-op turned
# every error line's exit 2 into 0 (a CI gate passed); time.perf_counter = None failed
# memprobe's own kernels' rows; json.dumps replaced wrote its text as the sweep's --json
# output. Only what was callable: these namespaces' data (sys.stdout, os.environ,
# sys.path) have guards of their own.
_REPLACED: dict[tuple[int, str], tuple[Any, str, Any, Any]] = {}
_ABSENT = object()


def nothing_replaced() -> bool:
    """Whether no user code has left a torch function or builtin replaced."""
    return not _REPLACED


def differs(names: Mapping[str, Any], now: Mapping[str, Any], gone: object) -> bool:
    """Whether some name of ``names`` holds another object in ``now`` (``gone``: none), by
    identity. The check runs around every call into user code over dicts of thousands of
    names (torch's namespace, sys.modules): map and operator keep the loop in C (torch's
    namespace: 97 us against 164 us for the Python loop; modules_kept: 0.32 ms a call
    against 0.59 ms), and the Python loops run only where something changed."""
    return any(map(operator.is_not, names.values(), map(now.get, names, repeat(gone))))


@contextlib.contextmanager
def torch_functions_kept(theirs: bool = True) -> Iterator[None]:
    """Swap in what user code replaced of torch, torch.Tensor, torch.nn.functional and
    Python's builtins (and the functions of torch.nn, torch.optim and the standard library
    modules memprobe calls) while it runs (``theirs``: the code is the user's, not one of
    memprobe's kernels), and the own back when it returns. Names the code adds to a module
    stay (torch adds its submodules as they are imported); on torch.Tensor a name added
    shadows the C base's method, and is a replacement."""
    import builtins

    import torch

    functions = _function_owners()
    owners: tuple[Any, ...] = (torch, torch.Tensor, torch.nn.functional, builtins, *functions)
    if theirs:
        for owner, name, _, replacement in _REPLACED.values():
            setattr(owner, name, replacement)
    seen = [dict(vars(owner)) for owner in owners]
    try:
        yield
    finally:
        for owner, before in zip(owners, seen, strict=True):
            now = dict(vars(owner))
            names = now if owner is torch.Tensor else before
            if not differs(names, before if names is now else now, _ABSENT):
                continue
            for name in names:
                value = before.get(name, _ABSENT)
                if owner in functions and not _is_code(value):
                    continue
                if name in now and now[name] is not value:
                    own = _REPLACED.get((id(owner), name), (owner, name, value))[2]
                    _REPLACED[id(owner), name] = (owner, name, own, now[name])
        for owner, name, own, _ in _REPLACED.values():
            if own is _ABSENT:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, own)


@functools.cache
def _function_owners() -> tuple[Any, ...]:
    """The namespaces whose functions (and classes) only are kept: torch.nn's, torch.optim's,
    torch.autograd's, two torch classes' methods and :data:`STDLIB_CALLED`'s."""
    import importlib

    import torch.nn.functional
    import torch.optim

    torch_owners = (torch.nn, torch.optim, torch.autograd, torch.autograd.Function)
    stdlib = (importlib.import_module(name) for name in STDLIB_CALLED)
    return (*torch_owners, torch.nn.Module, *stdlib)


def _is_code(value: Any) -> bool:
    """A function, class or method of a namespace, not its data (a classmethod object, as
    torch.autograd.Function.apply is in the class's namespace, is not callable itself)."""
    return callable(value) or isinstance(value, (classmethod, staticmethod))
