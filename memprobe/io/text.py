"""Text from files memprobe did not write, made safe to print.

A frame name, a kernel name or a label in a tampered file can hold terminal escape
sequences (an OSC title, a cursor move), BEL, NUL, a carriage return that overwrites the
line before it, a newline that forges a line of its own ("FAKE: all checks passed"), or
a lone surrogate that no terminal encoding can write. Each such character is shown as
its Python escape instead (``\\x1b``, ``\\n``, ``\\ud800``): visible, inert, one line.
"""

from __future__ import annotations

import codecs
import datetime
import re
import shlex
import unicodedata
from typing import Any


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every non-printable character (controls, line and paragraph
    separators, lone surrogates) replaced by its escape; printable text is returned as is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


# Letters of the scripts whose letters look like Latin ones (Cyrillic 'е' and 'с', Greek
# 'ο'), and a word: a run of letters.
_LOOKALIKE_SCRIPTS = ("CYRILLIC ", "GREEK ")
_WORD = re.compile(r"[^\W\d_]+")


def lookalikes_shown(text: str) -> str:
    """``text`` with each Cyrillic or Greek letter inside a word of Latin letters shown as
    its escape. One pasted from a page or typed on another keyboard layout (the 'е' of
    `Truе`, the 'с' of `unсhunked`) looks like the letter it stands in for, so a refusal
    ("takes True or False, not 'Truе'", "unknown kernel 'unсhunked' (did you mean
    'unchunked'?)") read as contradicting itself. A word in one script is its own."""
    if text.isascii():
        return text

    def shown(match: re.Match[str]) -> str:
        word = match.group()
        if word.isascii() or not any(c.isascii() for c in word):
            return word
        return "".join(_escape(c) if _lookalike(c) else c for c in word)

    return _WORD.sub(shown, text)


def _lookalike(char: str) -> bool:
    return unicodedata.name(char, "").startswith(_LOOKALIKE_SCRIPTS)


def foreign_digit(text: str) -> str | None:
    """The first digit of ``text`` outside 0-9, named (``'৪' (U+09EA BENGALI DIGIT
    FOUR)``), or None. Python's int() and float() read any script's decimal digits, so
    ``--tokens ৪096`` ran 4,096 tokens where the text reads 8096 to most eyes, while a
    size (``--budget ৪0GiB``) is refused: a number is written in 0-9 everywhere."""
    if text.isascii():
        return None
    for char in text:
        if char.isdecimal() and not char.isascii():
            return f"{char!r} (U+{ord(char):04X} {unicodedata.name(char, 'a digit')})"
    return None


def printable_lines(text: str) -> str:
    """Whole output text: the same escapes, except for the newlines that end its lines."""
    if text.isprintable():
        return text
    return "\n".join(printable(line) for line in text.split("\n"))


def exception_text(
    exc: BaseException, *, limit: int = 200, name: bool = True, first_line: bool = False
) -> str:
    """``Type: message`` of an exception raised by code memprobe does not own, on one
    printable line of at most ``limit`` characters (its message's lines joined, or only the
    first with ``first_line``). Its message is the code's too: a ``__str__`` that raises is
    said so, not raised again."""
    try:
        message = str(exc)
    except KeyboardInterrupt:  # Ctrl-C as the message was read still stops memprobe
        raise
    except BaseException:
        # The __str__ is the code's too: one that called sys.exit(7) (or raised another
        # BaseException) ended memprobe with status 7 and nothing printed.
        message = "(its message could not be read: its __str__ raised)"
    if first_line:
        message = message.strip().split("\n", 1)[0]
    text = printable(" ".join(message.split()))
    if name:
        kind = printable(type(exc).__name__)
        text = f"{kind}: {text}" if text else kind
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quoted(value: Any, limit: int = 60) -> str:
    """A value read from a file as a one-line message quotes it: its ``repr``, printable,
    at most ``limit`` characters. Quoted whole, a key or value of a megabyte (a TOML
    string, a kernel name) made the one line a megabyte long."""
    if isinstance(value, (datetime.date, datetime.time)):  # a datetime is a date
        # A TOML date or time (`max_peak = 1979-05-27`, a value TOML parses where a size
        # was meant) as the file spells it, not as Python's datetime.date(1979, 5, 27).
        return shortened(value.isoformat(), limit)
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4,300 digits has no repr
        return f"(an integer of {value.bit_length():,} bits)"
    except RecursionError:  # lists in lists, as deep as the JSON parser went
        return f"(a {type(value).__name__} nested too deep to show)"
    except KeyboardInterrupt:
        raise
    except BaseException:  # a user's object (what a step passed to sys.exit) whose repr raised
        return f"(a {printable(type(value).__name__)} whose repr raised)"
    return shortened(printable(text), limit)


def shortened(text: str, limit: int = 60) -> str:
    """``text`` cut to at most ``limit`` characters, ``...`` saying where it was cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


# A refusal echoes what the user typed: a flag's value (a list, a kernel name, a
# percentage, allocator settings), an extra argument, a path. Typed or pasted whole, a
# value of kilobytes (a list generated by a script, a file's text in $(...)) made the one
# line as long, twice over where the list and its item were both named. A word (no
# blank inside) longer than any path a person types is shown by its two ends, which is
# where a path's directory and file name are.
WORD_LIMIT = 400
_WORD_END = 150
_LONG_WORD = re.compile(rf"\S{{{WORD_LIMIT + 1},}}")


def long_words_clipped(line: str) -> str:
    """``line`` with each word past :data:`WORD_LIMIT` characters cut to its two ends
    and its length (``'99999…99999' (5,002 characters)``)."""
    if len(line) <= WORD_LIMIT:  # the common case: nothing to look for
        return line
    return _LONG_WORD.sub(
        lambda m: f"{m[0][:_WORD_END]}…{m[0][-_WORD_END:]} ({len(m[0]):,} characters)", line
    )


def utf8_text(data: bytes) -> str:
    """A file's bytes as UTF-8 text, read past a byte order mark (Windows editors save
    one; it is no character of the text). A byte that is not UTF-8 raises
    UnicodeDecodeError at its offset in ``data``, the mark counted: "utf-8-sig" counts
    from after it, and the message named the byte three places on."""
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnicodeDecodeError(
            exc.encoding, data, exc.start + start, exc.end + start, exc.reason
        ) from None


# What a file that is no text at all starts with, when it is a file memprobe (or torch)
# reads elsewhere: named, a snapshot handed as a config or results was "not UTF-8 text
# (byte 0x80 at offset 0)" with the hint to save it as UTF-8.
_BINARY_KINDS = (
    (b"\x80", "a pickle (a memory snapshot?)"),  # PROTO: every protocol >= 2 pickle
    (b"\x1f\x8b", "gzip-compressed"),
    (b"PK\x03\x04", "a zip archive"),
)


def binary_kind(data: bytes) -> str | None:
    """What a file that is not text is, by its first bytes (see :data:`_BINARY_KINDS`),
    or None when it does not start like one of them."""
    return next((kind for magic, kind in _BINARY_KINDS if data.startswith(magic)), None)


def json_error(exc: Any) -> str:
    """Where and why a ``json.JSONDecodeError`` stopped, as one phrase. Its message may end
    in "at" ("Unterminated string starting at"), which, joined to "at line", read
    "starting at at line 74"."""
    msg = exc.msg.removesuffix(" at").removesuffix(":")
    return f"{msg} at line {exc.lineno:,} column {exc.colno:,}"


class DuplicateKey(ValueError):
    """A JSON object that gives one key twice. json keeps the last without a word, so a
    config.json edited by appending ``"hidden_size": 4096`` (or two merged) built a model
    of the second size where the file also said the first; the reader refuses it instead."""

    def __init__(self, key: str) -> None:
        super().__init__(f"gives the key {quoted(key)} twice in one object")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json.loads``: the object, or DuplicateKey."""
    made: dict[str, Any] = {}
    for key, value in pairs:
        if key in made:
            raise DuplicateKey(key)
        made[key] = value
    return made


def shell_word(path: Any) -> str:
    """``path`` as one shell word, for a hint that is a command to type: ``--resume my run``
    is two words (and ``it's`` opens a quote), so the hint did not run as printed."""
    return shlex.quote(str(path))
