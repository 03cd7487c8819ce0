"""The one error type for user mistakes: the CLI prints it on one line and exits 2."""

from __future__ import annotations

import weakref


class UserError(Exception):
    """A mistake the user can fix: a bad flag, file, shape or config."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __reduce__(self) -> tuple[type[UserError], tuple[str, str]]:
        # Raised in a forked plan worker, it crosses back to the parent whole, hint too.
        return (type(self), (self.message, self.hint))

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class Unwind(BaseException):
    """memprobe's own unwinding of a run through code that is not memprobe's (another rank's
    failure stopping this one's case inside a user's kernel): a BaseException, so that no
    ``except Exception`` stops it, which the guard around user code lets pass as it is.

    Only one memprobe raised (:meth:`issued`): user code can import this class and raise it
    too, and one of its own passed the guard as memprobe's, ending a sweep, a plan or a
    profile in a traceback with exit status 1."""

    def issued(self) -> Unwind:
        """This unwinding, marked as memprobe's own (raise what this returns)."""
        _ISSUED.add(self)
        return self

    def is_issued(self) -> bool:
        return self in _ISSUED


_ISSUED: weakref.WeakSet[Unwind] = weakref.WeakSet()
