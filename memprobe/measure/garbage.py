"""Collecting what one step or case left, and only that: a garbage collection that
scans the objects made since it began, not every object the process holds."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator


class _CallersFreeze:
    """Whether objects were frozen (gc.freeze) by someone else as a body starts.

    CPython keeps no count of the frozen objects: gc.get_freeze_count walks them all (30 ms
    in a process that froze a few million, paid by each of a plan's many traces). So once
    a caller's freeze is seen, a marker is frozen with it: while the marker is not back
    among the oldest generation's objects (where an unfreeze puts everything), nothing was
    unfrozen since and the freeze need not be counted again.
    """

    def __init__(self) -> None:
        self._marker: list[object] | None = None

    def seen(self) -> bool:
        if self._marker is not None:
            marker = self._marker
            if not any(obj is marker for obj in gc.get_objects(generation=2)):
                return True
            self._marker = None
        return gc.get_freeze_count() > 0

    def mark(self) -> None:
        """Called before the freeze that keeps the caller's: the marker is frozen too."""
        self._marker = []


_callers_freeze = _CallersFreeze()


@contextlib.contextmanager
def young_collection() -> Iterator[Callable[[], int]]:
    """Within, a ``collect()`` that scans only the objects made since the block began:
    what was alive before is frozen meanwhile (a full collection scans torch's, pandas'
    and matplotlib's objects too: 0.16 s each time in a command's process, 0.26 s in a
    fresh one). A caller's own freeze is kept: unfreezing would undo it (there is no
    partial unfreeze), so then what was alive stays frozen too."""
    caller_froze = _callers_freeze.seen()
    if caller_froze:
        _callers_freeze.mark()
    gc.freeze()
    try:
        yield gc.collect
    finally:
        if not caller_froze:
            gc.unfreeze()


@contextlib.contextmanager
def garbage_collected_after() -> Iterator[None]:
    """Reference cycles the body left (autograd graphs held by closures) die at its end,
    as a training loop's next collection would free them; only the body's objects are
    scanned (:func:`young_collection`)."""
    with young_collection() as collect:
        yield
        collect()


def full_collection() -> None:
    """Collect every object, the frozen ones too. Where a caller had frozen objects,
    :func:`young_collection` leaves what was alive at each of its blocks frozen, so a
    reference cycle an earlier case made and a later case let go of is never collected by
    a plain ``gc.collect``: unfrozen for this collection, and everything alive frozen again
    after it (as the next young collection would)."""
    caller_froze = _callers_freeze.seen()
    if caller_froze:
        gc.unfreeze()
    try:
        gc.collect()
    finally:
        if caller_froze:
            _callers_freeze.mark()
            gc.freeze()
