"""Parsing of comma-list flags into typed values, with one-line errors."""

from __future__ import annotations

from memprobe.errors import UserError


def int_list(text: str, flag: str, *, allow_none: bool = False) -> list[int | None]:
    """``"1024,2048"`` → ``[1024, 2048]``; every item a positive integer."""
    values: list[int | None] = []
    for item in text.split(","):
        item = item.strip().replace("_", "")
        if allow_none and item.lower() == "none":
            values.append(None)
            continue
        try:
            value = int(item)
        except ValueError:
            raise UserError(
                f"{flag} {text!r}: {item!r} is not a whole number", f"e.g. {flag} 1024,2048"
            ) from None
        if value <= 0:
            raise UserError(f"{flag} {text!r}: {value} must be positive", f"e.g. {flag} 1024,2048")
        values.append(value)
    return values


def positive_ints(text: str, flag: str) -> list[int]:
    return [v for v in int_list(text, flag) if v is not None]


def name_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]
