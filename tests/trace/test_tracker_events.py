"""The tracker's allocation log: what the caching allocator would be asked for, in order.

Real CPU tensors, so sizes are exact; the replay through `vram.memory.allocator` gives the
allocated peak the tracker itself counts.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from tests.trace.test_tracker import BLOCK, N, backward_tracker  # noqa: E402
from vram.memory.allocator import ALLOC, FREE, MARK, replay  # noqa: E402
from vram.trace.tracker import StorageTracker  # noqa: E402

pytestmark = pytest.mark.trace


def test_allocations_and_frees_are_logged_in_order() -> None:
    tracker = StorageTracker()
    with tracker:
        tracker.set_phase("forward")
        a = torch.ones(N)
        b = a * 2
        del a
        c = b.view(-1, 2)  # a view: no storage of its own
        d = torch.empty(0)  # zero bytes: the allocator is not asked
    events = tracker.allocator_events()
    kinds = [(k, size) for k, _, size, _ in events]
    assert kinds == [(MARK, 0), (ALLOC, BLOCK), (ALLOC, BLOCK), (FREE, 0)]
    assert events[3][1] == events[1][1]  # the freed id is a's
    assert tracker.marks == ["forward"]
    del b, c, d


@pytest.mark.parametrize("share_first", [False, True])
def test_replayed_log_peaks_where_the_tracker_peaks(share_first: bool) -> None:
    # The in-place gradient sum: no third block in the log either (and out of place when the
    # first gradient stays referenced); the replay's allocated peak is the tracker's.
    tracker = backward_tracker(watch=True, share_first=share_first)
    events, live_peak = tracker.allocator_events(), tracker.peaks[("backward",)].live
    assert replay(events).allocated_peak_bytes == live_peak
    blocks = sum(1 for kind, _, size, _ in events if kind == ALLOC and size == BLOCK)
    assert blocks == (3 if share_first else 2)


def test_paged_storage_is_not_the_allocators() -> None:
    tracker = StorageTracker()
    with tracker:
        t = torch.zeros(N)
    tracker.exclude(t)
    assert [e for e in tracker.allocator_events() if e[0] in (ALLOC, FREE)] == []


def test_first_matmul_of_each_phase_is_noted() -> None:
    tracker = StorageTracker()
    w = torch.ones(8, 8)
    with tracker:
        tracker.set_phase("forward")
        x = torch.ones(4, 8)
        y = x @ w
        z = y @ w
        tracker.set_phase("backward")
        _ = z @ w
    phases = [phase for _, phase in tracker.first_matmuls]
    assert phases == ["forward", "backward"]


def _math_attention(flagged: bool) -> tuple[int, int]:
    """(score-sized allocations in the log, live peak) of one causal math SDPA call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vram.trace.tracker import math_sdpa

    q = torch.ones(1, 2, 256, 16)
    tracker = StorageTracker()
    with tracker, sdpa_kernel(SDPBackend.MATH):
        tracker.set_phase("forward")
        tracker.recording = True
        with math_sdpa() if flagged else contextlib.nullcontext():
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        tracker.sample()
    scores = 1 * 2 * 256 * 256 * 4
    allocs = sum(1 for kind, _, size, _ in tracker.allocator_events()
                 if kind == ALLOC and size == scores)
    return allocs, tracker.peaks[("forward",)].live


def test_math_attention_adds_its_mask_in_place_in_the_log() -> None:
    """PyTorch's math SDPA adds the causal mask to the scores in place on a GPU; under a
    dispatch mode it adds out of place. The log follows the GPU; the live count does not move."""
    plain_allocs, plain_peak = _math_attention(flagged=False)
    gpu_allocs, gpu_peak = _math_attention(flagged=True)
    assert (plain_allocs, gpu_allocs) == (3, 2)  # matmul, (add), softmax
    assert gpu_peak == plain_peak
