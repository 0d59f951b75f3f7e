"""Every cache is bounded by entries and by bytes (issue 25), and a bound changes no figure."""

from __future__ import annotations

import sys
import threading

import pytest

from vram import TrainingSetup, estimate, fit, load_model, memo
from vram.memo import BoundedCache, approx_bytes, cached_in


def test_approx_bytes_counts_what_an_object_holds_once() -> None:
    payload = "x" * 10_000
    assert approx_bytes(payload) == sys.getsizeof(payload)
    # the same string twice is counted once; a second distinct string is counted again
    assert approx_bytes([payload, payload]) == sys.getsizeof([payload, payload]) + sys.getsizeof(
        payload)
    other = "y" * 10_000
    assert approx_bytes([payload, other]) > 2 * 10_000
    # a pydantic model: its fields' values are counted, an opaque type is not entered
    setup = TrainingSetup(method="lora")
    assert approx_bytes(setup) > sys.getsizeof(setup) + sys.getsizeof(setup.__dict__)
    assert approx_bytes([setup], opaque=(TrainingSetup,)) == sys.getsizeof([setup])


def test_bounded_cache_keeps_at_most_its_entries_and_bytes() -> None:
    cache: BoundedCache[int, str] = BoundedCache(max_entries=5, max_bytes=10**9)
    for i in range(20):
        cache.put(i, str(i))
    assert len(cache) == 5 and cache.held_keys() == [15, 16, 17, 18, 19]

    big = 10_000  # each value about 10 KB: a 35 KB budget holds three
    cache = BoundedCache(max_entries=100, max_bytes=35_000)
    for i in range(10):
        cache.put(i, "v" * big + str(i))
    assert len(cache) == 3 and cache.bytes <= 35_000
    assert cache.held_keys() == [7, 8, 9]
    assert cache.get(7) is not None  # 7 is now the most recently used: 8 goes next
    cache.put(10, "v" * big)
    assert cache.held_keys() == [9, 7, 10]
    cache.put(11, "v" * 100_000)  # larger than the whole budget: returned, never kept
    assert 11 not in cache and len(cache) == 3


def test_a_sampled_kind_is_charged_its_measured_mean() -> None:
    cache: BoundedCache[tuple[str, int], str] = BoundedCache(
        max_entries=1000, max_bytes=10**9, kind=lambda key: key[0], measure_first=2,
        measure_every=1000)
    cache.put(("a", 0), "a" * 1000)
    cache.put(("a", 1), "a" * 3000)
    first_two = cache.bytes
    cache.put(("a", 2), "a" * 50)  # not measured: charged the mean of the first two
    assert cache.bytes - first_two == first_two // 2


def test_cached_in_keeps_results_under_one_bound_and_clears_by_function() -> None:
    cache: BoundedCache[tuple[str, object], object] = BoundedCache(max_entries=3,
                                                                    max_bytes=10**9)
    calls: list[int] = []

    @cached_in(cache)
    def square(n: int) -> int:
        calls.append(n)
        return n * n

    @cached_in(cache)
    def cube(n: int) -> int:
        return n ** 3

    assert [square(2), square(2), cube(2)] == [4, 4, 8] and calls == [2]
    square.cache_clear()  # type: ignore[attr-defined]
    assert [k[0] for k in cache.held_keys()] == [cube.__qualname__]
    for n in range(10):
        square(n)
    assert len(cache) == 3


def test_the_memo_is_bounded_and_an_evicted_entry_is_recomputed_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    small: BoundedCache[tuple[int, object], object] = BoundedCache(
        max_entries=40, max_bytes=400_000, kind=memo._memo_kind, on_evict=memo._forget)
    monkeypatch.setattr(memo, "_MEMO", small)
    memo.clear_memo()
    model = load_model("llama-3.1-8b")
    setups = [TrainingSetup(method=m, seq_len=s, micro_batch=b)
              for m in ("full", "lora", "qlora") for s in (512, 1024, 2048, 4096)
              for b in (1, 3)]
    first = [estimate(model, s).model_dump() for s in setups]
    for s in setups:
        fit(model, s)
    entries, held = memo.memo_stats()
    assert entries <= 40 and held <= 400_000
    # every table entry is one the bound still accounts for
    assert sum(len(t.values) for t in memo._TABLES.values()) == entries
    again = [estimate(model, s).model_dump() for s in setups]
    fresh = [estimate(model.model_copy(), s).model_dump() for s in setups]
    assert again == first == fresh


def test_a_dead_models_entries_leave_the_bound() -> None:
    memo.clear_memo()
    model = load_model("llama-3.1-8b").model_copy()  # its own object and table
    estimate(model, TrainingSetup(method="lora"))
    entries, _ = memo.memo_stats()
    assert entries > 0
    del model
    assert memo.memo_stats()[0] == 0


def test_threads_share_the_memo_without_a_wrong_figure() -> None:
    memo.clear_memo()
    model = load_model("llama-3.2-1b")
    setups = [TrainingSetup(method="lora", seq_len=128 * (1 + i % 16), micro_batch=1 + i % 3)
              for i in range(96)]
    expected = {i: estimate(model.model_copy(), s).device_peak_bytes
                for i, s in enumerate(setups)}
    got: dict[int, int] = {}

    def work(offset: int) -> None:
        for i in range(offset, len(setups), 4):
            got[i] = estimate(model, setups[i]).device_peak_bytes

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected
