"""Read a snapshot's stack frames: which is user code, which op allocated, which phase.

Frames come innermost first as ``{name, filename, line}``. Real files mix Python
frames with C++ ones (``line`` 0, filename ``??`` or a bare ``foo.cpp``), may hold
Python frames only, and may carry Windows paths. Everything here tolerates junk.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from memprobe.io.text import printable
from memprobe.records import Frame

_CPP_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu", ".cuh", ".c", ".h", ".hpp", ".so", ".s", ".asm")
# The C library and the thread machinery at the outer end of native stacks (glibc's
# ``clone3.S``, ``start_thread``): never the user's line, whatever path they carry.
_NATIVE_PATHS = re.compile(r"(?:^|/)(?:sysdeps|nptl|glibc[^/]*|libc[^/]*|csu)/")
_NATIVE_NAMES = re.compile(r"^(?:__)?(?:clone3?|start_thread|pthread_\w+|__libc_\w+|_start)$")
# "The user's line" is decided by folder, whatever the OS's path style: installed
# packages (site-packages, dist-packages), the standard library, torch and its
# compilers wherever they live, and memprobe's own harness are never it.
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/")
_TORCH_PARTS = ("/torch/", "/functorch/", "/torchgen/", "/triton/")
_STDLIB = re.compile(
    r"/lib/python\d[\d.]*/(?!site-packages/|dist-packages/)|/python\d*/lib/(?!site-packages/)"
)
# memprobe measures kernels from its own harness: the harness is internal, the
# kernels it ships are the code under measurement, so they count as the user's.
_MEMPROBE_KERNELS = "/memprobe/kernels/"
_MEMPROBE = re.compile(r"/memprobe/|/bin/memprobe$")
# Dispatch-mode and tensor-subclass hooks wrap an op wherever they are defined.
_HOOKS = frozenset({"__torch_dispatch__", "__torch_function__"})
_AUTOGRAD_BACKWARD_NAMES = frozenset({"backward", "_engine_run_backward", "grad", "run_backward"})
_CPP_BACKWARD = re.compile(r"torch::autograd::(Engine|.*Backward\d*::apply)|Backward\d+::apply")
_ATEN_OP = re.compile(r"at::_ops::(\w+)::(?:call|redispatch)|\b(aten::\w+)")
_AUTOGRAD_NODE = re.compile(r"(\w+Backward\d*)::apply")
# Code torch generates at run time: inductor's output modules (written under
# <tmp>/torchinductor_<user>/), fx graphs (``<eval_with_key>.N``), triton caches.
_GENERATED = re.compile(r"torchinductor_|/\.triton/|/_inductor/|^<eval_with_key|^<torch_package")
_LIBRARY_ROOT = re.compile(r"/(?:site|dist)-packages/([^/]+)")
_WRAPPER_NAMES = frozenset({"forward", "new_forward", "wrapper", "inner", "decorate_context"})
MAX_CHAIN = 3  # the user's line and at most two of its callers
# A path's separators, whatever the OS's style: split before escaping (an escape such as
# \u202e is a backslash too).
_SEPARATOR = re.compile(r"[\\/]")


# One Frame object per distinct (name, filename, line): real traces repeat the same few
# thousand frames across a million entries, and the per-frame questions below are
# cached on the Frame, so each distinct frame is judged once.
_FRAMES: dict[tuple[Any, Any, Any], Frame] = {}


def clean_frames(raw: Any) -> tuple[Frame, ...]:
    """Frames as records, innermost first; malformed entries get ``??`` / 0."""
    if not isinstance(raw, (list, tuple)):
        return ()
    out = []
    for f in raw:
        if not isinstance(f, dict):
            continue
        # Only strings and ints are read: a name that is a list (or a list nested a
        # thousand deep) is neither hashable nor safe to str(), so it reads as "??".
        key = (_text(f.get("name")), _text(f.get("filename")), _line(f.get("line")))
        frame = _FRAMES.get(key)
        if frame is None:
            # Escaped once per distinct frame: a tampered name's escape codes never print.
            base = printable(_SEPARATOR.split(key[1])[-1])
            frame = Frame(printable(key[0]), printable(key[1]), key[2], basename=base)
            _FRAMES[key] = frame
        out.append(frame)
    return tuple(out)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "??"


def _line(value: Any) -> int:
    # A line past 2**31 is no source line (and one of 5,000 digits cannot even be printed).
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if ok else 0


@functools.lru_cache(maxsize=1 << 16)
def normalized_path(filename: str) -> str:
    """Forward slashes, lower case: one spelling for every OS."""
    return filename.replace("\\", "/").lower()


@functools.lru_cache(maxsize=1 << 16)
def is_cpp(frame: Frame) -> bool:
    """A native frame: torch writes these with line 0 and a ``??`` or bare C++ filename."""
    name = frame.filename
    if frame.line == 0 or name in ("", "??"):
        return True
    lowered = name.lower()
    if _NATIVE_NAMES.match(frame.name) or _NATIVE_PATHS.search(lowered.replace("\\", "/")):
        return True
    if lowered.endswith(_CPP_SUFFIXES):
        return True
    return (
        "/" not in name
        and "\\" not in name
        and not lowered.endswith(".py")
        and not name.startswith("<")
    )


@functools.lru_cache(maxsize=1 << 16)
def is_internal(frame: Frame) -> bool:
    """True for frames that are not the user's code (see module notes)."""
    if is_cpp(frame) or frame.name in _HOOKS:
        return True
    path = normalized_path(frame.filename)
    if _GENERATED.search(path):
        return True
    if path.startswith("<"):
        # <stdin>, <ipython-input-…>, <string> are the user typing; the rest are runtime.
        return path.startswith(("<frozen", "<built-in", "<eval_with_key", "<torch"))
    if _MEMPROBE_KERNELS in path:
        return False
    if _MEMPROBE.search(path) or any(part in path for part in _LIBRARY_PARTS):
        return True
    if path.startswith("torch/") or any(part in path for part in _TORCH_PARTS):
        return True
    return bool(_STDLIB.search(path))


@functools.lru_cache(maxsize=1 << 16)
def library_of(frame: Frame) -> str | None:
    """The installed package a Python frame belongs to (``einops``), ``inductor-generated
    code`` for generated modules; None for torch itself, the stdlib, user code and C++."""
    if is_cpp(frame):
        return None
    path = normalized_path(frame.filename)
    if _GENERATED.search(path):
        return "generated code (torch.compile)"
    match = _LIBRARY_ROOT.search(path)
    if match is None:
        return None
    package = match.group(1).removesuffix(".py")
    return None if package in ("torch", "triton", "functorch", "torchgen") else package


def user_chain(frames: Sequence[Frame]) -> tuple[tuple[Frame, ...], tuple[str, ...]]:
    """(the user's line and up to two user callers, the libraries the call went through).

    ``via`` names each library between the allocation and the user's line, outermost
    first, by the function the call entered it through: ``einops.einsum``.
    """
    for i, frame in enumerate(frames):
        if not is_internal(frame):
            chain = [f for f in frames[i:] if not is_internal(f)][:MAX_CHAIN]
            return tuple(chain), _via(frames[:i])
    return (), _via(frames)


def call_site(
    frames: Sequence[Frame],
) -> tuple[tuple[Frame, ...], tuple[str, ...], Frame | None]:
    """(chain, via, kernel): :func:`user_chain`, except that a line inside memprobe's
    own kernels called from the user's code gives way to that call. The chain then
    starts at the user's line (the first frame outside memprobe) and ``kernel`` is the
    kernel's own line, named beside the op. A kernel memprobe's harness runs (a sweep,
    ``measure()``) is what is measured: its line stays the chain and ``kernel`` is None."""
    chain, via = user_chain(frames)
    if not chain or not is_own_kernel(chain[0]):
        return chain, via, None
    start = frames.index(chain[0])
    for i in range(start + 1, len(frames)):
        if _is_harness(frames[i]):
            break
        if not is_internal(frames[i]) and not is_own_kernel(frames[i]):
            outer, _ = user_chain(frames[i:])
            return outer, via, chain[0]
    return chain, via, None


@functools.lru_cache(maxsize=1 << 16)
def is_own_kernel(frame: Frame) -> bool:
    """A Python frame inside memprobe's own kernels (``memprobe/kernels/``)."""
    return not is_cpp(frame) and _MEMPROBE_KERNELS in normalized_path(frame.filename)


def _is_harness(frame: Frame) -> bool:
    """memprobe's own code other than its kernels (the sweep, ``measure``, the CLI)."""
    return not is_cpp(frame) and not is_own_kernel(frame) and _is_memprobe(frame)


@functools.lru_cache(maxsize=1 << 16)
def _is_memprobe(frame: Frame) -> bool:
    return bool(_MEMPROBE.search(normalized_path(frame.filename)))


def _via(inner: Sequence[Frame]) -> tuple[str, ...]:
    seen: dict[str, str] = {}
    # Outermost first: the frame nearest the user's line is where the user called in.
    for frame in reversed(inner):
        package = library_of(frame)
        if package and package not in seen:
            seen[package] = frame.name
    return tuple(p if p.startswith("generated") else f"{p}.{name}" for p, name in seen.items())[
        :MAX_CHAIN
    ]


def autograd_node(frames: Sequence[Frame]) -> str | None:
    """``LogSoftmaxBackward0`` from ``torch::autograd::generated::LogSoftmaxBackward0::apply``."""
    for frame in frames:
        if "Backward" in frame.name:
            found = _AUTOGRAD_NODE.search(frame.name)
            if found:
                return found.group(1)
    return None


def _torch_function(frame: Frame) -> str | None:
    """``.../torch/nn/functional.py`` + ``log_softmax`` → ``torch.nn.functional.log_softmax``."""
    path = normalized_path(frame.filename)
    start = path.rfind("/torch/")
    if start < 0 or not path.endswith(".py"):
        return None
    module = path[start + 1 : -3].replace("/", ".").removesuffix(".__init__")
    # Private modules (torch._dynamo, torch._compile) and autograd plumbing are
    # wrappers around the op, not the op.
    if "._" in module or module.startswith("torch.autograd") or frame.name.startswith("_"):
        return None
    return f"{module}.{frame.name}"


def op_from_frames(frames: Sequence[Frame]) -> str | None:
    """The operator that allocated, from the innermost frame that names one.

    C++ frames name it best (``at::_ops::_log_softmax::call`` → ``aten::_log_softmax``);
    an autograd node (``LogSoftmaxBackward0``) is next; a Python torch function last.
    """
    node = None
    python_fn = None
    for frame in frames:
        aten, frame_node, fn = _op_facts(frame)
        if aten:
            return aten
        node = node or frame_node
        python_fn = python_fn or fn
    return node or python_fn


@functools.lru_cache(maxsize=1 << 16)
def _op_facts(frame: Frame) -> tuple[str | None, str | None, str | None]:
    """(aten op, autograd node, Python torch/library function) one frame names."""
    if is_cpp(frame):
        match = _ATEN_OP.search(frame.name)
        if match:
            return match.group(2) or f"aten::{match.group(1)}", None, None
        found = _AUTOGRAD_NODE.search(frame.name) if "Backward" in frame.name else None
        return None, found.group(1) if found else None, None
    return None, None, _torch_function(frame) or _library_function(frame)


def _library_function(frame: Frame) -> str | None:
    """``einops.einsum`` for a Python-only stack that went through a library."""
    package = library_of(frame)
    if package is None or package.startswith("generated") or frame.name.startswith("_"):
        return None
    if frame.name in _WRAPPER_NAMES:  # module plumbing, not an operation
        return None
    return f"{package}.{frame.name}"


def phase_from_frames(frames: Sequence[Frame]) -> tuple[str | None, str]:
    """(phase, why): ``backward`` when any frame belongs to autograd's backward pass,
    ``optimizer`` for ``torch/optim``, ``forward`` otherwise, ``None`` with no frames."""
    if not frames:
        return None, "no frames recorded"
    optimizer = None
    for frame in frames:
        kind, reason = _phase_facts(frame)
        if kind == "backward":
            return kind, reason
        if kind == "optimizer" and optimizer is None:
            optimizer = reason
    if optimizer is not None:
        return "optimizer", optimizer
    return "forward", "no autograd backward frame on the stack"


@functools.lru_cache(maxsize=1 << 16)
def _phase_facts(frame: Frame) -> tuple[str | None, str]:
    if is_cpp(frame):
        if ("Backward" in frame.name or "Engine" in frame.name) and _CPP_BACKWARD.search(
            frame.name
        ):
            return "backward", f"allocated by the autograd engine ({frame.name[:60]})"
        return None, ""
    path = normalized_path(frame.filename)
    if "/torch/autograd/" in path and frame.name in _AUTOGRAD_BACKWARD_NAMES:
        return "backward", f"allocated under {frame.name}() in torch/autograd"
    if frame.name == "backward":
        return "backward", f"allocated under a backward() frame ({_short(frame)})"
    if "/torch/optim/" in path:
        return "optimizer", f"allocated under torch/optim ({_short(frame)})"
    return None, ""


def file_name(frame: Frame) -> str:
    """The name of the frame's file, without its folders (either OS's separator)."""
    return frame.basename or _SEPARATOR.split(frame.filename)[-1]


def _short(frame: Frame) -> str:
    return f"{file_name(frame)}:{frame.line}"


def describe_frame(frame: Frame | None) -> str:
    """``autograd_reference.py:24 in unchunked_logprobs`` (file name only, any OS)."""
    if frame is None:
        return "-"
    return f"{file_name(frame)}:{frame.line} in {frame.name}"


def in_kernel(kernel: Frame | None) -> str:
    """`` in memprobe's kernel (local_chunked.py:44 in _chunk_float32)`` after an op made
    there for the user's line (:func:`call_site`); empty without one."""
    return f" in memprobe's kernel ({describe_frame(kernel)})" if kernel else ""
