"""PyTorch's CUDA caching allocator, modelled: what `torch.cuda.max_memory_reserved()` reports.

Pure Python (no torch). Feed it a program's allocations and frees (`replay`, or
`CachingAllocator.malloc`/`free` directly) and it keeps the segments PyTorch would have asked
the driver for under the settings of `PYTORCH_CUDA_ALLOC_CONF` (`parse_alloc_conf`).

    >>> from vram.memory.allocator import ALLOC, FREE, parse_alloc_conf, replay
    >>> events = [(ALLOC, 1, 300 << 20, 0), (FREE, 1, 0, 0), (ALLOC, 2, 301 << 20, 0)]
    >>> replay(events).reserved_peak_bytes >> 20  # the 300 MiB block cannot hold 301 MiB
    602
    >>> replay(events, parse_alloc_conf("expandable_segments:True")).reserved_peak_bytes >> 20
    320
"""

from vram.memory.allocator.caching import AllocatorOutOfMemory, CachingAllocator, Stats
from vram.memory.allocator.conf import AllocConf, parse_alloc_conf
from vram.memory.allocator.replay import (
    ALLOC,
    EMPTY_CACHE,
    FREE,
    MARK,
    RECORD_STREAM,
    RESET_PEAKS,
    SYNC,
    Event,
    Moment,
    ReplayResult,
    replay,
)

__all__ = [
    "ALLOC", "EMPTY_CACHE", "FREE", "MARK", "RECORD_STREAM", "RESET_PEAKS", "SYNC",
    "AllocConf", "AllocatorOutOfMemory", "CachingAllocator", "Event", "Moment", "ReplayResult",
    "Stats", "parse_alloc_conf", "replay",
]
