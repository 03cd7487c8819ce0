"""memprobe's label on a trace entry: ``user_metadata`` text that survives into torch's format.

torch carries one free-form string per trace entry (set on CUDA with
``torch.cuda.memory._set_memory_metadata``). memprobe writes ``key=value`` words there
so that the case, phase, op, dtype and shape of each allocation survive a round trip
through a snapshot file, e.g.::

    memprobe case=unchunked-b1-... phase=backward op=aten.gather.default
        dtype=torch.float32 shape=1x20000x131072

(one line in the file; wrapped here).
"""

from __future__ import annotations

import re

from memprobe.io.text import printable

PREFIX = "memprobe"
_WORD = re.compile(r"(\w+)=(\S*)")


def _clean(value: object) -> str:
    # A value must stay one word, or parsing would split it.
    return re.sub(r"\s+", "_", str(value))


def op_words(op: str) -> str:
    """A labelled op as read: a label keeps one word per value, so ``input:_logits``
    (what the harness made for the kernel) reads ``input: logits``."""
    return "input: " + op[len("input:_") :] if op.startswith("input:_") else op


def format_label(
    *,
    case: str | None = None,
    phase: str | None = None,
    op: str | None = None,
    dtype: str | None = None,
    shape: tuple[int, ...] | None = None,
) -> str:
    words = [PREFIX]
    for key, value in (("case", case), ("phase", phase), ("op", op), ("dtype", dtype)):
        if value:
            words.append(f"{key}={_clean(value)}")
    if shape is not None:
        words.append("shape=" + ("x".join(str(int(d)) for d in shape) or "scalar"))
    return " ".join(words)


def parse_label(text: object) -> dict[str, str]:
    """``key=value`` words of any ``user_metadata`` string (empty dict when none)."""
    if not isinstance(text, str) or "=" not in text:
        return {}
    return {key: printable(value) for key, value in _WORD.findall(text) if value}


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``"1x20000x131072"`` → ``(1, 20000, 131072)``; ``""`` (a 0-d tensor) → ``()``."""
    if text is None:
        return None
    if text in ("", "scalar"):
        return ()
    parts = text.split("x")
    # ASCII digits only ("²".isdigit() is true), and no more than a 64-bit size needs.
    if not all(p.isascii() and p.isdigit() and len(p) <= 19 for p in parts):
        return None
    return tuple(int(p) for p in parts)


# Bytes per element of the dtypes a label names (torch's spelling, "torch." dropped).
_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "complex128": 16, "complex64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip


def label_bytes(dtype: str | None, shape: tuple[int, ...] | None) -> int | None:
    """The bytes of the tensor a label records (``dtype`` without "torch."), None when
    either is missing or the dtype is not one memprobe knows."""
    itemsize = _ITEMSIZE.get(dtype or "")
    if itemsize is None or shape is None:
        return None
    elements = 1
    for d in shape:
        elements *= d
    return elements * itemsize
