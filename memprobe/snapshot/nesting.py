"""Bound tuple nesting in a pickle before the C unpickler builds it.

The C unpickler builds nested containers without recursion, but a tuple that becomes a
dict key (or a set member) is hashed, and ``tuple.__hash__`` recurses in C with no depth
guard: a 2 MB file holding a million nested one-tuples as a key kills the process with a
segmentation fault (no error, no line). Lists and dicts are never hashed, and what reads
them later hits Python's recursion limit (an exception), so only tuples need bounding.

A real snapshot's tuples are pool ids, ``(0, 0)``: numbers, never other tuples. The scan
tokenizes the opcode stream exactly (so a byte inside a string or a number is never taken
for an opcode) with one regular expression that consumes runs of the opcodes real files
are made of, tuples of literal numbers included; any other tuple opcode might wrap a
tuple, and the file is refused when there are more of those than :data:`MAX_TUPLE_NESTING`
(nesting depth can only grow by one per such opcode). What the expression does not
consume (long strings, protocol 0 text opcodes) is stepped over in Python.
"""

from __future__ import annotations

import pickletools
import re
import struct

from memprobe.errors import UserError

# Far above any real file (whose tuples never nest) and far below the depth at which
# hashing overflows the C stack (about 150,000 levels in an 8 MiB stack).
MAX_TUPLE_NESTING = 1000

_TUPLE_OPS = frozenset(b"t\x85\x86\x87")
_STOP = ord(".")
# Opcodes whose argument pickletools does not size from the descriptor alone.
_TWO_LINES = frozenset(b"ci")  # GLOBAL, INST: module and name, one line each


def _alternatives(prefix: bytes, lengths: range) -> bytes:
    return re.escape(prefix) + b"(?:" + b"|".join(
        re.escape(bytes([n])) + (b".{%d}" % n if n else b"") for n in lengths
    ) + b")"  # fmt: skip


_NUMBER = b"(?:K.|M..|J....|N|\x88|\x89|G.{8}|" + _alternatives(b"\x8a", range(1, 10)) + b")"
# Ordered by how often real files use them: memo reads (BINGET, LONG_BINGET) are most of a
# snapshot's opcodes, then the containers, MARK and MEMOIZE.
_RUN = re.compile(
    b"(?:j....|h."
    + rb"|[\}\]\(uesa\x94\x81\x8f\x90\x91\)0ld]"
    # A run of numbers, and the tuple opcode that packs the last one, two or three of them
    # (a dict's value and the next key's numbers are one run: the opcode takes the last).
    + b"|" + _NUMBER + b"{3,}+\x87|" + _NUMBER + b"{2,}+\x86|" + _NUMBER + b"++\x85?"
    + b"|r....|q.|\x80.|\x95.{8}|"
    + _alternatives(b"\x8c", range(0, 64))
    + b")*+",
    re.DOTALL,
)  # fmt: skip


def _argument_sizes() -> dict[int, int]:
    """Opcode byte → its argument's length: n > 0 fixed, else pickletools' negative codes."""
    sizes: dict[int, int] = {}
    for op in pickletools.opcodes:
        sizes[ord(op.code.encode("latin-1"))] = op.arg.n if op.arg is not None else 0
    return sizes


_ARG = _argument_sizes()
_PREFIX = {
    pickletools.TAKEN_FROM_ARGUMENT1: ("<B", 1),
    pickletools.TAKEN_FROM_ARGUMENT4: ("<i", 4),
    pickletools.TAKEN_FROM_ARGUMENT4U: ("<I", 4),
    pickletools.TAKEN_FROM_ARGUMENT8U: ("<Q", 8),
}


def _step(data: bytes, pos: int) -> int:
    """The position after the opcode at ``pos``; -1 where the unpickler stops (or fails)."""
    op = data[pos]
    n = _ARG.get(op)
    if n is None or op == _STOP:
        return -1  # unknown opcode (the unpickler raises) or the end of the pickle
    if n >= 0:
        return pos + 1 + n
    if n == pickletools.UP_TO_NEWLINE:
        end = data.find(b"\n", pos + 1)
        if end >= 0 and op in _TWO_LINES:
            end = data.find(b"\n", end + 1)
        return -1 if end < 0 else end + 1
    fmt, width = _PREFIX[n]
    if pos + 1 + width > len(data):
        return -1
    (length,) = struct.unpack_from(fmt, data, pos + 1)
    return -1 if length < 0 else pos + 1 + width + length


def count_wrapping_tuples(data: bytes, limit: int = MAX_TUPLE_NESTING) -> tuple[int, int]:
    """Tuple opcodes that may wrap another tuple (counting stops past ``limit``), and the
    position where the unpickler would stop reading: its STOP, or where it would fail."""
    wrapping = 0
    pos, end = 0, len(data)
    while pos < end and wrapping <= limit:
        pos = _RUN.match(data, pos).end()  # type: ignore[union-attr]  # `*+` always matches
        if pos >= end:
            break
        if data[pos] in _TUPLE_OPS:
            wrapping += 1
        after = _step(data, pos)
        if after < 0:
            break
        pos = after
    return wrapping, pos


def check_tuple_nesting(data: bytes, source: str, hint: str) -> None:
    """Raise :class:`UserError` when ``data`` could hold tuples nested past the limit."""
    # Fast path: fewer tuple-opcode bytes anywhere (opcodes or not) than the limit.
    if sum(data.count(bytes([op])) for op in _TUPLE_OPS) <= MAX_TUPLE_NESTING:
        return
    if count_wrapping_tuples(data)[0] > MAX_TUPLE_NESTING:
        raise UserError(
            f"snapshot {source} holds more than {MAX_TUPLE_NESTING:,} tuples built from "
            "other objects (a CUDA snapshot's tuples hold numbers): nested that deep they "
            "would crash the unpickler",
            hint,
        )
