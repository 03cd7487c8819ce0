"""A fake ``torch.cuda`` on CPU tensors, so the cuda backend runs where there is no GPU.

The statistics, events, history and snapshot calls memprobe's cuda path makes are backed
by memprobe's own storage tracker on CPU tensors, behaving the way the CUDA caching
allocator does in the respects that matter to the measurement:

* ``memory_allocated`` counts live blocks rounded up to 512 bytes (``round_to``);
  trace entries carry the requested bytes, as real ones do;
* freed blocks stay cached (``memory_reserved``) until ``empty_cache``; a request that
  would take reserved memory over ``capacity`` first frees the cache and then raises
  ``torch.OutOfMemoryError``, leaving an ``oom`` trace entry;
* ``_set_memory_metadata`` is **thread-local**, and ``torch.autograd.grad`` runs the
  backward pass on a separate worker thread, as CUDA's autograd device thread does:
  metadata set on the caller's thread does not label backward allocations, while the
  caller's dispatch modes go along (torch propagates them to its worker threads);
* meta tensors are not the device's: a meta simulation under the fake runs as without it;
* history is recorded only between ``_record_memory_history(...)`` and
  ``_record_memory_history(enabled=None)``; the harness counts the entries recorded
  per iteration so tests can see when it was on;
* ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (or ``broken_stats=True``) makes the statistics
  read 0, as the real allocator's do when caching is off;
* ``poison(message)`` makes every later CUDA call (allocation of a tensor with dimensions,
  synchronize, event) raise, like a sticky CUDA error;
  ``fail_on_op=(name, exception)`` raises from the first op whose name contains ``name``
  (a cuBLAS or kernel-launch failure outside the allocator);
* ``workspace_per_thread`` bytes are allocated, and kept, by the first allocation on each
  thread, as cuBLAS allocates a workspace per handle on first use: a measurement without a
  warm-up counts it in its first step.

Not modelled: streams and ``free_requested``/``free_completed`` gaps, block splitting
and best-fit reuse (a cached segment is reused only by a request of the same segment
size), expandable segments, the cudaMallocAsync backend's own statistics, and real
kernel timing (events read the host clock).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from memprobe.allocator.model import round_up
from memprobe.measure.tracker import AllocationTracker
from memprobe.records import Frame
from memprobe.snapshot.allocator import segment_size

GiB = 1 << 30


@dataclass
class _Block:
    addr: int
    requested: int
    size: int
    segment: int
    frames: list[dict[str, Any]]
    metadata: str


@dataclass
class FakeCudaState:
    """Everything the fake allocator knows; tests read it directly."""

    capacity: int = 80 * GiB
    round_to: int = 512
    backend: str = "native"
    broken_stats: bool = False
    allocated: int = 0
    peak_allocated: int = 0
    reserved: int = 0
    peak_reserved: int = 0
    cache: Counter[int] = field(default_factory=Counter)  # free segments by size
    live: dict[int, _Block] = field(default_factory=dict)
    recording: bool = False
    history_calls: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    poisoned: str | None = None
    worker_threads: set[str] = field(default_factory=set)
    ooms: int = 0
    workspace_per_thread: int = 0
    workspaces: dict[int, torch.Tensor] = field(default_factory=dict)
    fail_on_op: tuple[str, BaseException] | None = None
    sync_delay_s: float = 0.0
    # Device addresses: each block in a segment of its own, segments end to end (a real
    # snapshot's segments never share addresses; memprobe refuses one whose do).
    next_address: int = 1 << 32


class _FakeAllocatorTracker(AllocationTracker):
    """The tracker sees every CPU storage; the fake allocator turns it into blocks."""

    def __init__(self, fake: FakeCuda) -> None:
        super().__init__(capture_frames=True)
        self.fake = fake

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        fail = self.fake.state.fail_on_op
        if fail is not None and fail[0] in str(func):
            self.fake.state.fail_on_op = None
            raise fail[1]
        if func.namespace == "profiler":  # record_function's handle is a host tensor
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _register(self, tensor: torch.Tensor, op: str, frames: tuple[Frame, ...]) -> None:
        key = tensor.untyped_storage()._cdata
        nbytes = int(tensor.untyped_storage().nbytes())
        if key in self._live or nbytes == 0 or tensor.device.type == "meta":
            return  # meta tensors are the simulation's, not the device's
        self.fake._workspace_for_this_thread()
        if tensor.dim() > 0:  # 0-d tensors are mostly host scalars on a real GPU
            self.fake._check_poison()
        self.fake._malloc(key, nbytes, frames)  # may raise OutOfMemoryError
        super()._register(tensor, op, frames)

    def _on_free(self, key: int) -> None:
        if key in self._live:
            self.fake._free(key)
        super()._on_free(key)


class FakeCuda:
    """Install with :meth:`installed` (a context manager taking pytest's monkeypatch)."""

    def __init__(self, **state: Any) -> None:
        self.state = FakeCudaState(**state)
        self._metadata = threading.local()
        self._t0 = time.perf_counter()
        self.tracker = _FakeAllocatorTracker(self)
        self._real_grad = torch.autograd.grad
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="fake-cuda-autograd-device")

    # -- the allocator -------------------------------------------------------
    def _stats_on(self) -> bool:
        return not (self.state.broken_stats or os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING"))

    def _record(self, action: str, **entry: Any) -> None:
        if self.state.recording:
            self.state.trace.append(
                {
                    "action": action,
                    "stream": 0,
                    "time_us": int((time.perf_counter() - self._t0) * 1e6),
                    **entry,
                }
            )

    def _malloc(self, key: int, nbytes: int, frames: tuple[Frame, ...]) -> None:
        s = self.state
        size = round_up(nbytes, s.round_to)
        seg = segment_size(nbytes)
        metadata = self.get_metadata()
        frame_dicts = [{"name": f.name, "filename": f.filename, "line": f.line} for f in frames]
        reused = bool(s.cache[seg])
        if reused:
            s.cache[seg] -= 1
        else:
            if s.reserved + seg > s.capacity:
                self.empty_cache()  # the real allocator frees its cache and retries
            if s.reserved + seg > s.capacity:
                s.ooms += 1
                self._record("oom", size=nbytes, device_free=s.capacity - s.reserved, frames=[])
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {nbytes} bytes. GPU 0 has a total "
                    f"capacity of {s.capacity} bytes of which {s.capacity - s.reserved} "
                    "bytes is free. (fake)"
                )
            s.reserved += seg
            s.peak_reserved = max(s.peak_reserved, s.reserved)
        addr, s.next_address = s.next_address, s.next_address + seg
        if not reused:
            self._record("segment_alloc", addr=addr, size=seg, frames=frame_dicts)
        s.live[key] = _Block(addr, nbytes, size, seg, frame_dicts, metadata)
        s.allocated += size
        s.peak_allocated = max(s.peak_allocated, s.allocated)
        entry = {"addr": addr, "size": nbytes, "frames": frame_dicts}
        if metadata:
            entry["user_metadata"] = metadata
        self._record("alloc", **entry)

    def _free(self, key: int) -> None:
        s = self.state
        block = s.live.pop(key)
        s.allocated -= block.size
        s.cache[block.segment] += 1
        entry = {"addr": block.addr, "size": block.requested, "frames": block.frames}
        self._record("free_requested", **entry)
        self._record("free_completed", **entry)

    def _workspace_for_this_thread(self) -> None:
        s = self.state
        thread = threading.get_ident()
        if s.workspace_per_thread and thread not in s.workspaces:
            s.workspaces[thread] = torch.empty(0)  # mark first, the allocation re-enters
            ws = torch.empty(s.workspace_per_thread, dtype=torch.uint8)
            key = ws.untyped_storage()._cdata
            self._malloc(key, ws.untyped_storage().nbytes(), ())
            s.workspaces[thread] = ws

    def _check_poison(self) -> None:
        if self.state.poisoned is not None:
            raise RuntimeError(f"CUDA error: {self.state.poisoned}")

    def poison(self, message: str = "an illegal memory access was encountered") -> None:
        """From now on every CUDA call fails, as after a sticky CUDA error."""
        self.state.poisoned = message

    # -- torch.cuda ----------------------------------------------------------
    def memory_allocated(self, device: Any = None) -> int:
        return self.state.allocated if self._stats_on() else 0

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.state.peak_allocated if self._stats_on() else 0

    def memory_reserved(self, device: Any = None) -> int:
        return self.state.reserved if self._stats_on() else 0

    def max_memory_reserved(self, device: Any = None) -> int:
        return self.state.peak_reserved if self._stats_on() else 0

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.state.peak_allocated = self.state.allocated
        self.state.peak_reserved = self.state.reserved

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        if not self._stats_on():
            return {}
        s = self.state
        return {
            "allocated_bytes.all.current": s.allocated,
            "allocated_bytes.all.peak": s.peak_allocated,
            "reserved_bytes.all.current": s.reserved,
            "reserved_bytes.all.peak": s.peak_reserved,
            "num_ooms": s.ooms,
        }

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return self.state.capacity - self.state.reserved, self.state.capacity

    def empty_cache(self) -> None:
        s = self.state
        for seg, count in s.cache.items():
            for _ in range(count):
                s.reserved -= seg
                self._record("segment_free", addr=0, size=seg, frames=[])
        s.cache.clear()

    def synchronize(self, device: Any = None) -> None:
        self._check_poison()
        time.sleep(self.state.sync_delay_s)

    def set_metadata(self, text: str) -> None:
        self._metadata.value = text

    def get_metadata(self) -> str:
        return getattr(self._metadata, "value", "")

    def record_memory_history(self, enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
        self.state.history_calls.append({"enabled": enabled, **kwargs})
        on = enabled is not None and enabled is not False
        if on and (not self.state.recording or kwargs.get("clear_history")):
            self.state.trace = []
        self.state.recording = on

    def snapshot(self, device: Any = None) -> dict[str, Any]:
        s = self.state
        segments = [
            {
                "device": 0,
                "address": b.addr,
                "total_size": b.segment,
                "allocated_size": b.size,
                "active_size": b.size,
                "requested_size": b.requested,
                "stream": 0,
                "segment_type": "large" if b.segment > (2 << 20) else "small",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": b.frames,
                "blocks": [
                    {
                        "address": b.addr,
                        "size": b.size,
                        "requested_size": b.requested,
                        "state": "active_allocated",
                        "frames": b.frames,
                    }
                ],
            }
            for b in s.live.values()
        ]
        return {"segments": segments, "device_traces": [list(s.trace)]}

    def grad_on_worker_thread(self, *args: Any, **kwargs: Any) -> Any:
        """``torch.autograd.grad`` run on another thread, as the CUDA device thread runs
        backward: the dispatch mode travels there (torch propagates it), the allocator's
        thread-local metadata does not."""
        box: dict[str, Any] = {}
        modes = _get_current_dispatch_mode_stack()  # outermost first

        def work() -> None:
            self.state.worker_threads.add(threading.current_thread().name)
            try:
                with ExitStack() as stack:
                    for mode in modes:
                        stack.enter_context(mode)
                    box["out"] = self._real_grad(*args, **kwargs)
            except BaseException as exc:  # re-raised on the caller's thread, as torch does
                box["exc"] = exc

        # One long-lived device thread, as torch keeps one per device.
        self._worker.submit(work).result()
        if "exc" in box:
            exc = box.pop("exc")
            raise exc
        return box["out"]

    # -- installing ----------------------------------------------------------
    @contextmanager
    def installed(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
        import memprobe.measure.cuda_backend as cuda_backend

        cuda = torch.cuda
        for name, value in {
            "is_available": lambda: True,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": lambda device: None,
            "init": lambda: None,
            "get_device_name": lambda device=None: "fake CUDA (memprobe tests)",
            "get_device_properties": lambda device=None: SimpleNamespace(
                name="fake CUDA (memprobe tests)", total_memory=self.state.capacity
            ),
            "memory_allocated": self.memory_allocated,
            "max_memory_allocated": self.max_memory_allocated,
            "memory_reserved": self.memory_reserved,
            "max_memory_reserved": self.max_memory_reserved,
            "reset_peak_memory_stats": self.reset_peak_memory_stats,
            "memory_stats": self.memory_stats,
            "mem_get_info": self.mem_get_info,
            "empty_cache": self.empty_cache,
            "synchronize": self.synchronize,
            "Event": lambda enable_timing=False: FakeEvent(self),
        }.items():
            monkeypatch.setattr(cuda, name, value)
        for name, value in {
            "memory_allocated": self.memory_allocated,
            "max_memory_allocated": self.max_memory_allocated,
            "memory_reserved": self.memory_reserved,
            "max_memory_reserved": self.max_memory_reserved,
            "reset_peak_memory_stats": self.reset_peak_memory_stats,
            "memory_stats": self.memory_stats,
            "empty_cache": self.empty_cache,
            "_record_memory_history": self.record_memory_history,
            "_snapshot": self.snapshot,
            "_set_memory_metadata": self.set_metadata,
            "_get_memory_metadata": self.get_metadata,
            "get_allocator_backend": lambda: self.state.backend,
        }.items():
            monkeypatch.setattr(cuda.memory, name, value)
        monkeypatch.setattr(torch.autograd, "grad", self.grad_on_worker_thread)
        # "cuda" tensors are CPU tensors here: every protocol makes its inputs on DEVICE.
        monkeypatch.setattr(cuda_backend, "DEVICE", "cpu")
        if hasattr(cuda_backend, "_sticky_error"):  # a fresh device, a fresh process
            monkeypatch.setattr(cuda_backend, "_sticky_error", None)
        # The backend collects garbage around each case; objects older than the fake
        # (the test session's) are left out of those scans, which keeps tests fast. Left
        # frozen: an unfreeze would also undo the suite's own freeze (tests/conftest.py)
        # for every later test of this process.
        gc.freeze()
        try:
            with self.tracker:
                yield self
        finally:
            self._worker.shutdown()
            self.state.workspaces.clear()


class FakeEvent:
    """A CUDA event with ``elapsed_time`` in milliseconds, from the host clock."""

    def __init__(self, fake: FakeCuda) -> None:
        self.fake = fake
        self.t: float | None = None

    def record(self, stream: Any = None) -> None:
        self.fake._check_poison()
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        self.fake._check_poison()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None, "event not recorded"
        return (end.t - self.t) * 1e3
