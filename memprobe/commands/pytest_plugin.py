"""pytest marker ``limit_peak_memory``: fail a test whose torch tensors peak above a limit.

    @pytest.mark.limit_peak_memory("10.5 GiB", device="meta")
    def test_logprob_step_fits(): ...

What pytest-memray's ``limit_memory`` does for host memory, for tensor memory:

* ``device="meta"`` (default): the body runs under a meta default device, so
  every tensor it creates without an explicit ``device=`` is a meta tensor:
  shapes, dtypes and autograd run, no real memory is used, and memprobe's
  storage-level ``AllocationTracker`` records the exact simulated peak. The
  failure lists the largest blocks live at the peak (size, dtype, shape, op,
  where it was made). A body that reads values (``.item()``, ``print(t)``,
  comparisons on data) or names ``device="cpu"`` explicitly does not simulate.
* ``device="cpu"``: the same tracker over real CPU tensors.
* ``device="cuda"``: the CUDA allocator's peak (``max_memory_allocated``)
  over the test body, minus what was allocated before it. Without CUDA the
  test errors: the CPU build of torch answers 0, which would always pass.

Registered through the ``pytest11`` entry point, so it is active wherever
memprobe is installed. This module imports torch only when a marked test runs:
every pytest start-up in such an environment imports this file.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes, parse_size
from memprobe.records import DEVICES

if TYPE_CHECKING:
    from memprobe.records import Event

MARKER = "limit_peak_memory"
# pytest.fail as this plugin was loaded, before any test body: a body that replaced it
# (monkeypatch.setattr(pytest, "fail", ...), undone only at teardown) turned the verdict
# over its limit into a no-op, and a 1 MiB body passed a 1 KiB limit.
_fail = pytest.fail
BLOCKS_SHOWN = 5


@dataclass(frozen=True)
class PeakLimit:
    limit: int  # bytes
    device: str


_LIMIT = pytest.StashKey["PeakLimit | None"]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(limit, device='meta'): fail when the torch tensor memory the test body "
        "allocates peaks above limit (bytes, '10.5 GiB', '11000 MB'); device meta or cpu "
        "tracks tensor storages (and lists the blocks live at the peak), cuda reads the "
        "CUDA allocator.",
    )


def parse_marker(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> PeakLimit:
    """The marker's arguments → PeakLimit, or UserError saying what is wrong."""
    kwargs = dict(kwargs)
    positional = list(args)
    if len(positional) > 2:
        raise UserError(f"takes at most 2 arguments (limit, device), got {len(positional)}")
    if positional:
        if "limit" in kwargs:
            raise UserError("limit given twice")
        kwargs["limit"] = positional.pop(0)
    if positional:
        if "device" in kwargs:
            raise UserError("device given twice")
        kwargs["device"] = positional.pop(0)
    unknown = sorted(set(kwargs) - {"limit", "device"})
    if unknown:
        raise UserError(f"unknown argument {unknown[0]!r}", "use limit and device")
    if "limit" not in kwargs:
        raise UserError("no limit given", f'write @pytest.mark.{MARKER}("10.5 GiB")')
    device = _plain(kwargs.get("device", "meta"))
    # torch.device("meta") names a device as well as "meta" does (it was "unknown device
    # device(type='meta')"); torch.device("cuda:1") still is not one of DEVICES.
    if not isinstance(device, str):
        import torch

        device = str(device) if isinstance(device, torch.device) else device
    if device not in DEVICES:
        raise UserError(f"unknown device {device!r}", f"use {', '.join(DEVICES)}")
    return PeakLimit(parse_size(_plain(kwargs["limit"]), what="limit"), device)


def _plain(value: Any) -> Any:
    """A str subclass as the characters it holds: parse_size and the messages read a value
    through str(), and a subclass whose __str__ said "1 TiB" over "1 KiB" set the limit to
    1 TiB (a 1 MiB body passed), its device named as that text in the failure."""
    return str.__str__(value) if isinstance(value, str) else value


def _stacked(item: pytest.Item) -> list[pytest.Mark]:
    """The markers on the test itself: the function's own decorators and its
    ``pytest.param(..., marks=...)``. A class's or module's marker is one a test's own
    overrides; two on the test itself are not an override."""
    function = getattr(item, "function", None)
    own = list(getattr(function, "pytestmark", []))
    own += list(getattr(getattr(item, "callspec", None), "marks", []))
    return [m for m in own if getattr(m, "name", None) == MARKER]


def _several(marks: list[pytest.Mark]) -> str | None:
    """Why several markers on one test are refused, or None for one or none. pytest's
    nearest marker is the decorator just above the def: a "1 KiB" above a "1 GiB" was
    ignored (a 1 MiB body passed), a device='cpu' limit beside a meta one was never
    measured, and a pytest.param's own limit gave way to the function's decorator."""
    if len(marks) < 2:
        return None
    shown = "; ".join(
        ", ".join([*map(repr, m.args), *(f"{k}={v!r}" for k, v in m.kwargs.items())])[:60]
        for m in marks
    )
    return (
        f"{len(marks)} markers on this one test ({shown}): memprobe applies one limit per "
        "test, so the others would be ignored (keep one; a pytest.param's marks= and the "
        "function's decorators all mark it)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker(MARKER)
    item.stash[_LIMIT] = None
    if marker is None:
        return
    wrong = _several(_stacked(item))
    try:
        limit = parse_marker(marker.args, marker.kwargs)
    except UserError as exc:
        wrong = wrong or exc.one_line()
    if wrong is not None:
        # Failed outside the except: inside it, pytest showed the UserError's words, then
        # "During handling of the above exception, another exception occurred:", then them
        # again with the hint (a marker's chained context is memprobe's, not the test's).
        _fail(f"{MARKER}: {wrong}", pytrace=False)
    if limit.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            _fail(
                f"{MARKER}: device='cuda' but CUDA is not available here "
                "(use device='meta' to simulate, or skip the test without a GPU)",
                pytrace=False,
            )
    item.stash[_LIMIT] = limit


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    limit = item.stash.get(_LIMIT, None)
    if limit is None:
        return (yield)
    pid = os.getpid()
    try:
        if limit.device == "cuda":
            result, peak, blocks = yield from _measure_cuda()
        else:
            result, peak, blocks = yield from _measure_tracked(simulate=limit.device == "meta")
    finally:
        if os.getpid() != pid:
            # A child the body forked (os.fork()) ends with the body, as a forking kernel's
            # does: it ran the rest of the session too, every later test twice.
            os._exit(0 if sys.exc_info()[0] is None else 1)
    item.user_properties.append(("peak_tensor_bytes", peak))
    if peak > limit.limit:
        _fail(failure_message(peak, limit, blocks, item.path), pytrace=False)
    return result


def _measure_tracked(
    *, simulate: bool
) -> Generator[None, object, tuple[object, int, list[Event] | None]]:

    import torch

    from memprobe.kernels.user_memprobe import MemprobeChanged, memprobe_kept
    from memprobe.kernels.user_torch import ModesRemoved, torch_state_kept
    from memprobe.measure.tracker import (
        AllocationTracker,
        autocast_not_applied,
        cuda_autocast_off,
        threads_started,
    )

    # On meta only meta storages are counted: one made elsewhere (the body popped the meta
    # default device, or named a device) is real memory this tracker would have read as
    # a simulated one, so the test fails below instead of passing "on meta".
    # On cpu only cpu storages: a meta tensor holds no memory (a shape probe of 1 TiB failed
    # a 1 MiB limit "at 1.00 TiB on cpu"), and one on a GPU is not CPU memory.
    tracker = AllocationTracker(device="meta" if simulate else "cpu")
    # On meta the body's own tensors must be meta too, or a full-scale example
    # allocates for real (tens of GiB) instead of simulating.
    default_device = torch.device("meta") if simulate else contextlib.nullcontext()
    with (
        default_device,
        tracker,
        threads_started() as started,
        cuda_autocast_off() as off,
        autocast_not_applied("meta" if simulate else "cpu") as ignored,
    ):
        # Inside memprobe's own modes: leaving the device and the tracker pops the top of
        # torch's stacks, so a mode the body entered and left on was popped in their place
        # (a dispatch mode: the tracker stayed on, recording every later test; a function
        # mode or torch.device(...): the meta default device stayed for every later test).
        removed = None
        try:
            # memprobe's own modules too: a body that put a property on the tracker's class
            # (its peak answered 0) passed its limit, and failed every marked test after it.
            with torch_state_kept(), memprobe_kept():
                result = yield
        except (ModesRemoved, MemprobeChanged) as exc:
            removed = str(exc)
    if removed is not None:  # failed out here: torch's traceback is not the body's fault
        _fail(f"{MARKER}: the test body failed: {removed}", pytrace=False)
    if started[0]:
        # The tracker and the meta default device hold for the test's own thread only
        # (torch's modes are per thread): a body that allocated 8 MiB in a thread it
        # started passed a 1 MiB limit, its peak read as 0 B (and on meta its tensors
        # were real ones).
        _fail(
            f"{MARKER}: the test body started {started[0]:,} thread(s), and what a thread "
            "allocates is not tracked on device='meta' or 'cpu' (allocate in the test's "
            "own thread, or use device='cuda', which reads the allocator)",
            pytrace=False,
        )
    if off[0]:
        # Torch turns CUDA autocast off where CUDA is not available: the body ran in full
        # precision, and a limit passed or failed on a peak no GPU run has.
        _fail(
            f"{MARKER}: the test body entered torch.autocast('cuda') {off[0]:,} time(s), "
            "which torch turns off without CUDA: the peak would be the full-precision "
            "body's, not the autocast one a GPU runs (use device='cuda' on a GPU, or leave "
            "CUDA autocast out of a meta or cpu test)",
            pytrace=False,
        )
    if ignored[0]:
        # Autocast casts only its own device type's tensors (meta tensors take none): the
        # body ran in full precision, and its limit was judged on a peak autocast has not.
        on = "meta" if simulate else "cpu"
        hint = "use device='cpu' for CPU autocast" if simulate else "leave it out of a cpu test"
        _fail(
            f"{MARKER}: the test body entered torch.autocast {ignored[0]:,} time(s) for a "
            f"device type its tensors are not on, and it was not applied on {on}: the peak "
            f"would be the full-precision body's ({hint})",
            pytrace=False,
        )
    if tracker.elsewhere and simulate:
        made = ", ".join(f"{n:,} on {kind}" for kind, n in sorted(tracker.elsewhere.items()))
        _fail(
            f"{MARKER}: device='meta' but the test body made tensors elsewhere ({made}): "
            "those are real memory, not simulated (make every tensor on the default device, "
            "or use device='cpu' to measure real tensors)",
            pytrace=False,
        )
    real = {kind: n for kind, n in tracker.elsewhere.items() if kind != "meta"}
    if real and not simulate:
        made = ", ".join(f"{n:,} on {kind}" for kind, n in sorted(real.items()))
        _fail(
            f"{MARKER}: device='cpu' but the test body made tensors on another device "
            f"({made}): their memory is not the CPU's, and is not counted (use "
            "device='cuda' for a GPU's)",
            pytrace=False,
        )
    return result, tracker.peak_bytes, tracker.live_at_peak()


def _measure_cuda() -> Generator[None, object, tuple[object, int, list[Event] | None]]:
    import torch

    from memprobe.measure.cuda_backend import warm_up_device

    # One-time allocations of CUDA libraries (cuBLAS workspaces of this thread and of
    # autograd's device thread) are made now, so the first measured test is not charged.
    warm_up_device()
    from memprobe.kernels.user_torch import torch_state_kept

    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch_state_kept():  # the body's torch defaults and modes are not the next test's
        result = yield
    torch.cuda.synchronize()
    # Tensors alive before the body (fixtures) are not the body's doing.
    return result, torch.cuda.max_memory_allocated() - before, None


def failure_message(
    peak: int, limit: PeakLimit, blocks: list[Event] | None, test_file: Path
) -> str:
    over = peak - limit.limit
    lines = [
        f"{MARKER}: torch tensors peaked at {format_bytes(peak)} on {limit.device}, over the "
        f"limit {format_bytes(limit.limit)} by {format_bytes(over)} "
        f"(+{100.0 * over / limit.limit:.1f}%)"
        if limit.limit
        else f"{MARKER}: torch tensors peaked at {format_bytes(peak)} on {limit.device}, "
        "over the limit 0 B"
    ]
    if blocks is None:
        lines.append(
            "(the CUDA allocator's statistics do not list blocks; run the test body with "
            "device='meta' to see them)"
        )
        return "\n".join(lines)
    shown = blocks[:BLOCKS_SHOWN]
    lines.append(
        f"largest blocks live at the peak ({len(shown)} of {len(blocks)}, "
        f"{format_bytes(sum(b.nbytes for b in shown))} of {format_bytes(peak)}):"
    )
    from memprobe.render.console import indented, table

    rows = [
        (
            format_bytes(block.nbytes),
            block.dtype.removeprefix("torch."),
            str(list(block.shape)),
            block.op,
            _where(block, test_file),
        )
        for block in shown
    ]
    header = ("bytes", "dtype", "shape", "op", "made")
    lines += indented(table(header, rows, left={"dtype", "shape", "op", "made"}))
    return "\n".join(lines)


def _where(block: Event, test_file: Path) -> str:
    """The line that made the block: the innermost frame of user or kernel code (not
    torch's, a library's or memprobe's harness), and the test's own line when the block
    was made further in (a kernel the test calls)."""
    from memprobe.attribute.frames import user_chain

    chain, _via = user_chain(block.frames)
    if not chain:
        return ""
    made = chain[0]
    text = f"at {Path(made.filename).name}:{made.line} in {made.name}"
    # The outermost frame in the test file: the test's own line.
    in_test = [f for f in block.frames if Path(f.filename) == test_file]
    called = in_test[-1] if in_test else None
    if called is not None and called != made:
        text += f" (called from {Path(called.filename).name}:{called.line} in {called.name})"
    return text
