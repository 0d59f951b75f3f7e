"""The tracker accounts autograd's gradient sums as a GPU runs them: in place.

Under any dispatch mode autograd sums two gradients of one tensor out of place (`old + new`);
without one it runs `old.add_(new)` when the buffer holds the last reference. These tests use
real CPU tensors, so the numbers are exact and small.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from vram.trace.tracker import StorageTracker  # noqa: E402

pytestmark = pytest.mark.trace

N = 128 * 1024  # fp32 values: 512 KiB, a whole number of 512-byte blocks
BLOCK = 4 * N
SCALAR = 512  # the loss's gradient (ones_like of a 0-dim tensor): one 512-byte block


def backward_peak(watch: bool, share_first: bool = False) -> int:
    """Peak live bytes during the backward of `(2a + 3a).sum()`, the leaf `a` not counted."""
    return backward_tracker(watch, share_first).peaks[("backward",)].live


def backward_tracker(watch: bool, share_first: bool = False) -> StorageTracker:
    """The tracker that watched the backward of `(2a + 3a).sum()`."""
    a = torch.ones(N, requires_grad=True)
    loss = (a * 2 + a * 3).sum()
    tracker = StorageTracker()
    keep: list[torch.Tensor] = []
    with tracker:
        tracker.set_phase("backward")
        tracker.recording = True
        if share_first:
            # hooks keep both gradients referenced: a GPU must sum out of place too
            for mul, _ in loss.grad_fn.next_functions[0][0].next_functions:
                mul.register_hook(lambda grads, _outs: keep.append(grads[0]))
        with tracker.watching_backward(loss) if watch else contextlib.nullcontext():
            loss.backward()
        tracker.sample()
    assert a.grad is not None and float(a.grad[0]) == 5.0
    return tracker


def test_gradient_sum_is_in_place_as_on_a_gpu() -> None:
    # Two gradients of `a` (2·g and 3·g) exist, then are summed into the first: 2 blocks.
    assert backward_peak(watch=True) == 2 * BLOCK + SCALAR


def test_unwatched_mode_sees_the_out_of_place_sum() -> None:
    # What any dispatch mode sees: the sum is a third tensor.
    assert backward_peak(watch=False) == 3 * BLOCK + SCALAR


def test_sum_stays_out_of_place_when_the_first_gradient_is_referenced() -> None:
    assert backward_peak(watch=True, share_first=True) == 3 * BLOCK + SCALAR


def test_index_backward_writes_into_its_zeros() -> None:
    x = torch.ones(N, requires_grad=True)
    idx = torch.arange(0, N, 2)
    tracker = StorageTracker()
    with tracker:
        loss = x[idx].sum()
        tracker.set_phase("backward")
        tracker.recording = True
        with tracker.watching_backward(loss):
            loss.backward()
        tracker.sample()
    # x's gradient (zeros, written in place), the loss and its gradient
    assert tracker.peaks[("backward",)].live == BLOCK + 2 * SCALAR


def test_a_region_label_dies_with_its_storage() -> None:
    """The sharded tracker labels what FSDP2's all-gather and reduce-scatter allocate by the
    storage's key (its `id()`); a dead storage's label must go with it, or the next storage
    at the same address (the logits, once) is counted as a reduce-scatter buffer."""
    import gc

    from vram.trace.sharded import REDUCING, ShardedTracker

    tracker = ShardedTracker()
    tracker.region = REDUCING
    buffer = torch.empty(N)
    tracker.register(buffer)
    key = tracker.storage_key(buffer)
    assert tracker.region_keys == {key: REDUCING}
    tracker.region = ""
    del buffer
    gc.collect()
    assert tracker.region_keys == {}
    logits = torch.empty(N)
    tracker.register(logits)  # made outside any region: no label, whatever its address
    assert tracker.storage_key(logits) not in tracker.region_keys
