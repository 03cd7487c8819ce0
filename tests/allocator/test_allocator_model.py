"""The allocator model, byte for byte, on sequences whose outcome torch's source fixes."""

from __future__ import annotations

import pytest

from memprobe.allocator.config import parse_alloc_conf
from memprobe.allocator.model import CachingAllocatorModel, OutOfMemory, round_size
from memprobe.allocator.simulate import simulate

MiB = 1 << 20


def model(text: str = "", **kwargs) -> CachingAllocatorModel:
    return CachingAllocatorModel(parse_alloc_conf(text), **kwargs)


def swap(m: CachingAllocatorModel, first_mib: int, second_mib: int, total_mib: int = 128) -> None:
    handles = [m.malloc(first_mib * MiB) for _ in range(total_mib // first_mib)]
    for h in handles:
        m.free(h)
    for _ in range(total_mib // second_mib):
        m.malloc(second_mib * MiB)


def test_golden_16_then_32_reserves_256():
    m = model()
    swap(m, 16, 32)
    assert m.stats.reserved_peak_bytes == 256 * MiB
    assert m.stats.segments == 12  # 8 cached 16 MiB segments are never merged


def test_golden_32_then_16_reserves_128():
    m = model()
    swap(m, 32, 16)
    assert m.stats.reserved_peak_bytes == 128 * MiB
    assert m.stats.segments == 4
    assert m.stats.inactive_split_bytes == 0  # each 32 MiB segment holds two 16 MiB blocks


def test_golden_expandable_maps_seven_20mib_pages_and_the_32s_fit():
    m = model("expandable_segments:True")
    handles = [m.malloc(16 * MiB) for _ in range(8)]
    assert m.stats.reserved_bytes == 140 * MiB
    assert [e["action"] for e in m.segment_events] == ["segment_map"] * 7
    assert {e["size"] for e in m.segment_events} == {20 * MiB}
    for h in handles:
        m.free(h)
    events = len(m.segment_events)
    for _ in range(4):
        m.malloc(32 * MiB)
    assert m.stats.reserved_peak_bytes == 140 * MiB
    assert len(m.segment_events) == events
    assert m.stats.segments == 1


def test_golden_2mib_and_half_mib_live_reserve_22mib():
    m = model()
    m.malloc(2 * MiB)
    m.malloc(MiB // 2)
    assert m.stats.reserved_bytes == 22 * MiB  # a 20 MiB large segment and a 2 MiB small one


def test_golden_two_2mib_share_one_20mib_segment():
    m = model()
    m.malloc(2 * MiB)
    m.malloc(2 * MiB)
    assert m.stats.reserved_bytes == 20 * MiB
    assert m.stats.segments == 1


def test_golden_three_small_requests_share_one_small_segment():
    m = model()
    addrs = [m.malloc(1000) for _ in range(3)]
    assert m.stats.reserved_bytes == 2 * MiB
    (segment,) = m.snapshot_segments()
    assert segment["segment_type"] == "small"
    assert [b["size"] for b in segment["blocks"]] == [1024, 1024, 1024, 2 * MiB - 3072]
    assert [b["address"] for b in segment["blocks"][:3]] == addrs
    assert segment["requested_size"] == 3000


def test_large_pool_keeps_a_remainder_of_1mib_or_less_in_the_block():
    m = model()
    h = m.malloc(12 * MiB)
    m.free(h)
    h = m.malloc(11 * MiB + MiB // 2)  # 0.5 MiB would remain: not split off
    assert m.block_size(h) == 12 * MiB
    m.free(h)
    h = m.malloc(10 * MiB)  # 2 MiB remain: split
    assert m.block_size(h) == 10 * MiB
    assert m.stats.inactive_split_bytes == 2 * MiB


def test_small_pool_splits_any_remainder_of_512_bytes():
    m = model()
    m.malloc(MiB - 512)
    m.malloc(MiB - 512)
    # 2 MiB - 2 x (1 MiB - 512) = 1024 bytes remain as a free block of the same segment
    assert m.stats.segments == 1
    assert m.stats.largest_free_block_bytes == 1024


def test_freed_neighbours_coalesce_within_a_segment():
    m = model()
    a, b, c = (m.malloc(2 * MiB) for _ in range(3))
    m.free(a)
    m.free(c)  # c merges with the free tail after it
    assert m.stats.inactive_split == 2
    m.free(b)  # a, b and c+tail become one block: the whole segment, unsplit
    assert m.stats.inactive_split == 0
    assert m.stats.inactive_split_bytes == 0
    (segment,) = m.snapshot_segments()
    assert [(x["size"], x["state"]) for x in segment["blocks"]] == [(20 * MiB, "inactive")]


def test_no_merge_across_segments_even_when_adjacent():
    m = model()
    a = m.malloc(16 * MiB)
    b = m.malloc(16 * MiB)
    assert b == a + 16 * MiB  # the default address source places them back to back
    m.free(a)
    m.free(b)
    assert m.stats.largest_free_block_bytes == 16 * MiB
    m.malloc(32 * MiB)
    assert m.stats.reserved_bytes == 64 * MiB


def test_best_fit_takes_the_smallest_block_then_the_lowest_address():
    m = model()
    big, mid1, mid2 = m.malloc(40 * MiB), m.malloc(24 * MiB), m.malloc(24 * MiB)
    for h in (big, mid2, mid1):
        m.free(h)
    assert m.malloc(22 * MiB) == mid1


def test_max_split_size_keeps_oversize_blocks_whole_and_for_large_requests():
    m = model("max_split_size_mb:20")
    h = m.malloc(40 * MiB)
    m.free(h)
    small = m.malloc(4 * MiB)  # may not use the oversize 40 MiB block: new 20 MiB segment
    assert small != h
    assert m.stats.reserved_bytes == 60 * MiB
    big = m.malloc(30 * MiB)  # oversize request: takes the 40 MiB block whole
    assert big == h
    assert m.block_size(big) == 40 * MiB


def test_max_non_split_rounding_limits_oversize_reuse():
    m = model("max_split_size_mb:20")
    h = m.malloc(44 * MiB)
    m.free(h)
    assert m.malloc(21 * MiB) != h  # 44 >= 21 + 20: too wasteful, new segment
    m2 = model("max_split_size_mb:20,max_non_split_rounding_mb:30")
    h = m2.malloc(44 * MiB)
    m2.free(h)
    assert m2.malloc(21 * MiB) == h


@pytest.mark.parametrize(
    ("text", "nbytes", "rounded"),
    [
        ("", 1, 512),
        ("", 1200, 1536),
        ("roundup_power2_divisions:4", 1200, 1536),  # not above 512 x 4: plain rounding
        ("roundup_power2_divisions:4", 5 * MiB + 1, 6 * MiB),
        ("roundup_power2_divisions:4", 4 * MiB, 4 * MiB),  # a power of two stays
        ("roundup_power2_divisions:8", 300 * MiB, 320 * MiB),
        ("roundup_power2_divisions:[256:1,512:2,>:4]", 300 * MiB + 1, 300 * MiB + 512),
        ("roundup_power2_divisions:[256:1,512:2,>:4]", 600 * MiB, 768 * MiB),
    ],
)
def test_roundup_power2_divisions(text, nbytes, rounded):
    assert round_size(nbytes, parse_alloc_conf(text)) == rounded


def test_failed_cudamalloc_frees_the_cache_and_retries_then_ooms():
    m = model(capacity_bytes=100 * MiB)
    m.free(m.malloc(60 * MiB))
    m.malloc(80 * MiB)  # 60 + 80 > 100: the cached 60 MiB segment is freed, then retried
    assert m.stats.reserved_bytes == 80 * MiB
    assert m.stats.num_alloc_retries == 1
    assert [e["action"] for e in m.segment_events] == [
        "segment_alloc",
        "segment_free",
        "segment_alloc",
    ]
    with pytest.raises(OutOfMemory):
        m.malloc(30 * MiB)
    assert m.stats.num_ooms == 1


def test_max_split_frees_one_oversize_block_that_is_big_enough_before_retrying():
    m = model("max_split_size_mb:20", capacity_bytes=150 * MiB)
    a, b = m.malloc(40 * MiB), m.malloc(100 * MiB)
    m.free(a)
    m.free(b)
    m.malloc(70 * MiB)  # 100 >= 70 + 20: not reused; 140 + 70 > 150: free the 100 MiB block
    assert m.stats.reserved_bytes == 110 * MiB
    assert [(e["action"], e["size"] // MiB) for e in m.segment_events][-2:] == [
        ("segment_free", 100),
        ("segment_alloc", 70),
    ]
    assert m.stats.num_alloc_retries == 0


def test_max_split_falls_back_to_freeing_everything_when_oversize_blocks_fall_short():
    # torch frees oversize blocks only while they add up to the request: 40 < 60, so it
    # reports failure and the free-everything retry runs (the source's rule, kept).
    m = model("max_split_size_mb:20", capacity_bytes=130 * MiB)
    a, b = m.malloc(40 * MiB), m.malloc(60 * MiB)
    m.free(a)
    m.free(b)
    m.malloc(50 * MiB)  # takes the 60 MiB block whole (within 20 MiB)
    m.malloc(60 * MiB)
    assert m.stats.reserved_bytes == 120 * MiB
    assert m.stats.num_alloc_retries == 1


def test_garbage_collection_frees_the_oldest_cached_blocks():
    # fraction 0.5 of 1000 MiB allows 500 MiB; the threshold 0.5 starts collecting at 250 MiB
    m = model(
        "garbage_collection_threshold:0.5,per_process_memory_fraction:0.5",
        capacity_bytes=1000 * MiB,
    )
    for size in (100, 120, 140):
        m.free(m.malloc(size * MiB))
    assert m.stats.reserved_bytes == 360 * MiB
    m.malloc(160 * MiB)
    # ages 3, 2, 1 (get_free_block calls since cached): the 100 and 120 MiB blocks go
    assert [(e["action"], e["size"] // MiB) for e in m.segment_events[-3:]] == [
        ("segment_free", 100),
        ("segment_free", 120),
        ("segment_alloc", 160),
    ]
    assert m.stats.reserved_bytes == 300 * MiB


def test_empty_cache_releases_unsplit_segments_and_unmaps_free_pages():
    m = model()
    keep = m.malloc(2 * MiB)
    m.free(m.malloc(30 * MiB))
    m.empty_cache()
    assert m.stats.reserved_bytes == 20 * MiB  # the split 20 MiB segment stays
    m.free(keep)
    m.empty_cache()
    assert m.stats.reserved_bytes == 0

    e = model("expandable_segments:True")
    live = e.malloc(16 * MiB)
    e.free(e.malloc(30 * MiB))
    assert e.stats.reserved_bytes == 60 * MiB
    e.empty_cache()
    assert e.stats.reserved_bytes == 20 * MiB
    assert e.segment_events[-1]["action"] == "segment_unmap"
    e.free(live)
    e.empty_cache()
    assert e.stats.reserved_bytes == 0


def test_streams_have_separate_pools():
    m = model()
    m.free(m.malloc(2 * MiB, stream=0))
    m.malloc(2 * MiB, stream=7)
    assert m.stats.segments == 2
    assert {s["stream"] for s in m.snapshot_segments()} == {0, 7}


def test_snapshot_segments_have_torch_fields():
    m = model()
    m.malloc(3 * MiB)
    (seg,) = m.snapshot_segments()
    assert set(seg) >= {
        "device",
        "address",
        "total_size",
        "allocated_size",
        "active_size",
        "requested_size",
        "stream",
        "segment_type",
        "segment_pool_id",
        "is_expandable",
        "frames",
        "blocks",
    }
    assert seg["allocated_size"] == 3 * MiB
    assert seg["total_size"] == 20 * MiB
    assert {b["state"] for b in seg["blocks"]} == {"active_allocated", "inactive"}


def test_simulate_keys_and_peak_segments():
    events = [
        ("alloc", "a", 16 * MiB),
        ("alloc", "b", 1000),
        ("free", "a", 0),
        ("alloc", "c", 8 * MiB),
    ]
    sim = simulate(events)
    assert sim.reserved_peak_bytes == 16 * MiB + 2 * MiB  # c fits in a's freed block
    assert sim.addresses[2] == sim.addresses[0] == sim.addresses[3]
    assert sim.peak_event_index == 1
    assert len(sim.peak_segments) == 2
    actions = [e["action"] for e in sim.trace]
    assert actions.count("segment_alloc") == 2
    assert actions.count("alloc") == 3
    assert all("event_index" in e for e in sim.trace)
    with pytest.raises(KeyError):
        simulate([("free", "nope", 0)])
