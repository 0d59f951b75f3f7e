"""The allocator's rules, one function each, against values worked out by hand from
c10/cuda/CUDACachingAllocator.cpp and c10/core/AllocatorConfig.h@v2.13.0."""

from __future__ import annotations

import pytest

from vram.memory.allocator.conf import NO_POWER2_ROUNDING, AllocConf, parse_alloc_conf
from vram.memory.allocator.rules import (
    allocation_size,
    divisions_for,
    may_serve,
    round_size,
    roundup_power2_next_division,
    should_split,
)

MIB = 2**20
FOURS = (4,) * 16


@pytest.mark.parametrize(("size", "rounded"), [
    (0, 512), (1, 512), (512, 512), (513, 1024), (1000, 1024), (3 * MIB + 1, 3 * MIB + 512),
])
def test_round_size_512(size: int, rounded: int) -> None:
    assert round_size(size, NO_POWER2_ROUNDING) == rounded


def test_roundup_power2_next_division_the_source_example() -> None:
    # "round up 1200 and number of divisions is 4 ... the function will return 1280"
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(1024, 4) == 1024  # a power of two stays
    assert roundup_power2_next_division(1280, 4) == 1280  # on a division already


def test_round_size_with_divisions() -> None:
    # 5 MiB + 1 lies in [4, 8) MiB; 4 divisions step 1 MiB: 6 MiB
    assert round_size(5 * MIB + 1, FOURS) == 6 * MIB
    # 2000 B (under 512 x 4 = 2048) keeps the 512-byte rounding
    assert round_size(2000, FOURS) == 2048


@pytest.mark.parametrize(("size", "segment"), [
    (512, 2 * MIB), (MIB, 2 * MIB), (MIB + 512, 20 * MIB), (10 * MIB - 512, 20 * MIB),
    (10 * MIB, 10 * MIB), (11 * MIB, 12 * MIB), (300 * MIB + 512, 302 * MIB),
])
def test_allocation_size(size: int, segment: int) -> None:
    assert allocation_size(size) == segment


def test_should_split() -> None:
    # small pool: any rest of 512 B or more
    assert should_split(2 * MIB, 2 * MIB - 512, small=True, expandable=False, max_split=None)
    assert not should_split(2 * MIB, 2 * MIB, small=True, expandable=False, max_split=None)
    # large pool: only a rest over 1 MiB
    assert not should_split(12 * MIB, 11 * MIB, small=False, expandable=False, max_split=None)
    assert should_split(12 * MIB, 11 * MIB - 512, small=False, expandable=False, max_split=None)
    # expandable segments keep any rest of 512 B
    assert should_split(12 * MIB, 11 * MIB, small=False, expandable=True, max_split=None)
    # a request of max_split_size or more is never split
    assert not should_split(300 * MIB, 100 * MIB, small=False, expandable=False,
                            max_split=100 * MIB)


def test_may_serve_oversize_rules() -> None:
    assert may_serve(500 * MIB, 20 * MIB, max_split=None, max_non_split_rounding=20 * MIB)
    # under max_split: never an oversize block
    assert not may_serve(150 * MIB, 60 * MIB, max_split=100 * MIB,
                         max_non_split_rounding=20 * MIB)
    # oversize request: a block less than 20 MiB larger
    assert may_serve(150 * MIB, 140 * MIB, max_split=100 * MIB, max_non_split_rounding=20 * MIB)
    assert not may_serve(160 * MIB, 140 * MIB, max_split=100 * MIB,
                         max_non_split_rounding=20 * MIB)


def test_parse_matches_pytorchs_own_config_test() -> None:
    # c10/test/core/AllocatorConfig_test.cpp's first case (minus its device-specific key)
    conf = parse_alloc_conf(
        "max_split_size_mb:40,max_non_split_rounding_mb:30,garbage_collection_threshold:0.5,"
        "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],"
        "expandable_segments:True,pinned_use_background_threads:True")
    assert conf.max_split_size_bytes == 40 * MIB
    assert conf.max_non_split_rounding_bytes == 30 * MIB
    assert conf.garbage_collection_threshold == 0.5
    assert conf.expandable_segments
    table = conf.roundup_power2_divisions
    got = [divisions_for(mb * MIB, table) for mb in (32, 64, 128, 256, 512, 1024, 2048, 8192)]
    assert got == [8, 8, 2, 4, 2, 4, 1, 1]


def test_parse_divisions_list_leaves_unnamed_intervals_unset() -> None:
    table = parse_alloc_conf("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")
    got = [divisions_for(mb * MIB, table.roundup_power2_divisions)
           for mb in (64, 128, 256, 512, 1024, 2048, 4096)]
    assert got == [8, 8, 16, 1, 0, 8, 2]
    single = parse_alloc_conf("roundup_power2_divisions:4").roundup_power2_divisions
    assert single == FOURS


def test_parse_empty_and_round_trip() -> None:
    assert parse_alloc_conf("") == AllocConf()
    assert parse_alloc_conf(None) == AllocConf()
    text = "expandable_segments:True,max_split_size_mb:128"
    assert parse_alloc_conf(parse_alloc_conf(text).text()) == parse_alloc_conf(text)


@pytest.mark.parametrize(("text", "key"), [
    ("foo:123", "foo"),
    ("max_split_size_mb:10", "max_split_size_mb"),  # below large_segment_size_mb (20)
    ("garbage_collection_threshold:1.5", "garbage_collection_threshold"),
    ("expandable_segments:yes", "expandable_segments"),
    ("max_split_size_mb", "max_split_size_mb"),
    ("roundup_power2_divisions:[64:8", "roundup_power2_divisions"),
    ("roundup_power2_divisions:3", "roundup_power2_divisions"),
    ("backend:cudaMallocAsync", "backend"),
])
def test_parse_errors_name_the_key(text: str, key: str) -> None:
    with pytest.raises(ValueError, match=f"^alloc_conf: {key}: ") as info:
        parse_alloc_conf(text)
    assert "\n" not in str(info.value)


def test_the_setup_knob_keeps_canonical_text_and_defers_to_the_stack() -> None:
    from vram import TrainingSetup
    from vram.stacks.resolve import resolve

    assert TrainingSetup(alloc_conf=" expandable_segments: True ").alloc_conf == \
        "expandable_segments:True"
    assert TrainingSetup(alloc_conf="default").alloc_conf == ""
    assert resolve(TrainingSetup()).run.alloc_conf == ""  # the HF Trainer sets none
    assert resolve(TrainingSetup(framework="axolotl")).run.alloc_conf == \
        "expandable_segments:True"
    assert resolve(TrainingSetup(framework="axolotl", alloc_conf="default")).run.alloc_conf == ""
    with pytest.raises(ValueError, match="alloc_conf: max_split_size_mb: must be at least 20"):
        TrainingSetup(alloc_conf="max_split_size_mb:8")
