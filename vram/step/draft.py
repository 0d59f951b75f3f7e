"""A line item not validated yet: the estimate compares the step's moments by their bytes, and
only the peak moment's items become `LineItem`s (a pydantic model costs a validation each;
about ten of an estimate's items belong to moments that are not the peak).

    >>> ItemDraft("activations.x", "x", "tokens × 2 B", {"tokens": 8}, 16).line_item().bytes
    16
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vram.result import InputValue, LineItem


# Built on every estimate: not `frozen` (a frozen dataclass sets each field through
# `object.__setattr__`, four times slower to build); nothing assigns to it once built.
@dataclass(slots=True)
class ItemDraft:
    """The fields of a `LineItem`, which `line_item()` assembles (its bytes checked here)."""

    key: str
    label: str
    formula: str
    inputs: Mapping[str, InputValue]
    bytes: int
    source: str = ""

    def __post_init__(self) -> None:
        if self.bytes < 0:  # what LineItem's validation would refuse, for every moment
            raise ValueError(f"{self.key}: bytes must be >= 0, got {self.bytes}")

    def line_item(self) -> LineItem:
        return LineItem.assemble(self.key, self.label, self.formula, dict(self.inputs),
                                 self.bytes, self.source)


# Built on every estimate: not frozen either (see `ItemDraft`).
@dataclass(slots=True)
class ItemGroup:
    """Items counted by their total: `items()` builds them only for the peak moment (a layer
    stack's saved tensors are a dozen items, alive in most moments)."""

    bytes: int
    items: Callable[[], list[LineItem]]


#: What a moment holds: items built once per setup structure (cached, validated) or drafts.
Alive = LineItem | ItemDraft | ItemGroup


def line_items(items: list[Alive]) -> tuple[LineItem, ...]:
    """The validated items, in order (a cached `LineItem` is kept as it is)."""
    out: list[LineItem] = []
    for item in items:
        if isinstance(item, LineItem):
            out.append(item)
        elif isinstance(item, ItemDraft):
            out.append(item.line_item())
        else:
            out.extend(item.items())
    return tuple(out)
