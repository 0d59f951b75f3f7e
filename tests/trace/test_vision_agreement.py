"""The closed form held to the exact trace on a vision-language model with an image, in seconds
(`benchmarks/trace_grid_vlm.py` runs the grid's rows, minutes each).

Qwen3-VL-4B, QLoRA on every Linear with the vision side frozen, bf16-mixed, one 512x512 image
(1,024 tower tokens, 256 LM tokens), 1,024 tokens: the trace runs 3 and 4 text layers
(every deepstack-fed layer) and extends to 36. The language model's q/k norms are a sixth of
what a layer keeps here: without them the closed form was -6.7 % of the traced activations
and -5.0 % of the peak (the grid's row at 4,096 tokens: -6.6 % / -6.0 %); with them -0.6 % /
-0.4 %.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.trace_grid import TOLERANCE, against_trace
from vram.model.catalog import load_config
from vram.setup import TrainingSetup


@pytest.mark.trace
def test_qwen3_vl_qlora_frozen_tower_agrees_with_the_trace() -> None:
    setup = TrainingSetup.model_validate({
        "framework": "hf-trainer", "method": "qlora", "precision": "bf16-mixed",
        "lora_targets": "all-linear", "lora_rank": 16, "freeze_vision": True,
        "images_per_sample": 1, "image_height": 512, "image_width": 512, "seq_len": 1024})
    errors, _, _ = against_trace(load_config("qwen3-vl-4b"), setup)
    failures = {k: f"{100 * v:+.1f}%" for k, v in errors.items() if abs(v) > TOLERANCE[k]}
    assert not failures, failures
