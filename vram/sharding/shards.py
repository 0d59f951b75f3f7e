"""How many ways each part of the model state is split across the data-parallel GPUs (and
the context-parallel ones: `vram.setup.layout.shard_group`).

    >>> shards_of(TrainingSetup(n_gpus=8, sharding="zero2"))
    Shards(weights=1, gradients=8, optimizer=8)
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.setup import Sharding, TrainingSetup
from vram.setup.layout import shard_group


@dataclass(frozen=True, slots=True)
class Shards:
    """How many ways weights, gradients and optimizer state are split (ZeRO paper, §5)."""

    weights: int
    gradients: int
    optimizer: int


def shards_of(setup: TrainingSetup) -> Shards:
    n = shard_group(setup)  # the data- and context-parallel GPUs (all, without tp/pp)
    if setup.sharding is Sharding.ZERO3:
        return Shards(n, n, n)
    if setup.sharding is Sharding.ZERO2:
        return Shards(1, n, n)
    if setup.sharding is Sharding.ZERO1:
        return Shards(1, 1, n)
    return Shards(1, 1, 1)
