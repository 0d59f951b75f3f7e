"""A model of PyTorch's CUDA caching allocator (`DeviceCachingAllocator`), in pure Python.

It replays a program's allocations and frees and keeps what PyTorch keeps: the segments it asked
the driver for (`memory_reserved`), the blocks handed out (`memory_allocated`) and their peaks.
The rules are those of `c10/cuda/CUDACachingAllocator.cpp` (see `rules.py` for the version read):

* a request is rounded (`round_size`) and served from the small pool (<= 1 MiB, carved from
  2 MiB segments) or the large pool (carved from 20 MiB segments below 10 MiB, else a segment of
  the request rounded up to 2 MiB);
* the best-fit cached block of the same stream serves it (`get_free_block`), split when the rest
  is worth keeping (`should_split`); a miss asks the driver for a new segment (`alloc_block`);
* a freed block merges with free neighbours of its segment (`free_block`); a block used on
  another stream (`record_stream`) is freed only once that stream's work is done;
* when the driver has no room (`capacity_bytes`), cached blocks are released and the request
  retried: oversize blocks first (`release_available_cached_blocks`), then every free segment
  (`release_cached_blocks`, counted in `num_alloc_retries`), then an out-of-memory error;
* `expandable_segments`, `max_split_size_mb`, `max_non_split_rounding_mb`,
  `roundup_power2_divisions`, `garbage_collection_threshold` with a memory fraction (`conf.py`).

Streams are integers (0: the default stream). Addresses are made up: each new segment lies
below the last one. Best fit breaks ties between free blocks of equal size by the lower
address, so this makes the most recently created segment win a tie. The driver's address
order is not documented; on the 61 H200 steps (`benchmarks/trace_reserved_h200.py`) this
order matches the measured reserved figures where the opposite one misses by up to 7 % (three
rows move; none gets worse), so cudaMalloc is taken to hand out descending addresses.

    >>> a = CachingAllocator()
    >>> block = a.malloc(3 * 2**20)  # 3 MiB: a 20 MiB segment, split
    >>> a.stats.reserved_bytes // 2**20, a.stats.allocated_bytes // 2**20
    (20, 3)
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.memory.allocator import expandable
from vram.memory.allocator.blocks import Block, Pool
from vram.memory.allocator.conf import AllocConf
from vram.memory.allocator.rules import (
    SMALL_BUFFER,
    allocation_size,
    is_small,
    may_serve,
    round_size,
    should_split,
)

#: Gap left between two made-up segment addresses (blocks merge only inside a segment anyway).
ADDRESS_GAP = SMALL_BUFFER
#: The made-up address space: segments are placed downwards from here.
ADDRESS_TOP = 1 << 56


class AllocatorOutOfMemory(Exception):
    """The model ran out of `capacity_bytes` after releasing every cached block it could."""

    def __init__(self, size: int, stats: Stats) -> None:
        super().__init__(f"out of memory: tried to allocate {size} bytes with "
                         f"{stats.reserved_bytes} reserved, {stats.allocated_bytes} allocated")
        self.size = size


@dataclass(slots=True)
class Stats:
    """PyTorch's counters (`torch.cuda.memory_stats()`), bytes and counts, all pools."""

    allocated_bytes: int = 0
    allocated_peak_bytes: int = 0
    reserved_bytes: int = 0
    reserved_peak_bytes: int = 0
    active_bytes: int = 0
    active_peak_bytes: int = 0
    requested_bytes: int = 0
    segments: int = 0
    num_alloc_retries: int = 0
    num_ooms: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0

    def reset_peaks(self) -> None:
        """`reset_peak_memory_stats`: every peak drops to its current value."""
        self.allocated_peak_bytes = self.allocated_bytes
        self.reserved_peak_bytes = self.reserved_bytes
        self.active_peak_bytes = self.active_bytes


class CachingAllocator:
    """One device's caching allocator (see the module docstring).

    `capacity_bytes` is what the driver can still hand this process (the device's memory minus
    the CUDA context and other processes); None: unlimited. `device_total_bytes` sizes the
    address space of an expandable segment and the memory fraction (default: the capacity).
    """

    def __init__(self, conf: AllocConf | None = None, *, capacity_bytes: int | None = None,
                 device_total_bytes: int | None = None) -> None:
        self.conf = conf or AllocConf()
        self.capacity_bytes = capacity_bytes
        self.device_total_bytes = device_total_bytes or capacity_bytes or 2**40
        self.stats = Stats()
        self.small = Pool(small=True)
        self.large = Pool(small=False)
        self._next_addr = ADDRESS_TOP
        self._pending: dict[int, list[Block]] = {}
        self.allowed_bytes: int | None = None
        if self.conf.memory_fraction is not None:
            self.allowed_bytes = int(self.conf.memory_fraction * self.device_total_bytes)

    # -- public API ----------------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int = 0) -> Block:
        """Hand out a block for `orig_size` bytes on `stream` (`DeviceCachingAllocator::malloc`)."""
        size = round_size(orig_size, self.conf.roundup_power2_divisions)
        pool = self.small if is_small(size) else self.large
        block = self._get_free_block(pool, stream, size)
        if block is None:
            if self.conf.gc_active:
                self._garbage_collect()
            block = self._alloc_block(pool, stream, size, retry=False)
            if block is None and self._release_available_cached_blocks(pool, stream, size):
                block = self._alloc_block(pool, stream, size, retry=False)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, stream, size, retry=True)
            if block is None:
                self.stats.num_ooms += 1
                raise AllocatorOutOfMemory(size, self.stats)
        split = should_split(block.size, size, small=pool.small,
                             expandable=self.conf.expandable_segments,
                             max_split=self.conf.max_split_size_bytes)
        return self._alloc_found_block(pool, block, size, orig_size, split)

    def free(self, block: Block) -> None:
        """Give a block back (`DeviceCachingAllocator::free`): cached at once, or once every
        stream that used it is done with it."""
        block.allocated = False
        stats = self.stats
        stats.allocated_bytes -= block.size
        stats.requested_bytes -= block.requested
        if block.stream_uses:
            block.event_count = len(block.stream_uses)
            for stream in block.stream_uses:
                self._pending.setdefault(stream, []).append(block)
            block.stream_uses = frozenset()
        else:
            self._free_block(block)

    def record_stream(self, block: Block, stream: int) -> None:
        """`recordStream`: `block` is used on `stream` too (ignored for its own stream)."""
        if stream != block.stream:
            block.stream_uses = block.stream_uses | {stream}

    def synchronize(self, stream: int | None = None) -> None:
        """The work queued on `stream` (every stream: None) is done: frees waiting on it finish
        (`process_events` finding the events complete, or `synchronize_and_free_events`)."""
        streams = list(self._pending) if stream is None else [stream]
        for s in streams:
            for block in self._pending.pop(s, []):
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)

    def empty_cache(self) -> None:
        """`torch.cuda.empty_cache()`: release every cached segment that is wholly free."""
        self._release_cached_blocks()

    # -- finding and handing out blocks ------------------------------------------------------------
    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        """The best-fit cached block, if one may serve the request (`get_free_block`)."""
        if self.conf.gc_active:
            pool.calls += 1
        index = pool.best_fit(stream, size)
        block = pool.at(stream, index)
        if block is None:
            return None
        if block.expandable:
            block = self._expandable_fit(pool, stream, index, block)
            if block is None:
                return None
        conf = self.conf
        if not may_serve(block.size, size, max_split=conf.max_split_size_bytes,
                         max_non_split_rounding=conf.max_non_split_rounding_bytes):
            return None
        pool.remove(block)
        return block

    def _expandable_fit(self, pool: Pool, stream: int, index: int, block: Block) -> Block | None:
        """With expandable segments on, a free block is as large as it can grow (its own size
        plus the unmapped range after it); with them off, expandable blocks are skipped."""
        if not self.conf.expandable_segments:
            while block is not None and block.expandable:
                index += 1
                block = pool.at(stream, index)  # type: ignore[assignment]
            return block
        while True:
            after = pool.at(stream, index + 1)
            if not block.expandable or after is None or \
                    expandable.grown_size(after) >= expandable.grown_size(block):
                return block
            index += 1
            block = after

    def _alloc_found_block(self, pool: Pool, block: Block, size: int, orig_size: int,
                           split: bool) -> Block:
        """Hand out `size` bytes of `block`, caching the rest if `split` (`alloc_found_block`)."""
        if split:
            rest = block
            block = Block(addr=rest.addr, size=size, stream=rest.stream, small=rest.small,
                          base=rest.base, page=rest.page)
            block.splice(rest.prev, rest)
            rest.addr += size
            rest.size -= size
            pool.insert(rest)
        block.allocated = True
        block.requested = orig_size
        stats = self.stats
        stats.allocated_bytes += block.size
        stats.allocated_peak_bytes = max(stats.allocated_peak_bytes, stats.allocated_bytes)
        stats.active_bytes += block.size
        stats.active_peak_bytes = max(stats.active_peak_bytes, stats.active_bytes)
        stats.requested_bytes += orig_size
        return block

    def _free_block(self, block: Block) -> None:
        """Cache a block that nothing uses any more, merged with its free neighbours."""
        pool = self.small if block.small else self.large
        size = block.size
        for neighbour in (block.prev, block.next):
            self.try_merge(block, neighbour, pool)
        pool.insert(block)
        self.stats.active_bytes -= size

    @staticmethod
    def try_merge(dst: Block, src: Block | None, pool: Pool) -> int:
        """Fold the free neighbour `src` into `dst`; its size, or 0 (`try_merge_blocks`)."""
        if src is None or not src.allocatable() or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        pool.remove_any(src)
        dst.size += src.size
        return src.size

    # -- segments ------------------------------------------------------------------------------
    def _alloc_block(self, pool: Pool, stream: int, size: int, *, retry: bool) -> Block | None:
        """Ask the driver for a new segment, or map more of an expandable one (`alloc_block`)."""
        if retry:
            self.stats.num_alloc_retries += 1
        alloc_size = allocation_size(size, self.conf.large_segment_bytes)
        if self.allowed_bytes is not None and \
                self.stats.reserved_bytes + alloc_size > self.allowed_bytes:
            return None
        if self.conf.expandable_segments:
            return expandable.try_allocate(self, pool, stream, size)
        if not self.device_has_room(alloc_size):
            return None
        block = Block(addr=self._take_address(alloc_size), size=alloc_size, stream=stream,
                      small=pool.small)
        self.add_reserved(alloc_size)
        self.stats.segments += 1
        return block

    def device_has_room(self, size: int) -> bool:
        """Whether `cudaMalloc` (or `cuMemCreate`) of `size` more bytes succeeds."""
        return self.capacity_bytes is None or \
            self.stats.reserved_bytes + size <= self.capacity_bytes

    def add_reserved(self, size: int) -> None:
        stats = self.stats
        stats.reserved_bytes += size
        stats.reserved_peak_bytes = max(stats.reserved_peak_bytes, stats.reserved_bytes)
        stats.num_device_alloc += 1

    def drop_reserved(self, size: int) -> None:
        self.stats.reserved_bytes -= size
        self.stats.num_device_free += 1

    def _take_address(self, size: int) -> int:
        """A fresh range below every earlier one (see the module docstring)."""
        self._next_addr -= size + ADDRESS_GAP
        return self._next_addr

    def take_address_space(self, size: int) -> int:
        """A range of made-up addresses for an expandable segment's address space."""
        return self._take_address(size)

    def _release_block(self, block: Block, pool: Pool) -> None:
        """`cudaFree` a wholly free segment (`release_block`)."""
        pool.remove(block)
        self.drop_reserved(block.size)
        self.stats.segments -= 1

    def _release_available_cached_blocks(self, pool: Pool, stream: int, size: int) -> bool:
        """With `max_split_size_mb` set: free one oversize cached block large enough, or the
        largest ones until enough is freed (`release_available_cached_blocks`)."""
        limit = self.conf.max_split_size_bytes
        if limit is None:
            return False
        want = max(size, limit)
        index = pool.best_fit(stream, want)
        found = pool.at(stream, index)
        if found is not None:
            self._release_block(found, pool)
            return True
        released = 0
        for block in reversed([pool.at(stream, i) for i in range(pool.count(stream))]):
            if block is None or released >= want or block.size < limit:
                break
            released += block.size
            self._release_block(block, pool)
        return released >= want

    def _release_cached_blocks(self) -> None:
        """Free every wholly free segment; unmap the free pages of expandable ones
        (`release_cached_blocks`, after `synchronize_and_free_events`)."""
        self.synchronize()
        for pool in (self.large, self.small):
            for block in pool.blocks():
                if block.expandable:
                    expandable.unmap(self, pool, block)
                elif not block.is_split():
                    self._release_block(block, pool)

    def _garbage_collect(self) -> None:
        """Free cached unsplit large blocks older than average until reserved is back under
        `garbage_collection_threshold` x the allowed memory (`garbage_collect_cached_blocks`)."""
        allowed = self.allowed_bytes or self.device_total_bytes
        threshold = int(self.conf.garbage_collection_threshold * allowed)
        if self.stats.reserved_bytes <= threshold:
            return
        target = self.stats.reserved_bytes - threshold
        pool = self.large
        ages = {id(b): pool.calls - b.gc_count_base for b in pool.blocks() if not b.is_split()}
        total_age, count, reclaimed, freed = sum(ages.values()), len(ages), 0, True
        while reclaimed < target and freed and count > 0:
            average = total_age / count
            freed = False
            for block in pool.blocks():
                age = ages.get(id(block))
                if age is not None and not block.is_split() and age >= average:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    del ages[id(block)]
                    self._release_block(block, pool)
