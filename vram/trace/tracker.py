"""Live-storage accounting for a step run on fake tensors.

`StorageTracker` is a `TorchDispatchMode`: every aten op that runs under it reports its output
tensors, and the tracker registers each *untyped storage* once (views and in-place results share
their base's storage, so they are not counted twice). A `weakref.finalize` on the storage's Python
object (PyTorch keeps one per live storage) removes it when the storage dies, so "live bytes" is
exactly what a CUDA caching allocator would have handed out at that moment.

Rounding: the CUDA caching allocator serves every request in blocks whose size is a multiple of
512 bytes (`kMinBlockSize`), and `torch.cuda.memory_allocated()` counts the rounded block sizes.
Each storage is therefore counted as `ceil(nbytes / 512) * 512` (0 stays 0).

Autograd's gradient sums: when two paths send a gradient to the same tensor, autograd's
`InputBuffer::accumulate` adds them. On a GPU it adds in place into the first gradient when the
buffer holds that tensor's last reference (`old.add_(new)`); under any `TorchDispatchMode` every
tensor counts as "subclass-like" (fake tensors do too), so the same line runs out of place
(`old + new`) and a third tensor appears that a GPU never allocates
(torch/csrc/autograd/input_buffer.cpp, `can_accumulate_inplace`). `watching_backward` marks when
the engine, not a node's formula, runs (`between_nodes`); such an add is held back for one
event, and if its first operand's storage died with it (the buffer held the last reference) it
is accounted as the GPU runs it: in place. A Mixtral expert bank's gradient, summed over eight
experts' `select_backward` outputs, was a whole bank too large at the first layer's backward
before this. The same holds for `index_backward` (the gradient of `x[indices]`, which MoE
layers gather tokens with): `_index_put_impl_` into its zeros on a GPU, `zeros.index_put(...)`
under a mode.

Segments: the step driver labels where the program is (phase, and which repeated layer runs),
and the tracker keeps the peak within each label together with a snapshot of what was alive,
so that traces of two depths (two and three periods of blocks) can be extrapolated segment by
segment.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vram.model.params import allocated_bytes

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


@dataclass
class _PendingSum:
    """An out-of-place gradient sum waiting to learn whether a GPU would have run it in place."""

    first_operand: int
    live: int
    snapshot: SegmentPeak | None


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
        self.between_nodes = False  # autograd's engine runs between two nodes (sums gradients)
        self._pending: _PendingSum | None = None

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
        self.settle()
        self.phase = phase
        self.segment = (phase, *where) if where else (phase,)

    def set_segment(self, *where: str) -> None:
        self.settle()
        self.segment = (self.phase, *where)

    # -- sampling -----------------------------------------------------------------------------
    def sample(self) -> None:
        """Record the current live total on the timeline and in the current segment's peak."""
        self.settle()
        self._record(self.live_bytes)

    def _record(self, live: int, snapshot: SegmentPeak | None = None) -> None:
        self.events += 1
        self.timeline.append((self.events, live, self.phase))
        if self._would_be_peak(live):
            self.peaks[self.segment] = snapshot or self._snapshot(live)

    def _would_be_peak(self, live: int) -> bool:
        peak = self.peaks.get(self.segment)
        return self.recording and (peak is None or live > peak.live)

    # -- autograd's gradient sums -------------------------------------------------------------
    @contextlib.contextmanager
    def watching_backward(self, loss: torch.Tensor) -> Iterator[None]:
        """Inside: `between_nodes` says when autograd's engine, not a node's formula,
        dispatches an op. Every node of `loss`'s backward graph is hooked; between a node's
        post-hook and the next node's pre-hook the engine only sums gradients into its input
        buffers."""

        def before(_grads: Any) -> None:
            self.between_nodes = False

        def after(_grad_inputs: Any, _grad_outputs: Any) -> None:
            self.between_nodes = True

        seen: set[int] = set()
        todo = [loss.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            node.register_prehook(before)
            node.register_hook(after)
            todo.extend(child for child, _ in node.next_functions)
        try:
            yield
        finally:
            self.between_nodes = False

    def _hold_sum(self, first: torch.Tensor) -> None:
        """An engine-made `first + other` just ran: decide at the next event how a GPU ran it."""
        live = self.live_bytes
        snapshot = self._snapshot(live) if self._would_be_peak(live) else None
        self._pending = _PendingSum(self.storage_key(first), live, snapshot)

    def settle(self) -> None:
        """Account a held-back gradient sum: in place if its first operand died with it."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.first_operand in self.live:  # still referenced: a GPU sums out of place too
            self._record(pending.live, pending.snapshot)
        else:  # the sum took the first operand's place, as `old.add_(new)` does on a GPU
            self._record(self.live_bytes)

    def _snapshot(self, live: int) -> SegmentPeak:
        classes = self.classifier() if self.classifier is not None else {}
        buckets = {"weights": 0, "gradients": 0, "optimizer": 0, "activations": 0}
        for key, info in self.live.items():
            bucket = classes.get(key, "activations")
            buckets[bucket] = buckets.get(bucket, 0) + info.nbytes
        biggest = sorted(self.live.items(), key=lambda kv: -kv[1].nbytes)[:TOP_TENSORS]
        top = [
            (f"{info.origin} {info.dtype}{list(info.shape)}", info.nbytes,
             classes.get(key, "activations"))
            for key, info in biggest
        ]
        return SegmentPeak(live=live, phase=self.phase, buckets=buckets, top=top)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.settle()
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        name = getattr(func, "__name__", str(func))
        for item in flat:
            if isinstance(item, torch.Tensor):
                self.register(item, name)
        if (self.between_nodes and _gradient_sum(func, args, kwargs, out)) or \
                _index_backward_put(func, args, out):
            self._hold_sum(args[0])
        else:
            self._record(self.live_bytes)
        return out


def _index_backward_put(func: Any, args: Any, out: Any) -> bool:
    """Is this `index_backward`'s `zeros.index_put(indices, grad, accumulate=True)`, which a GPU
    runs in place (`_index_put_impl_`) and a dispatch mode out of place
    (torch/csrc/autograd/FunctionsManual.cpp `index_backward`)?"""
    if func is not torch.ops.aten.index_put.default or len(args) < 4 or args[3] is not True:
        return False
    return torch._C._current_autograd_node() is not None and _reusable(args[0], out)


def _reusable(first: torch.Tensor, out: Any) -> bool:
    """Could `out` have been written into `first`'s storage (same shape and dtype, dense)?"""
    if not isinstance(out, torch.Tensor) or first.shape != out.shape or first.dtype != out.dtype:
        return False
    whole = first.untyped_storage().nbytes() == first.numel() * first.element_size()
    return bool(whole and is_non_overlapping_and_dense_or_false(first))


def _gradient_sum(func: Any, args: Any, kwargs: Any, out: Any) -> bool:
    """Is this the engine's `old + new` that a GPU may run as `old.add_(new)`?"""
    if func is not torch.ops.aten.add.Tensor or kwargs or len(args) != 2:
        return False
    first, second = args
    if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
        return False
    return second.shape == first.shape and _reusable(first, out)
