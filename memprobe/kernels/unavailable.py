"""The error a kernel raises when the installed torch cannot run it."""

from __future__ import annotations


class KernelUnavailable(NotImplementedError):
    """This kernel needs something the installed torch lacks (an API, a device).

    Raised before any allocation. A sweep records the case as ``skipped`` with
    ``str(exc)`` as its note instead of failing; nothing is wrong with the
    inputs.
    """
