"""Read a snapshot's stack frames: which is user code, which op allocated, which phase.

Frames come innermost first as ``{name, filename, line}``. Real files mix Python
frames with C++ ones (``line`` 0, filename ``??`` or a bare ``foo.cpp``), may hold
Python frames only, and may carry Windows paths. Everything here tolerates junk.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from memprobe.records import Frame

_CPP_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu", ".cuh", ".c", ".h", ".hpp", ".so")
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


def clean_frames(raw: Any) -> tuple[Frame, ...]:
    """Frames as records, innermost first; malformed entries get ``??`` / 0."""
    if not isinstance(raw, (list, tuple)):
        return ()
    out = []
    for f in raw:
        if not isinstance(f, dict):
            continue
        line = f.get("line", 0)
        out.append(
            Frame(
                name=str(f.get("name", "??")),
                filename=str(f.get("filename", "??")),
                line=line if isinstance(line, int) and not isinstance(line, bool) else 0,
            )
        )
    return tuple(out)


def _path(filename: str) -> str:
    return filename.replace("\\", "/").lower()


def is_cpp(frame: Frame) -> bool:
    """A native frame: torch writes these with line 0 and a ``??`` or bare C++ filename."""
    name = frame.filename
    if frame.line == 0 or name in ("", "??"):
        return True
    lowered = name.lower()
    if lowered.endswith(_CPP_SUFFIXES):
        return True
    return (
        "/" not in name
        and "\\" not in name
        and not lowered.endswith(".py")
        and not name.startswith("<")
    )


def is_internal(frame: Frame) -> bool:
    """True for frames that are not the user's code (see module notes)."""
    if is_cpp(frame) or frame.name in _HOOKS:
        return True
    path = _path(frame.filename)
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


def first_user_frame(frames: Sequence[Frame]) -> Frame | None:
    for frame in frames:
        if not is_internal(frame):
            return frame
    return None


def _torch_function(frame: Frame) -> str | None:
    """``.../torch/nn/functional.py`` + ``log_softmax`` → ``torch.nn.functional.log_softmax``."""
    path = _path(frame.filename)
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
        match = _ATEN_OP.search(frame.name)
        if match:
            return match.group(2) or f"aten::{match.group(1)}"
        if node is None:
            found = _AUTOGRAD_NODE.search(frame.name)
            node = found.group(1) if found else None
        if python_fn is None and not is_cpp(frame):
            python_fn = _torch_function(frame)
    return node or python_fn


def phase_from_frames(frames: Sequence[Frame]) -> tuple[str | None, str]:
    """(phase, why): ``backward`` when any frame belongs to autograd's backward pass,
    ``optimizer`` for ``torch/optim``, ``forward`` otherwise, ``None`` with no frames."""
    if not frames:
        return None, "no frames recorded"
    optimizer = None
    for frame in frames:
        path = _path(frame.filename)
        if "/torch/autograd/" in path and frame.name in _AUTOGRAD_BACKWARD_NAMES:
            return "backward", f"allocated under {frame.name}() in torch/autograd"
        if frame.name == "backward" and not is_cpp(frame):
            return "backward", f"allocated under a backward() frame ({_short(frame)})"
        if is_cpp(frame) and _CPP_BACKWARD.search(frame.name):
            return "backward", f"allocated by the autograd engine ({frame.name[:60]})"
        if optimizer is None and "/torch/optim/" in path:
            optimizer = frame
    if optimizer is not None:
        return "optimizer", f"allocated under torch/optim ({_short(optimizer)})"
    return "forward", "no autograd backward frame on the stack"


def _short(frame: Frame) -> str:
    return f"{_path(frame.filename).rsplit('/', 1)[-1]}:{frame.line}"


def describe_frame(frame: Frame | None) -> str:
    """``autograd_reference.py:24 in unchunked_logprobs`` (file name only, any OS)."""
    if frame is None:
        return "-"
    return f"{frame.filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{frame.line} in {frame.name}"
