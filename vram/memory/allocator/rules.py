"""The rules of PyTorch's CUDA caching allocator, one small function each.

Sources (PyTorch, `pytorch/pytorch`):

* the constants and the settings: `c10/core/AllocatorConfig.h@v2.13.0` (as shipped in the
  torch 2.13.0 wheel, build commit cf30153c; line numbers are that file's);
* the rules: `c10/cuda/CUDACachingAllocator.cpp` (`DeviceCachingAllocator`), read at commit
  001074d2 of pytorch/pytorch. The rules used here read the same in the later refactor that moves
  them into a shared `CachingDeviceAllocator` template (it takes `kLargeBuffer` from
  `large_segment_size_mb` and the oversize rounding limit from `max_non_split_rounding_mb`,
  both defaulting to the old 20 MiB constant). Cited below as `CUDACachingAllocator.cpp
  (function)`.

Every size is in bytes.
"""

from __future__ import annotations

from vram.units import MIB

#: "all sizes are rounded to at least 512 bytes" (AllocatorConfig.h@v2.13.0:19).
MIN_BLOCK_SIZE = 512
#: "largest 'small' allocation is 1 MiB" (AllocatorConfig.h@v2.13.0:21).
SMALL_SIZE = 1 * MIB
#: "'small' allocations are packed in 2 MiB blocks" (AllocatorConfig.h@v2.13.0:17).
SMALL_BUFFER = 2 * MIB
#: "allocations between 1 and 10 MiB may use kLargeBuffer" (AllocatorConfig.h@v2.13.0:23).
MIN_LARGE_ALLOC = 10 * MIB
#: "round up large allocations to 2 MiB" (AllocatorConfig.h@v2.13.0:25).
ROUND_LARGE = 2 * MIB
#: kLargeBuffer: "large" allocations may be packed in 20 MiB blocks; `large_segment_size_mb`
#: (AllocatorConfig.h@v2.13.0:340, default 20971520).
LARGE_BUFFER = 20 * MIB
#: `roundup_power2_divisions` holds one entry per power-of-two interval from 1 MiB to 64 GiB
#: (kRoundUpPowerOfTwoIntervals = 16 in the config parser).
POWER2_INTERVALS = 16
#: The first interval starts at 2^20 bytes.
POWER2_FIRST_LOG2 = 20


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """`size` rounded up to the next of `divisions` equal steps between two powers of two:
    1200 with 4 divisions of [1024, 2048) is 1280 (CUDACachingAllocator.cpp
    `roundup_power2_next_division`)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def divisions_for(size: int, table: tuple[int, ...]) -> int:
    """The `roundup_power2_divisions` entry for `size`: the interval is log2(size) - 20, clamped
    to the table (CUDAAllocatorConfig `roundup_power2_divisions(size)`)."""
    index = size.bit_length() - 1 - POWER2_FIRST_LOG2
    return table[max(0, min(index, len(table) - 1))]


def round_size(size: int, table: tuple[int, ...]) -> int:
    """A request's block size: at least 512 B; a multiple of 512 B, or the next power-of-two
    division where `roundup_power2_divisions` sets one (CUDACachingAllocator.cpp `round_size`)."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    divisions = divisions_for(size, table)
    if divisions > 1 and size > MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def is_small(size: int) -> bool:
    """Blocks of 1 MiB or less come from the small pool (CUDACachingAllocator.cpp `get_pool`)."""
    return size <= SMALL_SIZE


def allocation_size(size: int, large_segment: int = LARGE_BUFFER) -> int:
    """The segment a cache miss asks the driver for: 2 MiB for a small block, a 20 MiB segment
    for a block under 10 MiB, else the block rounded up to 2 MiB (CUDACachingAllocator.cpp
    `get_allocation_size`)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return large_segment
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def should_split(block_size: int, size: int, *, small: bool, expandable: bool,
                 max_split: int | None) -> bool:
    """Whether serving `size` from a free block of `block_size` leaves the rest as a free block:
    small pool and expandable segments keep any rest of 512 B or more; the large pool keeps a
    rest over 1 MiB, and never splits for a request of `max_split_size` or more
    (CUDACachingAllocator.cpp `should_split`)."""
    remaining = block_size - size
    if small or expandable:
        return remaining >= MIN_BLOCK_SIZE
    below_max = max_split is None or size < max_split
    return below_max and remaining > SMALL_SIZE


def may_serve(block_size: int, size: int, *, max_split: int | None,
              max_non_split_rounding: int) -> bool:
    """Whether the best-fit free block may serve the request: a request under `max_split_size`
    never takes an oversize block, and an oversize request takes one only within
    `max_non_split_rounding` (20 MiB) of its size (CUDACachingAllocator.cpp `get_free_block`)."""
    if max_split is None:
        return True
    if size < max_split:
        return block_size < max_split
    return block_size < size + max_non_split_rounding


def pages(size: int, page: int) -> int:
    """Bytes mapped to back `size` bytes of an expandable segment: whole pages of 2 MiB (small
    pool) or `large_segment_size` (large pool) (CUDACachingAllocator.cpp `ExpandableSegment::map`,
    `segmentRight`)."""
    return -(-size // page) * page
