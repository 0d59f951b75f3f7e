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

Allocation events: beside the live total, the tracker logs the program's allocations and frees
in order (`alloc_log`: the bytes each storage asks for, before rounding, and when it dies), as
the CUDA caching allocator would see them: a gradient sum a GPU runs in place allocates nothing
(the sum's storage takes the first operand's block), and paged (unified) memory is not the
allocator's. `vram.trace.allocator` replays the log through `vram.memory.allocator` for the
reserved figure. Phase changes are logged as marks (`marks`).

Segments: the step driver labels where the program is (phase, and which repeated layer runs),
and the tracker keeps the peak within each label together with a snapshot of what was alive,
so that traces of two depths (two and three periods of blocks) can be extrapolated segment by
segment.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vram.memory.allocator.replay import ALLOC, FREE, MARK, Event
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
    result: int  # the sum's storage key
    first_id: int | None  # the allocation ids of the first operand and of the sum
    result_id: int | None


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
        self.alloc_log: list[Event] = []  # see "Allocation events" above
        self.marks: list[str] = []  # MARK k in the log: the phase `marks[k]` begins
        self.steps_end = 0  # where the traced steps end in the log (set by the step driver)
        self._alloc_ids: dict[int, int] = {}  # live storage key -> its allocation id
        self._dropped: set[int] = set()  # positions in `alloc_log` a GPU does not see
        self._block_refs: dict[int, int] = {}  # allocation id -> storages sharing its block
        #: (position in `alloc_log`, phase): where each phase ran its first cuBLAS matmul (a
        #: GPU allocates the cuBLAS workspace of the thread's handle there).
        self.first_matmuls: list[tuple[int, str]] = []

    # -- registration -------------------------------------------------------------------------
    @staticmethod
    def key(storage: torch.UntypedStorage) -> int:
        return id(storage)

    def _forget(self, key: int) -> None:
        info = self.live.pop(key, None)
        if info is not None:
            self.live_bytes -= info.nbytes
        alloc_id = self._alloc_ids.pop(key, None)
        if alloc_id is not None:
            refs = self._block_refs.pop(alloc_id, 1) - 1
            if refs:  # another storage still writes into this block
                self._block_refs[alloc_id] = refs
            else:
                self.alloc_log.append((FREE, alloc_id, 0, 0))

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
        if storage.nbytes():  # the allocator hands out nothing for 0 bytes
            self._alloc_ids[key] = alloc_id = len(self.alloc_log)
            self.alloc_log.append((ALLOC, alloc_id, storage.nbytes(), 0))
        weakref.finalize(storage, self._forget, key)

    def exclude(self, tensor: torch.Tensor) -> None:
        """Mark `tensor`'s storage as living outside torch's allocator (paged/unified memory)."""
        storage = tensor.untyped_storage()
        key = self.key(storage)
        if key in self.excluded:
            return
        alloc_id = self._alloc_ids.pop(key, None)
        if alloc_id is not None:  # never the caching allocator's (an id is its ALLOC's position)
            self._dropped.add(alloc_id)
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
        self.alloc_log.append((MARK, len(self.marks), 0, 0))
        self.marks.append(phase)

    @property
    def dropped_events(self) -> frozenset[int]:
        """Positions in `alloc_log` the caching allocator does not see (see above)."""
        return frozenset(self._dropped)

    def allocator_events(self) -> list[Event]:
        """The allocation log as the caching allocator sees it (see "Allocation events")."""
        dropped = self._dropped
        return [e for i, e in enumerate(self.alloc_log) if i not in dropped]

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

    def _hold_sum(self, first: torch.Tensor, out: torch.Tensor) -> None:
        """An engine-made `first + other` just ran: decide at the next event how a GPU ran it."""
        live = self.live_bytes
        snapshot = self._snapshot(live) if self._would_be_peak(live) else None
        first_key, out_key = self.storage_key(first), self.storage_key(out)
        self._pending = _PendingSum(first_key, live, snapshot, out_key,
                                    self._alloc_ids.get(first_key), self._alloc_ids.get(out_key))

    def _log_scratch(self, sizes: list[int]) -> None:
        """A kernel's scratch buffers: allocated after its outputs, freed before it returns."""
        ids = []
        for size in sizes:
            if size:
                ids.append(len(self.alloc_log))
                self.alloc_log.append((ALLOC, ids[-1], size, 0))
        self.alloc_log.extend((FREE, i, 0, 0) for i in ids)

    def _share_block(self, first: torch.Tensor, out: torch.Tensor) -> None:
        """Log `out` as written into `first`'s block (an in-place op a dispatch mode sees out of
        place): no allocation; the block is freed when both are dead. The live count is left."""
        out_key, first_key = self.storage_key(out), self.storage_key(first)
        out_id, first_id = self._alloc_ids.get(out_key), self._alloc_ids.get(first_key)
        if out_id is None or first_id is None:
            return
        self._dropped.add(out_id)
        self._alloc_ids[out_key] = first_id
        self._block_refs[first_id] = self._block_refs.get(first_id, 1) + 1

    def settle(self) -> None:
        """Account a held-back gradient sum: in place if its first operand died with it."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.first_operand in self.live:  # still referenced: a GPU sums out of place too
            self._record(pending.live, pending.snapshot)
        else:  # the sum took the first operand's place, as `old.add_(new)` does on a GPU
            self._in_place(pending)
            self._record(self.live_bytes)

    def _in_place(self, pending: _PendingSum) -> None:
        """Log the sum as the GPU ran it: the result's storage is the first operand's block (its
        allocation and the operand's free are not the allocator's events)."""
        first_id, out_id = pending.first_id, pending.result_id
        if first_id is None or out_id is None or pending.result not in self._alloc_ids:
            return
        freed = next((i for i in range(len(self.alloc_log) - 1, out_id, -1)
                      if self.alloc_log[i][:2] == (FREE, first_id)), None)
        if freed is None:
            return
        self._dropped.update((out_id, freed))
        self._alloc_ids[pending.result] = first_id

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
        scratch = KERNEL_SCRATCH.get(func)
        if scratch is not None:
            self._log_scratch(scratch(args))
        if func in _CUBLAS_OPS and all(p != self.phase for _, p in self.first_matmuls):
            self.first_matmuls.append((len(self.alloc_log), self.phase))
        if (self.between_nodes and _gradient_sum(func, args, kwargs, out)) or \
                _index_backward_put(func, args, out):
            self._hold_sum(args[0], out)
        elif _IN_MATH_SDPA.get() and _mask_add(func, args, out):
            self._share_block(args[0], out)
            self._record(self.live_bytes)
        else:
            self._record(self.live_bytes)
        return out


#: Ops whose CUDA kernel allocates scratch space through the caching allocator inside the op
#: (invisible to a dispatch mode): op -> the scratch sizes for its arguments. The allocation
#: log gets them after the op's outputs and frees them before the op returns; the live count
#: is left as it was.
KERNEL_SCRATCH: dict[Any, Callable[[Any], list[int]]] = {}

_IN_MATH_SDPA: contextvars.ContextVar[bool] = contextvars.ContextVar("in_math_sdpa", default=False)


@contextlib.contextmanager
def math_sdpa() -> Iterator[None]:
    """Inside: PyTorch's math attention (`_scaled_dot_product_attention_math`) runs. It adds the
    mask to the scores in place (`attn.add_(mask)`) unless a tensor is subclass-like, as every
    tensor is under a dispatch mode (`attn.add(mask)`: aten/src/ATen/native/transformers/
    attention.cpp). The allocation log records the GPU's in-place add; the live count is left
    as it was (a figure the trace reports)."""
    token = _IN_MATH_SDPA.set(True)
    try:
        yield
    finally:
        _IN_MATH_SDPA.reset(token)


#: The aten matmuls CUDA runs through cuBLAS / cuBLASLt (aten/src/ATen/native/cuda/Blas.cpp).
_CUBLAS_OPS = frozenset({
    torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default, torch.ops.aten.addbmm.default, torch.ops.aten.mv.default,
    torch.ops.aten.addmv.default, torch.ops.aten._addmm_activation.default,
})


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


def _mask_add(func: Any, args: Any, out: Any) -> bool:
    """Is this the math SDPA's `attn.add(mask)` (the mask broadcasts over the scores)?"""
    if func is not torch.ops.aten.add.Tensor or len(args) != 2:
        return False
    return isinstance(args[0], torch.Tensor) and _reusable(args[0], out)


def _gradient_sum(func: Any, args: Any, kwargs: Any, out: Any) -> bool:
    """Is this the engine's `old + new` that a GPU may run as `old.add_(new)`?"""
    if func is not torch.ops.aten.add.Tensor or kwargs or len(args) != 2:
        return False
    first, second = args
    if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
        return False
    return second.shape == first.shape and _reusable(first, out)
