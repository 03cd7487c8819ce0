"""Byte sizes: parse what users type, format what memprobe prints."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from memprobe.errors import UserError
from memprobe.io.text import quoted

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
# Digits with optional "_" or "," thousands separators (commas only in groups of
# three, so a decimal comma such as "1,5" is refused rather than read as 15),
# then an optional decimal point part.
_SIZE = re.compile(
    r"^\s*((?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9][0-9_]*)(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$"
)


# Results hold sizes as signed 64-bit numbers; nothing larger is a memory size.
MAX_SIZE = 2**63 - 1


def _too_big(what: str, value: object) -> UserError:
    shown = (
        repr(value)
        if len(repr(value)) <= 40
        else f"{repr(value)[:20]}… ({len(repr(value))} characters)"
    )
    return UserError(
        f"{what} {shown} is beyond the largest size memprobe handles (8 EiB)", "write e.g. 80GiB"
    )


def parse_size(value: str | int | float, *, what: str = "size", least: str = "zero or more") -> int:
    """``"10.3 GiB"``, ``"11000 MB"``, ``"123"`` or a number → bytes (at most :data:`MAX_SIZE`).
    ``least`` names the sizes the caller takes in a negative size's hint (a budget: more
    than 0 bytes)."""
    # A budget refuses 0 too: its negative value was told "give a size of zero or more".
    negative = f"give a size of {least}, e.g. 80GiB"
    if isinstance(value, bool):
        raise UserError(f"{what} {quoted(value)} is not a size", "write e.g. 10.3 GiB or 11000 MB")
    if isinstance(value, int) and value > MAX_SIZE:
        raise _too_big(what, value)
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise UserError(f"{what} {quoted(value)} is not a finite size", "write e.g. 10.3 GiB")
        if value > MAX_SIZE:
            raise _too_big(what, value)
        if value < 0:
            raise UserError(f"{what} {quoted(value)} is negative", negative)
        return _whole_bytes(value, what, value, bare=True)
    text = str(value)
    signed = text.strip().startswith("-")
    if signed:
        # "-0" and "-0 GiB" are zero, not negative; "-x" is not a size at all.
        text = text.strip()[1:]
    if re.match(r"^\s*[0-9]+,[0-9]{1,2}(?![0-9])", text):
        raise UserError(
            f"{what} {quoted(value)}: a comma is not a decimal point", "write e.g. 1.5 GiB"
        )
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise UserError(
            f"{what} {quoted(value)} is not a size",
            "write bytes or a number with B, KB, MB, GB, TB, KiB, MiB, GiB, TiB",
        )
    number = _exact(match.group(1).replace("_", "").replace(",", "")) * _UNITS[unit]
    if signed and number:
        raise UserError(f"{what} {quoted(value)} is negative", negative)
    if not number <= MAX_SIZE:
        raise _too_big(what, value)
    if _UNITS[unit] == 1 and number.denominator != 1:
        raise _whole_bytes_error(what, value, bare=not unit)
    return int(number)  # a fraction of a byte (10.3 GiB) rounds down, as before


def _exact(digits: str) -> Fraction:
    """The decimal as written, exactly: in floats "8.2GB" was 8,199,999,999 bytes and
    "1.005KB" 1,004 (a gate's max_peak failed a peak of exactly 8.2 GB "over by 1 B"), and
    a byte count past 2^53 lost its last digits. Bounded however long the text: a whole
    part past 24 digits is past every size, and fraction digits past the 64th (below
    10^-52 of a byte in any unit) only say whether a count of bytes is whole."""
    whole, _, fraction = digits.partition(".")
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    if len(whole) > 24:
        return Fraction(MAX_SIZE + 1)
    exact = Fraction(f"{whole}.{fraction[:64] or '0'}")
    # A nonzero digit past those read keeps the number off a whole count of bytes.
    return exact + Fraction(1, 10**70) if len(fraction) > 64 else exact


def _whole_bytes(number: float, what: str, value: object, *, bare: bool) -> int:
    """A count of bytes, which has no fraction: ``1.5`` (no unit, so bytes) was read as 1
    and ``0.5`` as 0, where the user likely meant a unit they left out."""
    if number != int(number):
        raise _whole_bytes_error(what, value, bare=bare)
    return int(number)


def _whole_bytes_error(what: str, value: object, *, bare: bool) -> UserError:
    said = " (a size without a unit is bytes)" if bare else ""
    return UserError(
        f"{what} {quoted(value)} is not a whole number of bytes{said}",
        "give a unit, e.g. 1.5GiB",
    )


def parse_budget(value: str | int | float, *, what: str = "--budget") -> int:
    """A memory budget: a size (:func:`parse_size`) of more than 0 bytes. Nothing fits
    in none, so a zero budget is a mistake in every command that takes one."""
    budget = parse_size(value, what=what, least="more than 0 bytes")
    if budget <= 0:
        raise UserError(
            f"{what} {quoted(value)} must be more than 0 bytes",
            "it is 0 bytes; e.g. --budget 80GiB",
        )
    return budget


def format_bytes(n: float | int | None) -> str:
    """Binary units with two decimals and thousands separators: ``34.18 GiB``."""
    if n is None:
        return "-"
    n = float(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def gib(n: float | int) -> float:
    return float(n) / 2**30
