"""Write a file whole or not at all (a reader never sees half of it); read only regular
files, and no more of them than a cap."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, what: str = "") -> Path:
    """Write ``data`` to a temporary file beside ``path``, then move it into place.

    An interrupted write leaves the old file (or none) intact. A file system
    error is a :class:`UserError` naming the file.
    """
    target = Path(path)
    label = f"{what} {target}" if what else str(target)
    _refuse_special(target, label)
    if target.is_symlink():
        # Through the link, to the file it names: moved onto the link itself, the write
        # replaced the link with a file of its own (`--out /dev/stdout` run as root, its
        # stdout a file, swapped the system's /dev/stdout link for a snapshot).
        target = Path(os.path.realpath(target))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _new_beside(target)
    except OSError as exc:
        raise UserError(
            f"cannot write {label}: {exc.strerror or exc}", "choose another path"
        ) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            # A name from a file name that is not UTF-8 (`--out $'r\xff'`, any name under
            # LC_ALL=C) holds lone surrogates: written as their escapes, the page stays
            # UTF-8 (strict encoding raised, a traceback after the run was made).
            fh.write(data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data)
        # Made private (0600) until whole; give it the usual permissions.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserError(
                f"cannot write {label}: {exc.strerror or exc}", "choose another path"
            ) from None
        raise
    return target


def _new_beside(target: Path) -> tuple[int, str]:
    """A new, private file in ``target``'s folder, open for writing, and its path, named
    as relatively as ``target`` is. tempfile.mkstemp names its file by an absolute path,
    which a current directory deeper than PATH_MAX (4,096 bytes) cannot open: `report run`
    there was refused "cannot write run/peak_breakdown.png: File name too long", a path of
    22 characters that the file system takes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        tmp = str(target.parent / f".{target.name}.{os.urandom(4).hex()}.tmp")
        try:
            return os.open(tmp, flags | getattr(os, "O_CLOEXEC", 0), 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")


def leads_out(file: Path, home: Path) -> bool:
    """Whether ``file`` is a link to somewhere outside the folder ``home``: a write goes
    through a link, to the file it names."""
    inside = Path(os.path.realpath(home)) in Path(os.path.realpath(file)).parents
    return file.is_symlink() and not inside


def check_output_file(path: str | os.PathLike[str], *, what: str) -> None:
    """:func:`write_atomic`'s refusal of a folder, device, FIFO or socket at ``path``,
    made before a command's work: a step or plan that runs for minutes otherwise failed
    only at its last line, when it wrote. ``what`` is the name write_atomic is given."""
    target = Path(path)
    _refuse_special(target, f"{what} {target}")


def _refuse_special(target: Path, label: str) -> None:
    """A device, FIFO, socket or folder at ``target`` is never replaced: moving a file
    onto it would swap a device node (``--out /dev/null`` run as root) for a file."""
    try:
        mode = os.stat(target).st_mode  # a link is judged by what it points to
    except OSError:
        # Nothing there yet (or a dangling link): the write makes a file, unless a file
        # stands where one of its folders goes.
        blocked = file_in_the_way(target)
        if blocked is not None:
            raise UserError(
                f"cannot write {label}: {blocked} is a file, not a folder",
                "choose another path, or move that file",
            ) from None
        return
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        hint = "name a file inside it" if stat.S_ISDIR(mode) else "give a path for a regular file"
        raise UserError(f"cannot write {label}: it is {kind}, not a regular file", hint)


def file_in_the_way(target: Path) -> Path | None:
    """The nearest existing folder of ``target``'s when it is not a folder (a file, a
    device): making the folders below it failed with the words of whichever call hit it
    first, "File exists" (mkdir's, of a file that is no folder) or "Not a directory"."""
    for parent in target.parents:
        try:
            mode = os.stat(parent).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # made by the write, or below the file this looks for
        except OSError:
            return None  # a loop of links, a folder not searchable: the write says so
        return None if stat.S_ISDIR(mode) else parent
    return None


def refuse_non_folder(path: Path, what: str, hint: str) -> None:
    """A folder to make at ``path`` (a run directory) where a file stands, or a link that
    leads to nothing (a loop of links, a missing target): mkdir failed at the link, and a
    sweep said the run "already exists", to be continued with --resume."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{path} is a file, not {what}", hint)
    if path.is_symlink() and not path.exists():
        raise UserError(
            f"{path} is a link to {os.readlink(path)}, which leads to no folder "
            "(it is missing, or a loop of links)",
            f"point the link at a folder, or {hint}",
        )


def guard_outputs(
    outputs: Mapping[str, str | os.PathLike[str] | None],
    inputs: Iterable[str | os.PathLike[str]],
    *,
    may_replace: Mapping[str, Iterable[str | os.PathLike[str]]] | None = None,
) -> None:
    """The one check every command makes before it writes: no output (``flag`` → path)
    is an input of the command or lies inside an input folder, and no two outputs are
    the same file. ``may_replace`` names the inputs an output is meant to replace (the
    baseline ``--update-baseline`` rewrites). Raises :class:`UserError` naming both."""
    given = {flag: Path(path) for flag, path in outputs.items() if path is not None}
    sources = [Path(source) for source in inputs]
    seen: dict[Path, str] = {}
    for flag, path in given.items():
        target = resolved_path(path, flag)
        allowed = {resolved_path(a, flag) for a in (may_replace or {}).get(flag, ())}
        for source in sources:
            resolved = resolved_path(source, "input")
            if resolved in allowed:
                continue
            if target == resolved or (source.is_dir() and resolved in target.parents):
                # An input that is a link is named with where it leads: "run/snapshots"
                # alone reads as a folder the output is nowhere near.
                shown = f"{source} (a link to {resolved})" if source.is_symlink() else source
                verb = "overwrite" if target == resolved else "write inside"
                raise UserError(
                    f"{flag} {path} would {verb} {shown}, an input of this command",
                    "choose another path",
                )
        if target in seen:
            raise UserError(
                f"{seen[target]} and {flag} both name {path}: one would silently replace the other",
                "give each output its own path",
            )
        seen[target] = flag


def resolved_path(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` made absolute with every link followed, as ``Path.resolve`` does, or a
    :class:`UserError` naming it: a link to itself (``ln -s x x``) or a loop of links
    has no end to follow (``resolve`` raises RuntimeError on Python < 3.13)."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "a loop of links"
        raise UserError(
            f"{what} {path} cannot be followed: {reason}", "give a path that is not a link loop"
        ) from None


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_regular(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int,
    too_big: str = "check that this is the right file",
) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``max_bytes``.

    A FIFO, a device (``/dev/zero``) or a directory is refused by what ``fstat`` says of
    the opened file, before a byte is read: reading one would hang, or never end. The
    file is opened non-blocking (opening a FIFO otherwise waits for a writer) and read by
    its real size, so a small file costs no more memory than its size.
    """
    p = Path(path)
    label = f"{what} {p}"
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise UserError(f"{label} does not exist", "check the path") from None
    except OSError as exc:
        raise UserError(f"cannot read {label}: {exc.strerror or exc}", "check the path") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
            hint = "pass a file inside it" if stat.S_ISDIR(info.st_mode) else "give a regular file"
            raise UserError(f"{label} is {kind}, not a regular file", hint)
        if info.st_size > max_bytes:
            size, cap = format_bytes(info.st_size), format_bytes(max_bytes)
            raise UserError(f"{label} is {size}, over the {cap} limit", too_big)
        if info.st_size == 0:
            # A file system may not know a file's size before it is read: procfs and sysfs
            # say 0 for every file (/proc/self/cmdline holds bytes), as some FUSE mounts do.
            # Taken at its word, such a file was "empty (0 bytes)". Read it to its end.
            data = _read_to_end(fd, max_bytes + 1)
            if len(data) > max_bytes:
                cap = format_bytes(max_bytes)
                raise UserError(f"{label} is over the {cap} limit", too_big)
            return data
        return _read_all(fd, info.st_size)
    except OSError as exc:
        raise UserError(f"cannot read {label}: {exc.strerror or exc}", "check the file") from None
    finally:
        os.close(fd)


def _read_all(fd: int, size: int) -> bytes:
    data = os.read(fd, size)
    while len(data) < size:  # one read() stops short of 2 GiB on Linux
        more = os.read(fd, size - len(data))
        if not more:  # the file shrank while read: what is left is what it holds
            break
        data += more
    return data


def _read_to_end(fd: int, limit: int) -> bytes:
    """What ``fd`` holds up to ``limit`` bytes, read until the file ends."""
    parts: list[bytes] = []
    got = 0
    while got < limit:
        more = os.read(fd, min(1 << 20, limit - got))
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
