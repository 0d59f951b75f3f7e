"""Replay a program's allocations and frees through the caching allocator model.

An event is a tuple `(kind, key, size, stream)`:

* `ALLOC`: `key` asks for `size` bytes on `stream` (the bytes the tensor's storage asks for,
  before rounding);
* `FREE`: `key` is given back;
* `RECORD_STREAM`: `key` is used on `stream` too (`Tensor.record_stream`);
* `SYNC`: the work queued on `stream` (-1: every stream) is done;
* `EMPTY_CACHE`: `torch.cuda.empty_cache()`;
* `RESET_PEAKS`: `torch.cuda.reset_peak_memory_stats()`;
* `MARK`: nothing happens; `key` names a point of the program (`ReplayResult.marks`).

    >>> events = [(ALLOC, 1, 3 << 20, 0), (FREE, 1, 0, 0), (ALLOC, 2, 30 << 20, 0)]
    >>> result = replay(events)
    >>> result.reserved_peak_bytes >> 20, result.allocated_peak_bytes >> 20
    (50, 30)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vram.memory.allocator.blocks import Block
from vram.memory.allocator.caching import AllocatorOutOfMemory, CachingAllocator
from vram.memory.allocator.conf import AllocConf

ALLOC, FREE, RECORD_STREAM, SYNC, EMPTY_CACHE, RESET_PEAKS, MARK = range(1, 8)

Event = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class Moment:
    """The counters at a marked point of the program."""

    key: int
    allocated_bytes: int
    reserved_bytes: int
    reserved_peak_bytes: int


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What the allocator held: peaks since the last `RESET_PEAKS`, and at the end."""

    allocated_peak_bytes: int
    reserved_peak_bytes: int
    active_peak_bytes: int
    allocated_end_bytes: int
    reserved_end_bytes: int
    segments_end: int
    num_alloc_retries: int
    num_ooms: int
    #: The index of the event that ran out of `capacity_bytes` (None: it fit).
    oom_at: int | None
    events: int
    marks: tuple[Moment, ...] = field(default=())

    @property
    def slack_bytes(self) -> int:
        """Reserved minus allocated at their peaks: what fragmentation and caching cost."""
        return self.reserved_peak_bytes - self.allocated_peak_bytes


def replay(events: Iterable[Event], conf: AllocConf | None = None, *,
           capacity_bytes: int | None = None,
           device_total_bytes: int | None = None) -> ReplayResult:
    """Run `events` through a fresh `CachingAllocator`; stops at an out-of-memory error."""
    alloc = CachingAllocator(conf, capacity_bytes=capacity_bytes,
                             device_total_bytes=device_total_bytes)
    live: dict[int, Block] = {}
    marks: list[Moment] = []
    stats = alloc.stats
    oom_at: int | None = None
    count = 0
    for count, (kind, key, size, stream) in enumerate(events, start=1):
        if kind == ALLOC:
            try:
                live[key] = alloc.malloc(size, stream)
            except AllocatorOutOfMemory:
                oom_at = count - 1
                break
        elif kind == FREE:
            alloc.free(live.pop(key))
        elif kind == RECORD_STREAM:
            alloc.record_stream(live[key], stream)
        elif kind == SYNC:
            alloc.synchronize(None if stream < 0 else stream)
        elif kind == EMPTY_CACHE:
            alloc.empty_cache()
        elif kind == RESET_PEAKS:
            stats.reset_peaks()
        elif kind == MARK:
            marks.append(Moment(key, stats.allocated_bytes, stats.reserved_bytes,
                                stats.reserved_peak_bytes))
        else:
            raise ValueError(f"event {count - 1}: unknown kind {kind}")
    return ReplayResult(
        allocated_peak_bytes=stats.allocated_peak_bytes,
        reserved_peak_bytes=stats.reserved_peak_bytes,
        active_peak_bytes=stats.active_peak_bytes,
        allocated_end_bytes=stats.allocated_bytes, reserved_end_bytes=stats.reserved_bytes,
        segments_end=stats.segments, num_alloc_retries=stats.num_alloc_retries,
        num_ooms=stats.num_ooms, oom_at=oom_at, events=count, marks=tuple(marks),
    )
