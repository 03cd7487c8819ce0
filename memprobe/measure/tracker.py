"""A storage-level allocation tracker for meta and CPU tensors.

A ``TorchDispatchMode`` sees every op's outputs; each new untyped storage is
an allocation, and ``weakref.finalize`` on the storage reports its free. This
counts what an allocator would have to hold (views and in-place results share
their storage and cost nothing), and it works on meta tensors, which is what
makes exact simulation at 20k × 131k possible on a laptop.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memprobe.records import Event, Frame


class OpMemo(Protocol):
    """What answers an op in place of running it (:class:`memprobe.measure.memo.MetaMemo`,
    which imports this module)."""

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...


_MAX_FRAMES = 24
# Namespaces of the c10d collective ops (eager and functional), and the ops in them that
# are not collectives themselves.
_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional"})
_NOT_COLLECTIVES = frozenset({"wait_tensor", "wait", "barrier", "monitored_barrier"})
_LIFT_FRESH = torch.ops.aten.lift_fresh.default
_THIS_FILE = __file__
# The trackers entered, innermost last, and ``UntypedStorage.resize_`` as torch defines it.
_ENTERED: list[AllocationTracker] = []
_STORAGE_RESIZE = torch.UntypedStorage.resize_
# Entered while a caller records storage resizes itself (resizes_recorded_by_caller).
_CALLER_RECORDS: list[bool] = []


@contextlib.contextmanager
def resizes_recorded_by_caller() -> Iterator[None]:
    """Storage resizes inside are left to the caller, which records them with their tensor
    (FSDP's profile: :meth:`AllocationTracker.resized`)."""
    _CALLER_RECORDS.append(True)
    try:
        yield
    finally:
        _CALLER_RECORDS.pop()


def _resize_seen(storage: Any, size: int) -> Any:
    """``UntypedStorage.resize_`` while a tracker is entered: it runs below torch's
    dispatch (no mode sees it), so a storage freed by ``resize_(0)`` (FSDP's way, and any
    step's that copies it) read as still held, and one grown in place as its old size: a
    step freeing 4 KiB that way and then making 3 KiB peaked at 7 KiB, not 4."""
    before = storage.nbytes()
    out = _STORAGE_RESIZE(storage, size)
    if storage.nbytes() != before and not _CALLER_RECORDS:
        for tracker in list(_ENTERED):  # each one entered saw the ops, so each sees this
            tracker.storage_resized(storage, sys._getframe(1))
    return out


def physical(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage holds ``tensor``'s bytes on this rank: a DTensor's local
    shard (its own storage reports the global size, which no rank allocates)."""
    if type(tensor) is torch.Tensor:  # the common case, without a failing attribute lookup
        return tensor
    while hasattr(tensor, "_local_tensor"):
        tensor = tensor._local_tensor
    return tensor


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors among an op's arguments or results. An aten op's schema nests them at
    most in lists, tuples (named ones too) and the kwargs dict, so this walk is exact
    there; it skips the pytree registry lookups, a third of a plan's meta simulation CPU."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple, dict)):
        # Tensors and scalars are tested here, not by a call each: most items are one.
        for item in value.values() if isinstance(value, dict) else value:
            if isinstance(item, torch.Tensor):
                yield item
            elif isinstance(item, (list, tuple, dict)):
                yield from tensors_in(item)


def _fresh(inputs: Iterable[torch.Tensor], outputs: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs whose storage no input holds (not a view, nor an in-place result)."""
    held = {physical(t).untyped_storage()._cdata for t in inputs}
    return [t for t in outputs if physical(t).untyped_storage()._cdata not in held]


def _stored(tensors: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    """``tensors``, each sparse one as the dense tensors that hold its memory: a step with
    an ``nn.Embedding(sparse=True)`` (a sparse gradient) or a ``sparse_coo_tensor`` failed
    on meta and cpu, and a marked test, in "Cannot access storage of SparseTensorImpl" (a
    sparse tensor has no storage of its own). Other layouts (mkldnn) hold none torch shows."""
    for t in tensors:
        layout = t.layout
        if layout is torch.strided:
            yield t
        elif layout is torch.sparse_coo:
            yield from (t._indices(), t._values())
        elif layout in (torch.sparse_csr, torch.sparse_bsr):
            yield from (t.crow_indices(), t.col_indices(), t.values())
        elif layout in (torch.sparse_csc, torch.sparse_bsc):
            yield from (t.ccol_indices(), t.row_indices(), t.values())


def collective_name(func: Any) -> str | None:
    """The collective an op is (``all_reduce``), or None for any other op."""
    if getattr(func, "namespace", None) not in _COLLECTIVE_NAMESPACES:
        return None
    name: str = func.__name__.split(".")[0]
    return None if name in _NOT_COLLECTIVES else name


def _storage_key(tensor: torch.Tensor) -> tuple[int, Any]:
    storage = physical(tensor).untyped_storage()
    return storage._cdata, storage


def _python_frames(
    skip: FrameType | None, skip_files: frozenset[str] = frozenset(), stop: object = None
) -> tuple[Frame, ...]:
    """Innermost-first Python frames of the caller, without the tracker's own (nor those of
    ``skip_files``), ending below the frame running code object ``stop`` when given."""
    frames: list[Frame] = []
    frame = skip
    while frame is not None and len(frames) < _MAX_FRAMES:
        code = frame.f_code
        if code is stop:
            break
        if (
            code.co_filename != _THIS_FILE
            and code.co_filename not in skip_files
            and "torch/utils/_python_dispatch" not in code.co_filename
        ):
            frames.append(Frame(code.co_name, code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(frames)


class AllocationTracker(TorchDispatchMode):
    """Record every storage allocated (and freed) while active.

    Set ``phase`` to label what follows (``setup``, ``forward``, ``backward``).
    Tensors that exist before the tracker starts but belong to the measured
    step (the logits) are registered with :meth:`track`.

    ``device`` (a device type, ``"meta"``, ``"cpu"``) counts only storages there: a
    CUDA step's host tensors (an optimizer's step counters) are no device memory.
    Subclasses name their own files in ``skip_files`` (kept out of the frames) and may
    set ``stop_code``: frames end below the frame running that code (the caller's
    harness is not the user's stack).
    """

    skip_files: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        capture_frames: bool = True,
        device: str | None = None,
        memo: OpMemo | None = None,
    ) -> None:
        super().__init__()
        # Meta ops answered from memory where that is exact (measure.memo).
        self.memo = memo
        self.capture_frames = capture_frames
        self.device = device
        self.stop_code: object = None
        self.phase = "setup"
        self.events: list[Event] = []
        self._live: dict[int, Event] = {}
        self._storages: dict[int, weakref.ref[Any]] = {}  # of the live, for adopt()
        self._t0 = time.perf_counter()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_index = -1
        self.phase_peaks: dict[str, int] = {}
        # Storages made on a device it does not count, by device type: a step that ignores
        # the device it is given makes all of its tensors here.
        self.elsewhere: dict[str, int] = {}
        # Collectives dispatched, by phase: counted here, not by a mode of their own,
        # which would add a Python layer to every op of a simulation.
        self.collectives: dict[str, int] = {}

    # -- recording -------------------------------------------------------
    def _now_us(self) -> float:
        return (time.perf_counter() - self._t0) * 1e6

    def _note_phase_level(self) -> None:
        self.phase_peaks[self.phase] = max(self.phase_peaks.get(self.phase, 0), self.live_bytes)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        # Memory already held when a phase starts belongs to that phase's peak.
        self._note_phase_level()

    def _frames(self, caller: FrameType) -> tuple[Frame, ...]:
        if not self.capture_frames:
            return ()
        return _python_frames(caller, self.skip_files, self.stop_code)

    def _register(self, tensor: torch.Tensor, op: str, frames: tuple[Frame, ...]) -> None:
        if self.device is not None and tensor.device.type != self.device:
            self.elsewhere[tensor.device.type] = self.elsewhere.get(tensor.device.type, 0) + 1
            return
        tensor = physical(tensor)
        key, storage = _storage_key(tensor)
        if key in self._live:
            return
        self._alloc(
            key, storage, tuple(int(d) for d in tensor.shape), str(tensor.dtype), op, frames
        )

    def _alloc(
        self,
        key: int,
        storage: Any,
        shape: tuple[int, ...],
        dtype: str,
        op: str,
        frames: tuple[Frame, ...],
    ) -> None:
        event = Event(
            index=len(self.events),
            time_us=self._now_us(),
            action="alloc",
            storage=key,
            nbytes=int(storage.nbytes()),
            shape=shape,
            dtype=dtype,
            op=op,
            phase=self.phase,
            frames=frames,
        )
        self.events.append(event)
        self._live[key] = event
        self._storages[key] = weakref.ref(storage)
        self.live_bytes += event.nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_index = event.index
        self._note_phase_level()
        weakref.finalize(storage, self._on_free, key)

    def _on_free(self, key: int) -> None:
        alloc = self._live.pop(key, None)
        self._storages.pop(key, None)
        if alloc is None:
            return
        self.live_bytes -= alloc.nbytes
        self.events.append(
            Event(
                index=len(self.events),
                time_us=self._now_us(),
                action="free",
                storage=key,
                nbytes=alloc.nbytes,
                shape=alloc.shape,
                dtype=alloc.dtype,
                op=alloc.op,
                phase=self.phase,
                frames=alloc.frames,
            )
        )

    def resized(self, tensor: torch.Tensor, op: str) -> None:
        """``tensor``'s storage was just resized in place (``UntypedStorage.resize_``,
        which FSDP2 uses to free and re-allocate an unsharded parameter without a new
        tensor): what it held is freed, and what it holds now, if anything, is a new
        allocation."""
        storage = _storage_key(tensor)[1]
        shape = tuple(int(d) for d in tensor.shape)
        self._reallocated(storage, shape, str(tensor.dtype), op, sys._getframe(1))

    def storage_resized(self, storage: Any, caller: FrameType) -> None:
        """``storage`` (no tensor at hand) was resized in place under :func:`_resize_seen`:
        freed, and re-allocated at its new size if it has one, as a byte block."""
        if self.device is not None and storage.device.type != self.device:
            return
        shape = (int(storage.nbytes()),)
        self._reallocated(storage, shape, "torch.uint8", "UntypedStorage.resize_", caller)

    def _reallocated(
        self, storage: Any, shape: tuple[int, ...], dtype: str, op: str, caller: FrameType
    ) -> None:
        """What ``storage`` held is freed; what it holds now, if anything, is allocated."""
        key = storage._cdata
        self._on_free(key)
        if storage.nbytes():
            self._alloc(key, storage, shape, dtype, op, self._frames(caller))

    def __enter__(self) -> Any:
        if not _ENTERED:
            torch.UntypedStorage.resize_ = _resize_seen  # type: ignore[method-assign,assignment]
        _ENTERED.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self in _ENTERED:
            _ENTERED.remove(self)
        if not _ENTERED:
            torch.UntypedStorage.resize_ = _STORAGE_RESIZE  # type: ignore[method-assign]
        super().__exit__(*exc)

    def left(self) -> list[tuple[Any, Event]]:
        """The storages allocated under it (not given to :meth:`track`) still live, with
        their allocations."""
        return [(s, e) for s, e in self.live_storages() if not e.op.startswith("input")]

    def live_storages(self) -> list[tuple[Any, Event]]:
        """Every storage it holds as live now (allocated under it, or tracked), with its
        allocation."""
        out = []
        for key, event in list(self._live.items()):
            storage = self._storages[key]() if key in self._storages else None
            if storage is not None:
                out.append((storage, event))
        return out

    def adopt(self, storage: Any, event: Event, op: str) -> None:
        """Count another tracker's live ``storage`` (its allocation ``event``) as live from
        now on, until it is freed, if it is on the device counted."""
        if self.device is not None and storage.device.type != self.device:
            return
        if storage._cdata not in self._live:
            self._alloc(storage._cdata, storage, event.shape, event.dtype, op, event.frames)

    def saw(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage is one this tracker holds as live (allocated under
        it, or given to :meth:`track`); always True for a device it does not count."""
        if self.device is not None and tensor.device.type != self.device:
            return True
        return _storage_key(physical(tensor))[0] in self._live

    def track(self, tensor: torch.Tensor, op: str = "input") -> None:
        """Count an existing tensor (e.g. the logits) as live from now on."""
        self._register(tensor, op, self._frames(sys._getframe(1)))

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if collective_name(func) is not None:
            self.collectives[self.phase] = self.collectives.get(self.phase, 0) + 1
        out = func(*args, **kwargs) if self.memo is None else self.memo.call(func, args, kwargs)
        if func is _LIFT_FRESH:
            # torch.tensor(data)'s storage was made before dispatch (on the cpu, outside
            # any device): a real lift returns it as is. Under FakeTensorMode the lift
            # makes a fake copy, which no device would allocate.
            return out
        outs = list(tensors_in(out))
        try:
            fresh = _fresh(tensors_in((args, kwargs)), outs)
        except NotImplementedError:  # a sparse tensor has no storage of its own
            fresh = _fresh(_stored(tensors_in((args, kwargs))), _stored(outs))
        if fresh:
            frames = self._frames(sys._getframe(1))
            for t in fresh:
                self._register(t, str(func), frames)
        if len(fresh) < len(outs):  # an output in an input's storage, which may have grown
            self._note_growth(func, outs, fresh)
        return out

    def _note_growth(self, func: Any, outs: list[torch.Tensor], fresh: list[torch.Tensor]) -> None:
        """An output whose storage this tracker holds and which grew under ``func``
        (``Tensor.resize_``, ``resize_as_``, an ``out=`` given too small) is re-allocated
        at its new size: a 4-byte tensor resized to 4 MiB read as its 4 bytes, and a kernel
        holding such a scratch buffer read as unchunked's peak."""
        seen = {id(t) for t in fresh}
        for t in outs:
            if id(t) in seen or t.layout is not torch.strided:
                continue
            if self.device is not None and t.device.type != self.device:
                continue
            key, storage = _storage_key(t)
            event = self._live.get(key)
            if event is not None and int(storage.nbytes()) > event.nbytes:
                self.resized(t, str(func))

    # -- reading ---------------------------------------------------------
    def live_at(self, index: int) -> list[Event]:
        """Allocations live just after event ``index``, largest first."""
        live: dict[int, Event] = {}
        for event in self.events[: index + 1]:
            if event.action == "alloc":
                live[event.storage] = event
            else:
                live.pop(event.storage, None)
        return sorted(live.values(), key=lambda e: e.nbytes, reverse=True)

    def live_now(self) -> list[Event]:
        """Allocations live now (given to :meth:`track` or allocated under it)."""
        return list(self._live.values())

    def live_at_peak(self) -> list[Event]:
        return self.live_at(self.peak_index) if self.peak_index >= 0 else []


@contextlib.contextmanager
def cuda_autocast_off() -> Iterator[list[int]]:
    """Count the ``torch.autocast("cuda")`` contexts made inside that torch turns off, as it
    does where CUDA is not available (with a UserWarning of its own): the step then runs
    in full precision, and its trace is not the autocast step a GPU runs. A user's step
    under ``torch.autocast("cuda", dtype=torch.bfloat16)`` was profiled on meta as float32
    and its peak shown as the step's, with only torch's warning on stderr.

    autocast asks ``torch.cuda.amp.common.amp_definitely_not_available()`` only when it is
    enabled for cuda: that question is counted, not autocast's ``__init__`` wrapped (its
    warning names its caller's line, which a wrapper would take)."""
    off = [0]
    common = torch.cuda.amp.common
    original = common.amp_definitely_not_available
    asker = torch.amp.autocast_mode.autocast.__init__.__code__

    @functools.wraps(original)
    def not_available() -> bool:
        answer = bool(original())
        if answer and sys._getframe(1).f_code is asker:
            off[0] += 1
        return answer

    common.amp_definitely_not_available = not_available
    try:
        yield off
    finally:
        common.amp_definitely_not_available = original


@contextlib.contextmanager
def autocast_not_applied(device: str) -> Iterator[list[int]]:
    """Count the autocast contexts made inside, enabled, for another device type than
    ``device``'s, the one the step's tensors are on: autocast casts only that type's
    tensors, so the step runs in full precision. Meta tensors take no autocast at all: a
    step under ``torch.autocast("cpu", dtype=torch.bfloat16)`` profiled on meta read
    1 MiB above the same step on cpu at 256 tokens x 2,048 (its logits float32, not
    bfloat16), with no word. (CUDA's is turned off before this sees it enabled:
    :func:`cuda_autocast_off` counts that one.)

    autocast's ``__enter__`` turns a device type on through ``torch.set_autocast_enabled``
    (looked up on ``torch`` each time): that call is counted, nothing else changed."""
    count = [0]
    original = torch.set_autocast_enabled

    @functools.wraps(original)
    def set_enabled(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 2 and isinstance(args[0], str) and args[0] != device and args[1]:
            count[0] += 1
        return original(*args, **kwargs)

    torch.set_autocast_enabled = set_enabled
    try:
        yield count
    finally:
        torch.set_autocast_enabled = original


@contextlib.contextmanager
def threads_started() -> Iterator[list[int]]:
    """Count the threads started inside (``started[0]``). A tracker sees the ops of the
    thread it was entered on only (torch's dispatch modes are per thread): what other
    threads allocate is missing from its trace, and a caller says so rather than let a
    smaller peak pass for the whole."""
    started = [0]
    original = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started[0] += 1
        original(thread)

    threading.Thread.start = start  # type: ignore[method-assign,assignment]
    try:
        yield started
    finally:
        threading.Thread.start = original  # type: ignore[method-assign]
