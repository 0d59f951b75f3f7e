"""Live-storage accounting for a step run on fake tensors.

`StorageTracker` is a `TorchDispatchMode`: every aten op that runs under it reports its output
tensors, and the tracker registers each *untyped storage* once (views and in-place results share
their base's storage, so they are not counted twice). A `weakref.finalize` on the storage's Python
object (PyTorch keeps one per live storage) removes it when the storage dies, so "live bytes" is
exactly what a CUDA caching allocator would have handed out at that moment.

Rounding: the CUDA caching allocator serves every request in blocks whose size is a multiple of
512 bytes (`kMinBlockSize`), and `torch.cuda.memory_allocated()` counts the rounded block sizes.
Each storage is therefore counted as `ceil(nbytes / 512) * 512` (0 stays 0).

Segments: the step driver labels where the program is (phase, and which repeated layer runs),
and the tracker keeps the peak within each label together with a snapshot of what was alive,
so that traces of two depths (two and three periods of blocks) can be extrapolated segment by
segment.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vram.params import allocated_bytes

#: How many of the largest live storages a peak lists (`TraceResult.top_tensors`).
TOP_TENSORS = 12


@dataclass
class StorageInfo:
    """One live storage: its charged bytes and what first produced it."""

    nbytes: int
    origin: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class SegmentPeak:
    """The largest live total seen inside one labelled segment, and what was alive then."""

    live: int
    phase: str
    buckets: dict[str, int] = field(default_factory=dict)
    top: list[tuple[str, int, str]] = field(default_factory=list)


#: Callback returning, for the storages that are not activations, their bucket name.
Classifier = Callable[[], dict[int, str]]


class StorageTracker(TorchDispatchMode):
    """Counts live tensor storages, op by op, and keeps per-segment peaks and a timeline."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, StorageInfo] = {}
        self.live_bytes = 0
        self.excluded: set[int] = set()  # storages outside torch's counters (paged memory)
        self.excluded_bytes = 0
        self.phase = "setup"
        self.segment: tuple[str, ...] = ("setup",)
        self.events = 0
        self.timeline: list[tuple[int, int, str]] = []
        self.peaks: dict[tuple[str, ...], SegmentPeak] = {}
        self.classifier: Classifier | None = None
        self.recording = False

    # -- registration -------------------------------------------------------------------------
    @staticmethod
    def key(storage: torch.UntypedStorage) -> int:
        return id(storage)

    def _forget(self, key: int) -> None:
        info = self.live.pop(key, None)
        if info is not None:
            self.live_bytes -= info.nbytes

    def register(self, tensor: torch.Tensor, origin: str = "") -> None:
        """Count `tensor`'s storage if it is not counted yet."""
        storage = tensor.untyped_storage()
        key = self.key(storage)
        if key in self.live or key in self.excluded:
            return
        info = StorageInfo(allocated_bytes(storage.nbytes()), origin, tuple(tensor.shape),
                           str(tensor.dtype).removeprefix("torch."))
        self.live[key] = info
        self.live_bytes += info.nbytes
        weakref.finalize(storage, self._forget, key)

    def exclude(self, tensor: torch.Tensor) -> None:
        """Mark `tensor`'s storage as living outside torch's allocator (paged/unified memory)."""
        storage = tensor.untyped_storage()
        key = self.key(storage)
        if key in self.excluded:
            return
        if key in self.live:
            self._forget(key)
        self.excluded.add(key)
        self.excluded_bytes += storage.nbytes()

        def _drop(k: int = key) -> None:
            self.excluded.discard(k)

        weakref.finalize(storage, _drop)

    def storage_key(self, tensor: torch.Tensor) -> int:
        return self.key(tensor.untyped_storage())

    # -- labels -------------------------------------------------------------------------------
    def set_phase(self, phase: str, *where: str) -> None:
        self.phase = phase
        self.segment = (phase, *where) if where else (phase,)

    def set_segment(self, *where: str) -> None:
        self.segment = (self.phase, *where)

    # -- sampling -----------------------------------------------------------------------------
    def sample(self) -> None:
        """Record the current live total on the timeline and in the current segment's peak."""
        self.events += 1
        live = self.live_bytes
        self.timeline.append((self.events, live, self.phase))
        if not self.recording:
            return
        peak = self.peaks.get(self.segment)
        if peak is None or live > peak.live:
            self.peaks[self.segment] = self._snapshot(live)

    def _snapshot(self, live: int) -> SegmentPeak:
        classes = self.classifier() if self.classifier is not None else {}
        buckets = {"weights": 0, "gradients": 0, "optimizer": 0, "activations": 0}
        for key, info in self.live.items():
            buckets[classes.get(key, "activations")] += info.nbytes
        biggest = sorted(self.live.items(), key=lambda kv: -kv[1].nbytes)[:TOP_TENSORS]
        top = [
            (f"{info.origin} {info.dtype}{list(info.shape)}", info.nbytes,
             classes.get(key, "activations"))
            for key, info in biggest
        ]
        return SegmentPeak(live=live, phase=self.phase, buckets=buckets, top=top)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        name = getattr(func, "__name__", str(func))
        for item in flat:
            if isinstance(item, torch.Tensor):
                self.register(item, name)
        self.sample()
        return out
