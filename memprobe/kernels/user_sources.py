"""The files user code was read from: what no output of a command may replace, and what
a resumed sweep compares to know that it runs the same kernels."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from memprobe.kernels.user import is_import_path, resolve_user_kernel


def source_files(fn: object) -> list[Path]:
    """The file that defines ``fn`` (none for a builtin, or an object without one): an
    output of the command that runs it must not replace it."""
    try:
        source = inspect.getsourcefile(fn)  # type: ignore[arg-type]
    except TypeError:  # a builtin, or a callable object without a file
        source = None
    return [Path(source)] if source else []


def loaded_code_files(outputs: Iterable[str | os.PathLike[str] | None]) -> list[Path]:
    """The files of the modules this process has imported that bear an output's file name:
    inputs of the command as much as the step's or kernel's own file. `profile
    step:fn --out helper.py` replaced the helper module the step imported (at its import,
    or lazily as it ran) with a pickle; so would a kernel package's ``__init__.py``. Only
    files named as an output are resolved: there are thousands of modules."""
    names = {os.path.basename(os.fspath(o)) for o in outputs if o is not None}
    if not names:  # no output named: nothing of thousands of modules to look at
        return []
    files = []
    for module in list(sys.modules.values()):
        try:
            source = vars(module).get("__file__")
        except TypeError:  # an entry that is no module (a module replaced itself)
            continue
        if isinstance(source, str) and source.rpartition(os.sep)[2] in names:
            files.append(Path(source))
    return files


def kernel_source_digests(kernels: Iterable[str]) -> dict[str, str]:
    """A fingerprint (sha256) of the source file of each user kernel in ``kernels``, by
    import path, for run.json (a resume runs the same code): memprobe's own kernels are
    its version's, and a module made at run time has no file to read."""
    digests = {}
    for kernel in dict.fromkeys(kernels):
        files = kernel_source_files(kernel)
        with contextlib.suppress(OSError):
            if files:
                digests[kernel] = hashlib.sha256(
                    b"".join(f.read_bytes() for f in files)
                ).hexdigest()
    return digests


def kernel_source_files(name: str | None) -> list[Path]:
    """The source of a user's kernel named ``package.module:function`` (imported here, as
    the command would), none for memprobe's own: `step --kernel mine:k --out mine.py` and
    `attribute --what-if mine:k --html mine.py` replaced the kernel's code with the
    snapshot or the page."""
    if name is None or not is_import_path(name):
        return []
    return source_files(resolve_user_kernel(name).fn)
