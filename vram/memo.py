"""Per-model memo tables: what estimates recompute identically for one model (parameter
counts, served weights) or for setups that differ only in batch and sequence (parameter
groups, the weights, gradients and optimizer parts).

A `ModelSpec` is frozen but hashing it walks every stack and Linear (~8 µs), so the tables are
keyed by the model object itself (its `id`, checked against a weak reference: a dead model's
table is dropped, and a copy, even `model_copy(update=...)`, gets its own). Within a table,
keys name what a value depends on beyond the model.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from functools import cache
from operator import itemgetter
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

if TYPE_CHECKING:  # imported by vram.model.spec itself: no runtime import of the model types
    from vram.setup import TrainingSetup

T = TypeVar("T")

#: Entries one model's table holds before it is emptied (a sweep's distinct structures).
MAX_ENTRIES_PER_MODEL = 4096

_TABLES: dict[int, tuple[weakref.ref[object], dict[Hashable, object]]] = {}


def _table(model: object) -> dict[Hashable, object]:
    key = id(model)
    entry = _TABLES.get(key)
    if entry is not None and entry[0]() is model:
        return entry[1]
    table: dict[Hashable, object] = {}
    _TABLES[key] = (weakref.ref(model, lambda _ref: _drop(key, _ref)), table)
    return table


def _drop(key: int, ref: weakref.ref[object]) -> None:
    if _TABLES is None:
        return  # interpreter shutdown: the module's globals are gone already
    entry = _TABLES.get(key)
    if entry is not None and entry[0] is ref:
        del _TABLES[key]


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
    try:
        return table[key]  # type: ignore[return-value]
    except KeyError:
        pass
    value = compute()
    if len(table) >= MAX_ENTRIES_PER_MODEL:
        table.clear()
    table[key] = value
    return value


#: Setup fields a structure key leaves out: the batch shape (`vram.step.estimate.StatePart`).
TOKEN_FIELDS = frozenset({"micro_batch", "seq_len"})


def per_token_key(setup: TrainingSetup) -> tuple[object, ...]:
    """The key of a per-token figure (a layer's activation bytes per token): every field but
    the batch size, of which only "one sequence or more" matters (Transformers' eager
    attention expands K/V only for a batch of more than one: `vram.memory.activations`). Its first
    part is the structure key `vram.estimate` has just made for the same setup."""
    return (setup_key(setup, TOKEN_FIELDS), setup.seq_len, setup.micro_batch > 1)
