"""Build a torch-format allocator snapshot from memprobe's tracker trace.

On ``meta`` and ``cpu`` there is no CUDA allocator to ask, but the tracker saw every
storage come and go. This runs that trace through memprobe's model of the CUDA
caching allocator (:mod:`memprobe.allocator`) and writes what
``torch.cuda.memory._snapshot()`` would give: each tensor at the address the
allocator would have handed out, ``segment_alloc``/``segment_map`` events where it
would have called cudaMalloc, and final ``segments`` whose blocks include the
inactive splits and cached free blocks. So torch's viewers (``_memory_viz``
``segment_plot``, pytorch.org/memory_viz) show the fragmentation the real
allocator would have, and ``memprobe attribute`` reads simulated and real runs alike.

Times are the tracker's. On meta they time the simulation, not a GPU, so the
snapshot says so (``memprobe.clock``): readers must not present them as measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from memprobe.allocator import AllocConf, simulate
from memprobe.allocator.snapshot_format import SETTINGS_CONF_KEYS
from memprobe.io.text import printable
from memprobe.records import Case, Event, Frame
from memprobe.snapshot.labels import format_label

# Frees of storages made before tracking began sit here, away from the model's
# addresses, as the frees of a ring-buffer-truncated CUDA trace would.
ORPHAN_ADDRESS = 0x7E00_0000_0000
ALLOCATOR_MODEL = "memprobe synthesized: memprobe.allocator model of the CUDA caching allocator"


def frames_to_dicts(frames: Iterable[Frame]) -> list[dict[str, Any]]:
    return [{"name": f.name, "filename": f.filename, "line": int(f.line)} for f in frames]


def _label(ev: Event, case_id: str | None) -> str:
    return format_label(case=case_id, phase=ev.phase, op=ev.op, dtype=ev.dtype, shape=ev.shape)


def synthesize_snapshot(
    events: Iterable[Event],
    *,
    case: Case | None = None,
    device: int = 0,
    conf: AllocConf | None = None,
    clock: str | None = None,
) -> dict[str, Any]:
    """A torch snapshot dict from tracker events (``alloc`` / ``free``), in index order.

    Each storage's ``alloc`` and ``free_requested`` + ``free_completed`` carry its
    requested bytes, its frames and a memprobe label in ``user_metadata`` (case,
    phase, op, dtype, shape); segment events come from the allocator model under
    ``conf`` (the defaults when None). Zero-byte storages are skipped: CUDA never
    allocates for them. ``clock`` says what the times measure (``"simulation"`` for a
    meta run, ``"tracker"`` otherwise); by default the case's device decides.
    """
    if device < 0:
        raise ValueError("device must be >= 0")
    case_id = case.case_id if case is not None else None
    modelled, orphans = allocator_requests(events)
    sim = simulate(((e.action, e.storage, e.nbytes) for e in modelled), conf, device=device)

    by_addr: dict[int, Event] = {}  # the event that made each live block, for segment frames
    trace: list[dict[str, Any]] = []
    last_time = 0
    orphan_at = 0
    orphan_addr = ORPHAN_ADDRESS

    def stamp(entry: dict[str, Any], ev: Event) -> dict[str, Any]:
        nonlocal last_time
        entry["frames"] = frames_to_dicts(ev.frames)
        entry["user_metadata"] = _label(ev, case_id)
        # Snapshot times are integer microseconds and never go backwards.
        last_time = max(last_time, int(round(ev.time_us)))
        entry["time_us"] = last_time
        return entry

    def flush_orphans(upto: int) -> None:
        nonlocal orphan_at, orphan_addr
        while orphan_at < len(orphans) and orphans[orphan_at][0] <= upto:
            ev = orphans[orphan_at][1]
            for action in ("free_requested", "free_completed"):
                base = {"action": action, "addr": orphan_addr, "size": ev.nbytes, "stream": 0}
                trace.append(stamp(base, ev))
            orphan_addr += 2 << 20
            orphan_at += 1

    for entry in sim.trace:
        index = entry.pop("event_index")
        flush_orphans(index)
        ev = modelled[index]
        if entry["action"] == "alloc":
            by_addr[entry["addr"]] = ev
        trace.append(stamp(entry, ev))
    flush_orphans(len(modelled))

    segments = [dict(seg) for seg in sim.segments]
    for seg in segments:
        seg["blocks"] = [_with_origin(b, by_addr, case_id) for b in seg["blocks"]]
    traces: list[list[dict[str, Any]]] = [[] for _ in range(device)] + [trace]
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": _settings(conf or AllocConf()),
        "external_annotations": [],
        "memprobe": {
            "synthesized": True,
            "case": case_id,
            "allocator_model": ALLOCATOR_MODEL,
            "alloc_conf": (conf or AllocConf()).to_string(),
            "clock": clock
            or ("simulation" if case is not None and case.device == "meta" else "tracker"),
        },
    }


def recorded_case(snapshot: dict[str, Any]) -> str | None:
    """The case id memprobe wrote into a snapshot it synthesized for a sweep's case; None
    for torch's own (a cuda run's) and for a profiled step, which name none."""
    meta = snapshot.get("memprobe")
    recorded = meta.get("case") if isinstance(meta, dict) else None
    if recorded is None or isinstance(recorded, str):
        return recorded
    # memprobe writes a string or nothing: a number or a list there is no case of this
    # run, and read as "names none" the page drew the file as the row's own case.
    return f"(a {type(recorded).__name__}, not a case id)"


def another_case(snapshot: dict[str, Any], case_id: str) -> str | None:
    """The case a snapshot was recorded for, printable, when it is not ``case_id`` (an
    edited row, a file copied over: its trace and largest block are not this case's);
    None when it is this case's or names none. Report and gate both ask this."""
    recorded = recorded_case(snapshot)
    return None if recorded is None or recorded == case_id else printable(recorded)


# The devices whose cases' snapshots memprobe synthesizes (cuda's are torch's own).
_SYNTHESIZED_ON = ("meta", "cpu")


def contradicted_peak(snapshot: dict[str, Any], row: Mapping[str, Any]) -> str | None:
    """Why a snapshot memprobe synthesized for a row's case cannot stand beside it: its
    allocated bytes are the run's own, exactly, so its peak is the row's peak_bytes. A row
    edited to 1.10 MiB was drawn beside its snapshot's trace peaking at 112.25 KiB (and
    the gate named that trace's largest block as the failure's), without a word. A row of
    ranks (tp or cp above 1) holds the largest rank's peak and the snapshot rank 0's: it
    may peak lower, never higher. None when they agree, or for torch's own snapshot of a
    cuda case (a whole process: not the kernel's peak); a meta or cpu case's snapshot is
    always memprobe's. Report and gate both ask this."""
    meta = snapshot.get("memprobe")
    peak = row.get("peak_bytes")
    synthesized = isinstance(meta, dict) and meta.get("synthesized") is True
    device = row.get("device")
    if not synthesized and device in _SYNTHESIZED_ON:
        # memprobe writes every meta and cpu case's snapshot itself (no CUDA allocator ran):
        # one without its mark is another job's (torch's, copied over the case's file), and
        # its "Peak allocated 931.32 GiB" was drawn as the case's beside a 112.25 KiB row.
        return (
            f"is not one memprobe synthesized, and every {device} case's snapshot is "
            "(it is torch's own, from another job, or was edited)"
        )
    if not (synthesized and peak):
        return None
    from memprobe.snapshot.replay import replay

    traced = replay(snapshot).peak_allocated_bytes
    of_ranks = (row.get("tp") or 1) > 1 or (row.get("cp") or 1) > 1
    if traced == peak or (of_ranks and traced < peak):
        return None
    return (
        f"peaks at {traced:,} bytes, and its row's peak_bytes is {peak:,}: memprobe wrote "
        "both from one measurement, so the results or the snapshot were edited"
    )


def allocator_requests(events: Iterable[Event]) -> tuple[list[Event], list[tuple[int, Event]]]:
    """The tracker's events as the CUDA allocator would receive them, in index order.

    Returns (requests, orphans): zero-byte storages are dropped (CUDA never allocates
    for them), a storage seen alive twice gets the free the tracker lost, and frees of
    storages made before tracking began are set aside as orphans, each with the
    position in ``requests`` it came at.
    """
    modelled: list[Event] = []
    orphans: list[tuple[int, Event]] = []
    live: set[int] = set()
    for ev in sorted(events, key=lambda e: e.index):
        if ev.action == "alloc":
            if ev.nbytes <= 0:
                continue
            if ev.storage in live:
                # A storage id seen alive twice: the tracker lost a free. Treat it as one.
                modelled.append(_as_free(ev))
            live.add(ev.storage)
            modelled.append(ev)
        elif ev.action == "free":
            if ev.storage in live:
                live.discard(ev.storage)
                modelled.append(ev)
            elif ev.nbytes > 0:
                orphans.append((len(modelled), ev))
        else:
            raise ValueError(
                f"event {ev.index} has action {ev.action!r}; expected 'alloc' or 'free'"
            )
    return modelled, orphans


def _settings(conf: AllocConf) -> dict[str, Any]:
    """``allocator_settings`` as torch writes them: the configuration string, and the
    options the model uses (``max_split_size`` in bytes, as torch records it)."""
    split = conf.max_split_size
    return {
        SETTINGS_CONF_KEYS[0]: conf.to_string(),
        "max_split_size": split if split is not None else -1,
        "garbage_collection_threshold": conf.garbage_collection_threshold or 0.0,
        "expandable_segments": conf.expandable_segments,
    }


def _as_free(ev: Event) -> Event:
    return Event(
        ev.index, ev.time_us, "free", ev.storage, ev.nbytes, ev.shape, ev.dtype, ev.op, ev.phase
    )


def _with_origin(block: dict[str, Any], by_addr: dict[int, Event], case_id: str | None) -> dict:
    out = dict(block)
    ev = by_addr.get(block["address"])
    if block["state"] != "inactive" and ev is not None:
        out["frames"] = frames_to_dicts(ev.frames)
        # Not in torch's block dicts (viewers ignore it): keeps memprobe's label on
        # blocks whose alloc a trimmed trace no longer holds.
        out["user_metadata"] = _label(ev, case_id)
    return out
