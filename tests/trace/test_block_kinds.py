"""Nemotron-H lists its blocks (`layers_block_type`) instead of counting them: the trace reads
its depth and its pattern from the list, and shrinks the list with the depth."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from vram.trace.build import depth, layer_period, with_depth

pytestmark = pytest.mark.trace

NEMOTRON_H = {"model_type": "nemotron_h", "hidden_size": 64,
              "layers_block_type": ["mamba", "moe", "mamba", "moe", "attention", "mlp"]}


def test_the_block_list_is_the_depth_and_the_pattern() -> None:
    assert depth(NEMOTRON_H) == 6
    assert layer_period(NEMOTRON_H) == 6  # mamba, moe twice, then attention, mlp: no repeat
    periodic = {**NEMOTRON_H, "layers_block_type": ["mamba", "moe"] * 3}
    assert layer_period(periodic) == 2
    two = with_depth(periodic, 4)
    assert (depth(two), two["layers_block_type"]) == (4, ["mamba", "moe", "mamba", "moe"])
