"""Per-model memo tables: what estimates recompute identically for one model (parameter
counts, served weights) or for setups that differ only in batch and sequence (parameter
groups, the weights, gradients and optimizer parts).

A `ModelSpec` is frozen but hashing it walks every stack and Linear (~8 µs), so the tables are
keyed by the model object itself (its `id`, checked against a weak reference: a dead model's
table is dropped, and a copy, even `model_copy(update=...)`, gets its own). Within a table,
keys name what a value depends on beyond the model.

Every table together is one cache bounded by entries and by bytes (`MAX_MEMO_ENTRIES`,
`MAX_MEMO_BYTES`) that forgets the oldest stored entries first: a server that sees thousands
of distinct setups over weeks keeps the most recent ones, not all of them (issue 25: a cap of
4,096 entries per model let 141 models' tables hold 700,000 objects). `BoundedCache` is the
same bound for any cache (the app's state caches use it, `ui/results.py`); `approx_bytes`
measures what it holds.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import sys
import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from functools import cache
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from pydantic import BaseModel

if TYPE_CHECKING:  # imported by vram.model.spec itself: no runtime import of the model types
    from vram.setup import TrainingSetup

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
P = ParamSpec("P")

# --------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------

_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), range)
_NOT_OWNED = (type, enum.Enum, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
              types.ModuleType)


def approx_bytes(obj: object, *, opaque: Iterable[type] = ()) -> int:
    """The bytes `obj` and everything it holds take, each object counted once: the sum of
    `sys.getsizeof` over the object graph (containers, `__dict__`, `__slots__`, a pydantic
    model's fields set; an Arrow table's buffers by `get_total_buffer_size`).

    Not entered: classes, functions, modules, enum members (shared by the whole process) and
    instances of `opaque` (what another cache owns, such as the model every entry points at).
    An approximation: allocator overhead is not counted, and an object shared by two entries is
    counted in both (a bound kept this way errs on the safe side).
    """
    skip = tuple(opaque)
    seen: set[int] = set()
    stack: list[object] = [obj]
    total = 0
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, _NOT_OWNED) or (skip and isinstance(item, skip)):
            continue
        total += sys.getsizeof(item)
        if isinstance(item, _LEAVES):
            continue
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        else:
            total += _buffers(item, stack)
    return total


def _buffers(item: object, stack: list[object]) -> int:
    """Push what a plain object holds; return the bytes of buffers that are not objects."""
    buffer_size = getattr(item, "get_total_buffer_size", None)  # pyarrow Table/Array
    if callable(buffer_size) and type(item).__module__.startswith("pyarrow"):
        return int(buffer_size())
    state = getattr(item, "__dict__", None)
    if isinstance(state, dict):
        stack.append(state)
    fields_set = getattr(item, "__pydantic_fields_set__", None)
    if fields_set is not None:
        stack.append(fields_set)
    for slot in _slots(type(item)):  # type: ignore[arg-type]  # every class is hashable
        value = getattr(item, slot, None)
        if value is not None:
            stack.append(value)
    return 0


@cache
def _slots(kind: type) -> tuple[str, ...]:
    names: list[str] = []
    for klass in kind.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s != "__dict__"]
    return tuple(dict.fromkeys(n for n in names if n != "__weakref__"))


# --------------------------------------------------------------------------------------------
# A cache bounded by entries and bytes
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Kind:
    """The sizes measured for one kind of value (`BoundedCache(kind=...)`)."""

    stored: int = 0
    measured: int = 0
    measured_bytes: int = 0

    def mean(self) -> int:
        return self.measured_bytes // max(1, self.measured)


class BoundedCache(Generic[K, V]):
    """A least-recently-used map holding at most `max_entries` values and `max_bytes` bytes.

    Bytes are `sizer(key, value)` (by default `approx_bytes` of both, not entering `opaque`
    types). Measuring a large value costs about a microsecond per object, so with `kind`
    (a function naming a key's kind) only the first `measure_first` values of a kind and then
    every `measure_every`-th are measured, and the others are charged their kind's mean.
    A value larger than the whole budget is returned but not kept. Safe across threads: a
    lookup is one C-level call of an ordered dict; stores and evictions hold a lock.
    """

    def __init__(self, *, max_entries: int, max_bytes: int,
                 opaque: Iterable[type] = (), kind: Callable[[K], Hashable] | None = None,
                 measure_first: int = 8, measure_every: int = 16,
                 on_evict: Callable[[K], None] | None = None) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._opaque = tuple(opaque)
        self._kind = kind
        self._measure_first = measure_first
        self._measure_every = measure_every
        self._on_evict = on_evict
        self._values: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._kinds: dict[Hashable, _Kind] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._values)

    @property
    def bytes(self) -> int:
        """The bytes charged for the values held now."""
        return self._bytes

    def get(self, key: K) -> V | None:
        """The value under `key` (now the most recently used), or None."""
        try:
            value = self._values[key][0]
            self._values.move_to_end(key)
        except KeyError:  # absent, or evicted by another thread between the two calls
            return None
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def held_keys(self) -> list[K]:
        """The keys held now, least recently used first (a copy)."""
        with self._lock:
            return list(self._values)

    def get_or_compute(self, key: K, compute: Callable[[], V]) -> V:
        """The cached value, or `compute()` stored under `key` (two threads that miss the same
        key both compute it; the later store wins)."""
        try:
            value = self._values[key][0]
        except KeyError:
            value = compute()
            self.put(key, value)
            return value
        with contextlib.suppress(KeyError):  # evicted by another thread meanwhile
            self._values.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        size = self._size(key, value)
        if size > self.max_bytes:
            return
        evicted: list[K] = []
        with self._lock:
            old = self._values.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._values[key] = (value, size)
            self._bytes += size
            while len(self._values) > self.max_entries or self._bytes > self.max_bytes:
                gone, (_, gone_size) = self._values.popitem(last=False)
                self._bytes -= gone_size
                evicted.append(gone)
        if self._on_evict is not None:
            for gone in evicted:
                self._on_evict(gone)

    def discard(self, keys: Iterable[K]) -> None:
        """Drop these keys (those absent are ignored)."""
        with self._lock:
            for key in keys:
                old = self._values.pop(key, None)
                if old is not None:
                    self._bytes -= old[1]

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._bytes = 0

    def _size(self, key: K, value: V) -> int:
        if self._kind is None:
            return approx_bytes((key, value), opaque=self._opaque)
        kind = self._kinds.setdefault(self._kind(key), _Kind())
        kind.stored += 1
        if kind.measured < self._measure_first or kind.stored % self._measure_every == 0:
            size = approx_bytes((key, value), opaque=self._opaque)
            kind.measured += 1
            kind.measured_bytes += size
            return size
        return kind.mean()


def cached_in(cache: BoundedCache[tuple[str, Hashable], Any],
              ) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """A decorator: the function's results kept in `cache` under (its name, its arguments).

    Several functions may share one cache (and its bound); `fn.cache_clear()` drops only
    this function's entries. Cached values are shared: callers never mutate them.
    """

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        name = fn.__qualname__

        @functools.wraps(fn)
        def cached(*args: P.args, **kwargs: P.kwargs) -> T:
            key = (name, (args, tuple(sorted(kwargs.items()))) if kwargs else args)
            return cache.get_or_compute(key, lambda: fn(*args, **kwargs))  # type: ignore[no-any-return]

        def cache_clear() -> None:
            cache.discard([key for key in cache.held_keys() if key[0] == name])

        cached.cache_clear = cache_clear  # type: ignore[attr-defined]
        return cached

    return decorate


# --------------------------------------------------------------------------------------------
# The per-model memo
# --------------------------------------------------------------------------------------------

#: Memo entries kept over all models: a sweep of thousands of distinct setups of one model
#: stays warm, and a server's memory stays bounded (`vram.estimate` is microseconds warm, a
#: few hundred cold, so an evicted entry costs little).
MAX_MEMO_ENTRIES = 16_384
#: Memo bytes kept over all models (a state part is about 25 KB, a per-token part 5 KB).
MAX_MEMO_BYTES = 32 * 2**20


def _memo_kind(key: tuple[int, Hashable]) -> Hashable:
    """What a memo key is for: its first part (`"state"`, `"head"`, ...) or the key itself."""
    inner = key[1]
    return inner[0] if isinstance(inner, tuple) and inner else inner


def _forget(key: tuple[int, Hashable]) -> None:
    table = _TABLES.get(key[0])
    if table is not None:
        table.values.pop(key[1], None)


class _Table:
    """One model's memo: its values by key, and a weak reference that tells a recycled id."""

    __slots__ = ("ref", "values")

    def __init__(self, model: object, key: int) -> None:
        self.ref = weakref.ref(model, lambda _ref: _drop(key, _ref))
        self.values: dict[Hashable, object] = {}


#: Each model's table, by the model's id.
_TABLES: dict[int, _Table] = {}
#: Every table's entries again, across models: their order and sizes, and the bound.
_MEMO: BoundedCache[tuple[int, Hashable], object] = BoundedCache(
    max_entries=MAX_MEMO_ENTRIES, max_bytes=MAX_MEMO_BYTES, kind=_memo_kind, on_evict=_forget)
_MEMO_LOCK = threading.Lock()


def _table(model: object) -> _Table:
    key = id(model)
    table = _TABLES.get(key)
    if table is not None and table.ref() is model:
        return table
    with _MEMO_LOCK:
        if table is not None:  # a dead model's id, recycled: its entries go first
            _MEMO.discard((key, k) for k in list(table.values))
        table = _TABLES[key] = _Table(model, key)
    return table


def _drop(key: int, ref: weakref.ref[object]) -> None:
    if _TABLES is None:
        return  # interpreter shutdown: the module's globals are gone already
    table = _TABLES.get(key)
    if table is not None and table.ref is ref:
        del _TABLES[key]
        _MEMO.discard((key, k) for k in list(table.values))


def memo_stats() -> tuple[int, int]:
    """(entries, bytes) the memo holds now, over all models."""
    return len(_MEMO), _MEMO.bytes


def clear_memo() -> None:
    """Forget every memo entry (tests, and a server asked to shed its caches)."""
    with _MEMO_LOCK:
        _MEMO.clear()
        for table in list(_TABLES.values()):
            table.values.clear()


def setup_key(setup: TrainingSetup, ignored: frozenset[str]) -> tuple[object, ...]:
    """The setup's field values, in field order, leaving out `ignored` (a new field is part of
    the key unless it is named here: a cache can only be too fine, never too coarse)."""
    global _last_key
    last = _last_key  # one estimate asks for the same setup's key three times
    if last[0] is setup and last[1] is ignored:
        return last[2]
    # a pydantic model keeps its field values in its __dict__: one C-level lookup each
    key: tuple[object, ...] = _field_getter(type(setup), ignored)(setup.__dict__)
    _last_key = (setup, ignored, key)  # one tuple, replaced at once: safe across threads
    return key


#: The last key `setup_key` made: (setup, ignored, key). Holding the setup keeps its id unique.
_last_key: tuple[object, frozenset[str], tuple[object, ...]] = (None, frozenset(), ())


@cache
def _field_getter(kind: type[BaseModel],
                  ignored: frozenset[str]) -> itemgetter[tuple[object, ...]]:
    """One C-level getter of the kept fields' values from the model's __dict__ (it returns a
    tuple: more than one field)."""
    names = [name for name in kind.model_fields if name not in ignored]
    if len(names) < 2:
        raise ValueError(f"ignored: leaves {len(names)} field(s) of {kind.__name__}; a key "
                         "needs at least two")
    return itemgetter(*names)


def memoized(model: object, key: Hashable, compute: Callable[[], T]) -> T:
    """`compute()`, remembered for `model` under `key` (the caller names what it depends on)."""
    table = _table(model)
    try:  # a hit is one dict lookup: the memo evicts the oldest stored, not the least used
        return table.values[key]  # type: ignore[return-value]
    except KeyError:
        pass
    value = compute()
    table.values[key] = value
    _MEMO.put((id(model), key), value)
    return value


#: Setup fields a structure key leaves out: the batch shape (`vram.step.estimate.StatePart`).
TOKEN_FIELDS = frozenset({"micro_batch", "seq_len"})


def per_token_key(setup: TrainingSetup) -> tuple[object, ...]:
    """The key of a per-token figure (a layer's activation bytes per token): every field but
    the batch size, of which only "one sequence or more" matters (Transformers' eager
    attention expands K/V only for a batch of more than one: `vram.memory.activations`). Its first
    part is the structure key `vram.estimate` has just made for the same setup."""
    return (setup_key(setup, TOKEN_FIELDS), setup.seq_len, setup.micro_batch > 1)
