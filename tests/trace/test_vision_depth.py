"""The trace's depth extrapolation on a VLM whose tower feeds the first language-model layers
(Qwen3-VL's deepstack): both traced depths hold every fed layer, so the extended model state
is the full-depth trace's, to the byte."""

from __future__ import annotations

import copy
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from vram.model.catalog import load_config
from vram.setup import TrainingSetup
from vram.trace import trace_step
from vram.trace.vision import fed_layers


def _qwen3_vl(layers: int) -> dict[str, Any]:
    config = copy.deepcopy(load_config("qwen3-vl-4b"))
    config["text_config"]["num_hidden_layers"] = layers
    return config


def test_fed_layers() -> None:
    assert fed_layers(load_config("qwen3-vl-4b")) == len(
        load_config("qwen3-vl-4b")["vision_config"]["deepstack_visual_indexes"]) == 3
    assert fed_layers(load_config("qwen2.5-vl-7b")) == 0
    assert fed_layers(load_config("llama-3.1-8b")) == 0


def test_deepstack_extrapolation_is_the_full_trace() -> None:
    """Traced at 2 and 3 layers, the third deepstack merger fed nothing at 2: its adapters had
    no gradient there, and the extension multiplied their bytes by the depth (Qwen3-VL-4B QLoRA
    all-linear: +16 % of gradients and optimizer state). From 3 and 4 layers it is exact."""
    config = _qwen3_vl(7)
    setup = TrainingSetup.model_validate({
        "method": "qlora", "lora_targets": "all-linear", "lora_rank": 8, "seq_len": 256,
        "images_per_sample": 1, "image_height": 256, "image_width": 256,
        "framework": "hf-trainer", "precision": "bf16-true"})
    extended = trace_step(config, setup)
    full = trace_step(config, setup, n_layers=7)
    assert extended.extrapolated and not full.extrapolated
    for bucket in ("weights", "gradients", "optimizer"):
        assert extended.bucket_max[bucket] == full.bucket_max[bucket], bucket
