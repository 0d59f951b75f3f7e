"""Expandable segments (`expandable_segments:True`): one growing segment per stream and pool.

Instead of one `cudaMalloc` per miss, the allocator reserves a large address space (1 1/8 of the
device's memory) per stream and pool and maps physical pages into it as needed: 2 MiB pages for
the small pool, `large_segment_size` (20 MiB) pages for the large pool. A miss maps pages at the
lowest address where free and unmapped space together fit the request, merging with the free
block before it, so the tail of the segment stays one block (CUDACachingAllocator.cpp, "Note
[Expandable Segments]", `find_expandable_block`, `map_block`, `try_allocate_expandable_block`,
`unmap_block`). What is reserved is what is mapped.
"""

from __future__ import annotations

from typing import Protocol

from vram.memory.allocator.blocks import Block, Pool
from vram.memory.allocator.conf import AllocConf
from vram.memory.allocator.rules import SMALL_BUFFER, pages


class CachingAllocator(Protocol):
    """What expandable segments need of the allocator (`caching.CachingAllocator`)."""

    conf: AllocConf
    device_total_bytes: int

    def take_address_space(self, size: int) -> int: ...
    def device_has_room(self, size: int) -> bool: ...
    def add_reserved(self, size: int) -> None: ...
    def drop_reserved(self, size: int) -> None: ...
    def try_merge(self, dst: Block, src: Block | None, pool: Pool) -> int: ...


def grown_size(block: Block) -> int:
    """A free block's size for best fit: its own plus the unmapped range after it
    (`get_free_block`'s `expandable_size`)."""
    after = block.next
    return block.size + (after.size if after is not None and not after.mapped else 0)


def _space_from(block: Block | None, size: int) -> bool:
    """Whether free and unmapped blocks from `block` on add up to `size` bytes
    (`has_available_address_space`)."""
    total = 0
    while total < size and block is not None and block.allocatable():
        total += block.size
        block = block.next
    return total >= size


def find_block(alloc: CachingAllocator, pool: Pool, stream: int, size: int) -> Block:
    """The lowest-address start (an unmapped range, or the free block before it) with room for
    `size`; a new segment's address space if none (`find_expandable_block`)."""
    for candidate in pool.unmapped(stream):
        start = candidate.prev if candidate.prev is not None and \
            candidate.prev.allocatable() else candidate
        if _space_from(start, size):
            return start
    page = SMALL_BUFFER if pool.small else alloc.conf.large_segment_bytes
    total = alloc.device_total_bytes
    space = pages(total + total // 8, page)
    base = alloc.take_address_space(space)
    block = Block(addr=base, size=space, stream=stream, small=pool.small, mapped=False,
                  base=base, page=page)
    pool.insert_unmapped(block)
    return block


def map_block(alloc: CachingAllocator, pool: Pool, block: Block, size: int) -> bool:
    """Back the first `size` bytes of an unmapped range with pages (`map_block`); False when the
    device has no room for them."""
    mapped = pages(size, block.page)
    if not alloc.device_has_room(mapped):
        return False
    pool.remove_unmapped(block)
    block.mapped = True
    if mapped < block.size:
        rest = Block(addr=block.addr + mapped, size=block.size - mapped, stream=block.stream,
                     small=block.small, mapped=False, base=block.base, page=block.page)
        rest.splice(block, block.next)
        pool.insert_unmapped(rest)
        block.size = mapped
    alloc.try_merge(block, block.prev, pool)
    alloc.try_merge(block, block.next, pool)
    pool.insert(block)
    alloc.add_reserved(mapped)
    return True


def try_allocate(alloc: CachingAllocator, pool: Pool, stream: int, size: int) -> Block | None:
    """Map enough pages to serve `size` bytes and return the free block that now holds them
    (`try_allocate_expandable_block`); None when the device is full."""
    block = find_block(alloc, pool, stream, size)
    if not block.mapped and not map_block(alloc, pool, block, min(block.size, size)):
        return None
    while block.size < size:
        after = block.next
        assert after is not None and not after.mapped
        if not map_block(alloc, pool, after, min(size - block.size, after.size)):
            return None
        block = after
    pool.remove(block)
    return block


def unmap(alloc: CachingAllocator, pool: Pool, block: Block) -> None:
    """Give back the whole pages inside a free block (`unmap_block`); drop the segment when
    nothing of it is left (`release_expandable_segment`)."""
    page = block.page
    begin = block.base + pages(block.addr - block.base, page)
    end = block.base + (block.addr + block.size - block.base) // page * page
    if begin >= end:
        return
    pool.remove(block)
    if begin > block.addr:
        before = Block(addr=block.addr, size=begin - block.addr, stream=block.stream,
                       small=block.small, base=block.base, page=page)
        before.splice(block.prev, block)
        pool.insert(before)
    if block.addr + block.size > end:
        after = Block(addr=end, size=block.addr + block.size - end, stream=block.stream,
                      small=block.small, base=block.base, page=page)
        after.splice(block, block.next)
        pool.insert(after)
    block.addr, block.size, block.mapped = begin, end - begin, False
    alloc.drop_reserved(end - begin)
    alloc.try_merge(block, block.prev, pool)
    alloc.try_merge(block, block.next, pool)
    if block.is_split():
        pool.insert_unmapped(block)
