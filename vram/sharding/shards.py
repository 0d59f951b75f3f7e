"""How many ways each part of the model state is split across the data-parallel GPUs.

    >>> shards_of(TrainingSetup(n_gpus=8, sharding="zero2"))
    Shards(weights=1, gradients=8, optimizer=8)
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.setup import Sharding, TrainingSetup


@dataclass(frozen=True, slots=True)
class Shards:
    """How many ways weights, gradients and optimizer state are split (ZeRO paper, §5)."""

    weights: int
    gradients: int
    optimizer: int


def shards_of(setup: TrainingSetup) -> Shards:
    n = setup.n_gpus
    if setup.sharding is Sharding.ZERO3:
        return Shards(n, n, n)
    if setup.sharding is Sharding.ZERO2:
        return Shards(1, n, n)
    if setup.sharding is Sharding.ZERO1:
        return Shards(1, 1, n)
    return Shards(1, 1, 1)
