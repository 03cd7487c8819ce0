"""Hostile inputs, round 31 (files): snapshots whose trace makes a segment the other kind
than the snapshot lists it (an expandable segment made by ``segment_alloc``, a cudaMalloc
segment grown by ``segment_map``), refused with one line rather than counted twice by the
allocator replay. Each table is a variant of a defect class the pass found."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

MIB = 1 << 20
A = 0x7F00_0000_0000  # a segment's address (a second one lies 1 GiB above)
B = A + (1 << 30)
FRAMES = [{"name": "step", "filename": "train.py", "line": 7}]


def _segment(addr: int, size: int, expandable: bool) -> dict[str, Any]:
    block = {"address": addr, "size": size, "requested_size": size,
             "state": "active_allocated", "frames": FRAMES}  # fmt: skip
    return {"device": 0, "address": addr, "total_size": size, "stream": 0,
            "segment_type": "large", "is_expandable": expandable, "frames": FRAMES,
            "blocks": [block]}  # fmt: skip


def _event(action: str, addr: int, size: int = 20 * MIB) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": FRAMES}


def _write(tmp_path: Path, segments: list[dict], trace: list[dict]) -> str:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": [trace]}))
    return str(path)


# -- a segment listed as one kind, made by the other kind's event. The allocator replay
# took the kind from the segment (its pages, or its cudaMalloc range, held from the start)
# and added the event's bytes again: "reserved peak 34.18 GiB" beside the replay's "68.36
# GiB recorded", and `attribute --what-if local_chunked --budget 40GiB` predicted 44.45 GiB
# reserved for a 10.27 GiB step, "does not fit". torch writes segment_alloc for cudaMalloc
# segments and segment_map for expandable ones only.
WRONG_KIND = {
    "expandable, made by segment_alloc": (
        [_segment(A, 20 * MIB, True)], [_event("segment_alloc", A), _event("alloc", A)],
        "is expandable, but device_traces[0][0] makes it with segment_alloc"),
    "plain, grown by segment_map": (
        [_segment(A, 20 * MIB, False)], [_event("segment_map", A), _event("alloc", A)],
        "is not expandable, but device_traces[0][0] maps pages into it"),
    "plain, grown by segment_map inside it after its segment_alloc": (
        [_segment(A, 20 * MIB, False)],
        [_event("segment_alloc", A, 10 * MIB), _event("segment_map", A + 10 * MIB, 10 * MIB)],
        "device_traces[0][1] maps pages into it"),
    "the second of two segments, expandable, made by segment_alloc": (
        [_segment(A, 20 * MIB, False), _segment(B, 20 * MIB, True)],
        [_event("segment_alloc", A), _event("segment_alloc", B), _event("alloc", B)],
        "segments[1] is expandable, but device_traces[0][1]"),
}  # fmt: skip


@pytest.mark.parametrize(("segments", "trace", "said"), WRONG_KIND.values(), ids=WRONG_KIND)
@pytest.mark.parametrize("flags", [(), ("--replay",), ("--what-if", "local_chunked")])
def test_a_segment_made_by_the_other_kinds_event_is_refused(
    run_cli: Any,
    tmp_path: Path,
    segments: list[dict],
    trace: list[dict],
    said: str,
    flags: tuple[str, ...],
) -> None:
    err = one_line(*run_cli("attribute", _write(tmp_path, segments, trace), *flags))
    assert said in err, err


# -- a trace that gives back segments (segment_free, segment_unmap) and grows again before
# its next allocation, where the model held none to give back (the segments given back
# were made with no block in them). The replay reads such a point as the allocator's retry
# after a failed cudaMalloc and made the model fail too, its last attempt (after
# empty_cache) included: `attribute --replay` (and --what-if) ended in an OutOfMemory
# traceback. The recorded allocation succeeded: the replay's last attempt does too. Each
# row also lists segments of the kind its events make, which still read.
REGROWN = {
    "expandable, mapped after a cudaMalloc segment there was freed": (
        [_segment(A, 20 * MIB, True)],
        [_event("segment_alloc", A), _event("segment_free", A), _event("segment_map", A),
         _event("alloc", A)]),
    "plain, allocated after an expandable range there was unmapped": (
        [_segment(A, 20 * MIB, False)],
        [_event("segment_map", A), _event("segment_unmap", A), _event("segment_alloc", A),
         _event("alloc", A)]),
    "plain, allocated, freed and allocated again": (
        [_segment(A, 20 * MIB, False)],
        [_event("segment_alloc", A), _event("segment_free", A), _event("segment_alloc", A),
         _event("alloc", A)]),
    "expandable, mapped, unmapped and mapped again": (
        [_segment(A, 20 * MIB, True)],
        [_event("segment_map", A), _event("segment_unmap", A), _event("segment_map", A),
         _event("alloc", A)]),
    "two segments freed, one made again": (
        [_segment(A, 20 * MIB, False)],
        [_event("segment_alloc", A), _event("segment_alloc", B), _event("segment_free", A),
         _event("segment_free", B), _event("segment_alloc", A), _event("alloc", A)]),
}  # fmt: skip


@pytest.mark.parametrize(("segments", "trace"), REGROWN.values(), ids=REGROWN)
def test_segments_given_back_and_made_again_replay_without_a_traceback(
    run_cli: Any, tmp_path: Path, segments: list[dict], trace: list[dict]
) -> None:
    path = _write(tmp_path, segments, trace)
    code, out, err = run_cli("attribute", path, "--replay", "--json")
    assert code == 0, err
    doc, replay = json.loads(out), json.loads(out)["replay"]
    assert replay["recorded_reserved_peak_bytes"] == doc["peak_reserved_bytes"], replay
    # The model holds what the allocation needs (segments made with no block are not its).
    assert replay["predicted_reserved_peak_bytes"] == 20 * MIB, replay


# -- `diff` of a step that ran out of memory. Its peak is what it held before the failed
# request, and the diff said nothing else: the OOM fixture beside the run that fits read
# "peak: 34.18 GiB -> 34.18 GiB (+0 B)", "no line's bytes changed"; a step that OOMed
# asking for 30 MiB beside the fix holding 40 MiB read as a 20 MiB regression. Each side
# that ran out is said under the peaks: where, what was held and asked, the least the
# step needed.
def _step(tmp_path: Path, name: str, sizes: list[int], oom: int | None) -> str:
    trace = [_event("segment_alloc", A, 64 * MIB)]
    trace += [_event("alloc", A + i * 16 * MIB, n * MIB) for i, n in enumerate(sizes)]
    if oom is not None:
        trace.append({"action": "oom", "size": oom * MIB, "device_free": 0, "stream": 0,
                      "frames": FRAMES})  # fmt: skip
    blocks = [
        {**_segment(A + i * 16 * MIB, n * MIB, False)["blocks"][0]} for i, n in enumerate(sizes)
    ]
    seg = {**_segment(A, 64 * MIB, False), "blocks": blocks}
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(pickle.dumps({"segments": [seg], "device_traces": [trace]}))
    return str(path)


OOM_DIFFS = {
    "A ran out, B fits": (([10, 10], 30), ([10, 15], None), ["A ran out of memory at entry #3: "
        "20.00 MiB allocated + 30.00 MiB requested", "needed at least 50.00 MiB"]),
    "B ran out, A fits": (([10], None), ([10, 10], 40), ["B ran out of memory at entry #3: "
        "20.00 MiB allocated + 40.00 MiB requested"]),
    "both ran out": (([10], 20), ([10, 10], 40), ["A ran out of memory at entry #2",
        "B ran out of memory at entry #3"]),
}  # fmt: skip


@pytest.mark.parametrize(("a", "b", "said"), OOM_DIFFS.values(), ids=OOM_DIFFS)
def test_a_diff_says_which_step_ran_out_of_memory(
    run_cli: Any, tmp_path: Path, a: tuple, b: tuple, said: list[str]
) -> None:
    path_a, path_b = _step(tmp_path, "a", *a), _step(tmp_path, "b", *b)
    code, out, err = run_cli("diff", path_a, path_b)
    assert code == 0, err
    for words in said:
        assert words in out, out
    sides = [side for side, (_, oom) in (("A", a), ("B", b)) if oom is not None]
    assert [line[2] for line in out.splitlines() if "ran out of memory" in line] == sides, out


def test_a_diff_of_two_steps_that_fit_says_no_oom(run_cli: Any, tmp_path: Path) -> None:
    paths = _step(tmp_path, "a", [10], None), _step(tmp_path, "b", [10, 10], None)
    code, out, err = run_cli("diff", *paths)
    assert code == 0 and "ran out" not in out, (err, out)


# -- a trace allocating more than its segments reserve (sizes edited, devices mixed) read
# "peak allocated: 20,971,520.00 TiB" over "peak reserved: 46.57 GiB" and "at the peak:
# 46.57 GiB reserved, 0 B of it not allocated", as facts; with no segment events it read
# "reserved never changed" with no word at all. Each line says the two disagree.
HUGE = 1 << 62
TOO_BIG = {
    "allocs past 8 EiB together, each segment made in the trace": (
        [_segment(A + i * (1 << 40), 20 * MIB, False) for i in range(5)],
        [e for i in range(5) for e in (_event("segment_alloc", A + i * (1 << 40)),
                                       _event("alloc", A + i * (1 << 40), HUGE))],
        ["a lower bound: below the peak allocated", "less than the 20,971,520.00 TiB allocated"]),
    "one alloc twice its segment, made in the trace": (
        [_segment(A, 20 * MIB, False)],
        [_event("segment_alloc", A), _event("alloc", A, 40 * MIB)],
        ["a lower bound: below the peak allocated", "less than the 40.00 MiB allocated"]),
    "one alloc twice its segment, no segment events": (
        [_segment(A, 20 * MIB, False)],
        [_event("alloc", A, 40 * MIB), _event("free_completed", A, 40 * MIB)],
        ["with no segment events, its segments reserved 20,971,520 throughout"]),
}  # fmt: skip


@pytest.mark.parametrize(("segments", "trace", "said"), TOO_BIG.values(), ids=TOO_BIG)
def test_a_trace_allocating_more_than_its_segments_says_they_disagree(
    run_cli: Any, tmp_path: Path, segments: list, trace: list, said: list[str]
) -> None:
    code, out, err = run_cli("attribute", _write(tmp_path, segments, trace))
    assert code == 0, err
    for words in said:
        assert words in out, out
    assert "0 B of it not allocated" not in out
