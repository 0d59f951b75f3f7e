"""The caching allocator model on short programs whose segments were worked out by hand from
the rules of c10/cuda/CUDACachingAllocator.cpp (see vram/memory/allocator/rules.py)."""

from __future__ import annotations

import time

from vram.memory.allocator import (
    ALLOC,
    EMPTY_CACHE,
    FREE,
    MARK,
    RECORD_STREAM,
    RESET_PEAKS,
    SYNC,
    AllocConf,
    CachingAllocator,
    Event,
    parse_alloc_conf,
    replay,
)

MIB = 2**20
KIB = 2**10


def run(*program: tuple[str, int, int] | tuple[str, int], conf: str = "",
        capacity: int | None = None, total: int | None = None) -> CachingAllocator:
    """Steps: ("a", key, bytes[, stream]), ("f", key), ("e",): empty_cache."""
    alloc = CachingAllocator(parse_alloc_conf(conf), capacity_bytes=capacity,
                             device_total_bytes=total)
    live = {}
    for step in program:
        if step[0] == "a":
            live[step[1]] = alloc.malloc(step[2], *step[3:])  # type: ignore[misc]
        elif step[0] == "f":
            alloc.free(live.pop(step[1]))
        else:
            alloc.empty_cache()
    return alloc


def test_small_pool_packs_a_2_mib_segment() -> None:
    # four 512 KiB blocks fill one 2 MiB segment exactly; the fifth needs a second segment
    alloc = run(*[("a", k, 512 * KIB) for k in range(4)])
    assert alloc.stats.reserved_bytes == 2 * MIB
    assert alloc.stats.allocated_bytes == 2 * MIB
    run_more = run(*[("a", k, 512 * KIB) for k in range(5)])
    assert run_more.stats.reserved_bytes == 4 * MIB


def test_small_requests_share_a_segment_rounded_to_512() -> None:
    alloc = run(("a", 1, 1), ("a", 2, 600), ("a", 3, 4))
    assert alloc.stats.allocated_bytes == 512 + 1024 + 512
    assert alloc.stats.requested_bytes == 605
    assert alloc.stats.reserved_bytes == 2 * MIB


def test_large_pool_carves_20_mib_segments_and_merges_on_free() -> None:
    alloc = run(("a", 1, 3 * MIB), ("a", 2, 3 * MIB), ("a", 3, 3 * MIB))
    assert alloc.stats.reserved_bytes == 20 * MIB  # 3 x 3 MiB from one 20 MiB segment
    assert alloc.large.cached_bytes() == 11 * MIB
    alloc = run(("a", 1, 3 * MIB), ("a", 2, 3 * MIB), ("a", 3, 3 * MIB), ("f", 2), ("f", 1),
                ("f", 3), ("e",))
    # the three frees merge back into one unsplit 20 MiB block, which empty_cache releases
    assert alloc.stats.reserved_bytes == 0
    assert alloc.stats.reserved_peak_bytes == 20 * MIB


def test_a_rest_of_1_mib_or_less_is_not_split_off() -> None:
    alloc = run(("a", 1, 12 * MIB), ("f", 1), ("a", 2, 11 * MIB + 512 * KIB))
    # the 12 MiB block serves 11.5 MiB whole: allocated counts the block
    assert alloc.stats.allocated_bytes == 12 * MIB
    assert alloc.stats.reserved_bytes == 12 * MIB


def test_freed_block_too_small_for_a_larger_request_fragments() -> None:
    alloc = run(("a", 1, 30 * MIB), ("a", 2, 30 * MIB), ("f", 1), ("a", 3, 40 * MIB))
    assert alloc.stats.reserved_bytes == 100 * MIB
    assert alloc.stats.allocated_bytes == 70 * MIB


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    alloc = run(("a", 1, 40 * MIB), ("a", 2, 30 * MIB), ("f", 1), ("f", 2),
                ("a", 3, 25 * MIB), ("a", 4, 36 * MIB))
    # 25 MiB comes from the 30 MiB block, 36 MiB from the 40 MiB one; both rests (5 and 4 MiB,
    # over 1 MiB) are split off and cached
    assert alloc.stats.reserved_bytes == 70 * MIB
    assert alloc.large.cached_bytes() == 9 * MIB


def test_max_split_size_keeps_oversize_blocks_for_oversize_requests() -> None:
    conf = "max_split_size_mb:100"
    alloc = run(("a", 1, 150 * MIB), ("f", 1), ("a", 2, 60 * MIB), conf=conf)
    assert alloc.stats.reserved_bytes == 210 * MIB  # 60 MiB may not take the 150 MiB block
    alloc = run(("a", 1, 150 * MIB), ("f", 1), ("a", 2, 140 * MIB), conf=conf)
    assert alloc.stats.reserved_bytes == 150 * MIB  # within 20 MiB: served whole
    assert alloc.stats.allocated_bytes == 150 * MIB
    alloc = run(("a", 1, 150 * MIB), ("f", 1), ("a", 2, 120 * MIB), conf=conf)
    assert alloc.stats.reserved_bytes == 270 * MIB  # 30 MiB larger: not within 20 MiB


def test_free_and_retry_before_out_of_memory() -> None:
    # 60 MiB cached, 70 MiB asked with 100 MiB of room: the cache is released and retried
    alloc = run(("a", 1, 60 * MIB), ("f", 1), ("a", 2, 70 * MIB), capacity=100 * MIB)
    assert alloc.stats.num_alloc_retries == 1
    assert alloc.stats.reserved_bytes == 70 * MIB
    events: list[Event] = [(ALLOC, 1, 60 * MIB, 0), (FREE, 1, 0, 0), (ALLOC, 2, 70 * MIB, 0),
                           (ALLOC, 3, 40 * MIB, 0)]
    result = replay(events, capacity_bytes=100 * MIB)
    assert result.oom_at == 3
    assert result.num_ooms == 1
    assert result.num_alloc_retries == 2


def test_expandable_segments_grow_one_segment() -> None:
    events: list[Event] = [(ALLOC, 1, 300 * MIB, 0), (FREE, 1, 0, 0), (ALLOC, 2, 301 * MIB, 0)]
    assert replay(events).reserved_peak_bytes == 602 * MIB
    # 300 MiB maps 15 pages of 20 MiB; 301 MiB maps one more page after the free 300 MiB
    grown = replay(events, parse_alloc_conf("expandable_segments:True"))
    assert grown.reserved_peak_bytes == 320 * MIB
    assert grown.allocated_peak_bytes == 301 * MIB  # expandable blocks split at 512 B


def test_expandable_segments_return_free_pages() -> None:
    conf = "expandable_segments:True"
    alloc = run(("a", 1, 25 * MIB), ("a", 2, 25 * MIB), ("f", 2), ("e",), conf=conf)
    # A maps 40 MiB (25 used, 15 free); B uses the free 15 MiB and one more page (60 MiB);
    # freeing B leaves 25-60 MiB free: the pages wholly inside it (40-60) are unmapped
    assert alloc.stats.reserved_bytes == 40 * MIB
    assert alloc.stats.reserved_peak_bytes == 60 * MIB


def test_blocks_used_on_another_stream_wait_for_it() -> None:
    events: list[Event] = [(ALLOC, 1, 30 * MIB, 0), (RECORD_STREAM, 1, 0, 1), (FREE, 1, 0, 0),
                           (ALLOC, 2, 30 * MIB, 0), (SYNC, 0, 0, 1), (ALLOC, 3, 30 * MIB, 0)]
    result = replay(events)
    assert result.reserved_peak_bytes == 60 * MIB  # block 2 could not reuse block 1; 3 could
    assert result.active_peak_bytes == 60 * MIB  # block 1 stays active until the sync


def test_each_stream_has_its_own_cached_blocks() -> None:
    alloc = run(("a", 1, 30 * MIB, 0), ("f", 1), ("a", 2, 30 * MIB, 1))
    assert alloc.stats.reserved_bytes == 60 * MIB


def test_garbage_collection_with_a_memory_fraction() -> None:
    program = (("a", 1, 30 * MIB), ("a", 2, 30 * MIB), ("f", 1), ("f", 2), ("a", 3, 40 * MIB))
    plain = run(*program, conf="per_process_memory_fraction:1.0", total=100 * MIB)
    assert plain.stats.reserved_bytes == 100 * MIB
    # 60 MiB cached > 0.5 x 100 MiB: both unsplit cached blocks are as old as average, freed
    collected = run(*program, conf="per_process_memory_fraction:1.0,"
                    "garbage_collection_threshold:0.5", total=100 * MIB)
    assert collected.stats.reserved_bytes == 40 * MIB
    # without a fraction the threshold does nothing (`set_fraction && threshold > 0`)
    assert not AllocConf(garbage_collection_threshold=0.5).gc_active


def test_roundup_power2_divisions_rounds_the_block() -> None:
    alloc = run(("a", 1, 5 * MIB + 1), conf="roundup_power2_divisions:4")
    assert alloc.stats.allocated_bytes == 6 * MIB
    assert alloc.stats.reserved_bytes == 20 * MIB


def test_empty_cache_keeps_split_segments() -> None:
    alloc = run(("a", 1, 3 * MIB), ("a", 2, 30 * MIB), ("f", 2), ("e",))
    assert alloc.stats.reserved_bytes == 20 * MIB


def test_replay_peaks_reset_and_marks() -> None:
    events: list[Event] = [(ALLOC, 1, 50 * MIB, 0), (FREE, 1, 0, 0), (RESET_PEAKS, 0, 0, 0),
                           (ALLOC, 2, 10 * MIB, 0), (MARK, 7, 0, 0), (EMPTY_CACHE, 0, 0, 0)]
    result = replay(events)
    assert result.allocated_peak_bytes == 10 * MIB
    assert result.reserved_peak_bytes == 50 * MIB  # the peak resets to the current 50 MiB
    assert result.reserved_end_bytes == 50 * MIB  # the 50 MiB segment is split: kept
    assert result.marks[0].key == 7 and result.marks[0].allocated_bytes == 10 * MIB


def test_replay_of_a_long_program_is_fast() -> None:
    # 200k events of a layered step: the 70B trace's order of magnitude
    events: list[Event] = []
    key = 0
    for _ in range(50):
        held = []
        for size in (3 * MIB, 64 * MIB, 700 * KIB, 12 * MIB, 200 * MIB, 5 * MIB) * 60:
            key += 1
            events.append((ALLOC, key, size, 0))
            held.append(key)
            if len(held) > 8:
                events.append((FREE, held.pop(0), 0, 0))
        events.extend((FREE, k, 0, 0) for k in held)
    start = time.perf_counter()
    result = replay(events)
    assert time.perf_counter() - start < 5.0
    assert result.allocated_end_bytes == 0


def test_ties_between_equal_blocks_go_to_the_newest_segment() -> None:
    # Two 30 MiB segments, both free: best fit breaks the tie by the lower address, and each
    # new segment lies below the last (caching.py), so the newer one serves.
    alloc = CachingAllocator()
    older, newer = alloc.malloc(30 * MIB), alloc.malloc(30 * MIB)
    older_addr, newer_addr = older.addr, newer.addr
    alloc.free(older)
    alloc.free(newer)
    assert alloc.malloc(12 * MIB).addr == newer_addr
    assert alloc.malloc(30 * MIB).addr == older_addr
