"""Blocks and the free-block pools of the caching allocator model.

A `Block` is a range of one segment (a `cudaMalloc` result, or an expandable segment's address
space), free or handed out; neighbours in the same segment are linked (`prev`, `next`) so that
freed neighbours merge. A `Pool` holds the free blocks of one kind (small or large) per stream,
ordered by size then address: best fit is the first block of the stream at least as large as the
request (CUDACachingAllocator.cpp `BlockComparatorSize`, `get_free_block`: a pool serves only the
stream that allocated the block). Expandable segments keep their unmapped address space in the
pool too, ordered by address (`BlockComparatorAddress`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass


@dataclass(eq=False, slots=True)
class Block:
    """One range of a segment (CUDACachingAllocator.cpp `struct Block`)."""

    addr: int
    size: int
    stream: int
    small: bool
    allocated: bool = False
    requested: int = 0
    prev: Block | None = None
    next: Block | None = None
    #: Expandable segments only: whether physical pages back the range, the segment's first
    #: address and its page size.
    mapped: bool = True
    base: int = -1
    page: int = 0
    #: Streams other than `stream` that used the block (`record_stream`), and the end-of-use
    #: events a free waits for.
    stream_uses: frozenset[int] = frozenset()
    event_count: int = 0
    #: The pool's `get_free_block` call count when the block was cached (garbage collection).
    gc_count_base: int = 0

    @property
    def expandable(self) -> bool:
        return self.base >= 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def allocatable(self) -> bool:
        """Free and not waiting on another stream (`find_expandable_block`'s `allocatable`)."""
        return not self.allocated and self.event_count == 0 and not self.stream_uses

    def splice(self, before: Block | None, after: Block | None) -> None:
        """Insert this block between `before` and `after` (`Block::splice`)."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after


class Pool:
    """The free blocks of one kind (small or large), per stream (`struct BlockPool`)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self._order: dict[int, list[tuple[int, int]]] = {}
        self._blocks: dict[int, Block] = {}
        self._unmapped_order: dict[int, list[int]] = {}
        self._unmapped: dict[int, Block] = {}
        #: `get_free_blocks_call_count`: counted only while garbage collection is on.
        self.calls = 0

    # -- free (mapped) blocks ------------------------------------------------------------------
    def insert(self, block: Block) -> None:
        """`insert_into_blocks`: cache the block and note its age."""
        block.gc_count_base = self.calls
        insort(self._order.setdefault(block.stream, []), (block.size, block.addr))
        self._blocks[block.addr] = block

    def remove(self, block: Block) -> None:
        order = self._order[block.stream]
        del order[bisect_left(order, (block.size, block.addr))]
        del self._blocks[block.addr]

    def holds(self, block: Block) -> bool:
        return self._blocks.get(block.addr) is block

    def best_fit(self, stream: int, size: int) -> int:
        """The index of the smallest block of `stream` with at least `size` bytes (the lowest
        address among equals): `blocks.lower_bound(search_key)`."""
        return bisect_left(self._order.get(stream, []), (size, -1))

    def at(self, stream: int, index: int) -> Block | None:
        order = self._order.get(stream, [])
        return self._blocks[order[index][1]] if index < len(order) else None

    def count(self, stream: int) -> int:
        return len(self._order.get(stream, []))

    def blocks(self) -> list[Block]:
        """Every cached block, stream by stream, smallest first (the set's order)."""
        return [self._blocks[addr] for stream in sorted(self._order)
                for _, addr in self._order[stream]]

    def cached_bytes(self) -> int:
        return sum(block.size for block in self._blocks.values())

    # -- unmapped address space (expandable segments) ------------------------------------------
    def insert_unmapped(self, block: Block) -> None:
        insort(self._unmapped_order.setdefault(block.stream, []), block.addr)
        self._unmapped[block.addr] = block

    def remove_unmapped(self, block: Block) -> None:
        order = self._unmapped_order[block.stream]
        del order[bisect_left(order, block.addr)]
        del self._unmapped[block.addr]

    def unmapped(self, stream: int) -> list[Block]:
        """The stream's unmapped ranges, lowest address first."""
        return [self._unmapped[addr] for addr in self._unmapped_order.get(stream, [])]

    def remove_any(self, block: Block) -> None:
        """Drop a free block, mapped or not, from the pool (a merge subsumed it)."""
        if block.mapped:
            self.remove(block)
        else:
            self.remove_unmapped(block)
