"""A frozen vision tower under transformers' checkpointing (`vram.memory.vision.hooked_tower`).

`activation_checkpointing_enable` calls `enable_input_require_grads`, which hooks the input
embeddings of every `PreTrainedModel` inside the model (transformers/modeling_utils.py@v5.24.0
L2147-2177, L3190-3198): Pixtral's `patch_conv` too. Mistral 3's frozen tower (no adapters)
then keeps its 24 checkpointed block inputs, and the language embedding's fp32 output (after
the kbit upcast) is a leaf autograd holds: the trace's gap on the grid's Mistral 3 QLoRA row
(benchmarks/VLM_TRACE_NOTES.md).
"""

from __future__ import annotations

import pytest

import vram
from vram.memory.vision import vision_plan
from vram.setup import TrainingSetup
from vram.stacks.profile import profile_for

ROW = {"method": "qlora", "precision": "bf16-mixed", "seq_len": 4096, "grad_ckpt": True,
       "lora_targets": "q_proj,v_proj", "freeze_vision": True, "images_per_sample": 1,
       "image_height": 448, "image_width": 672, "framework": "hf-trainer"}
# 448x672 at patch 14: 32 x 48 = 1,536 tower tokens; 24 blocks of width 1,024 in fp32
CHECKPOINTS = 1536 * 24 * 1024 * 4
# 4,096 tokens x hidden 5,120 x fp32 (the embedding upcast by prepare_model_for_kbit_training)
LEAF = 4096 * 5120 * 4


def _saved(model: str, **fields: object) -> dict[str, int]:
    setup = TrainingSetup.model_validate({**ROW, **fields})
    plan = vision_plan(vram.load_model(model), setup, profile_for(setup))
    assert plan is not None
    return {item.key: item.bytes for item in plan.saved}


def test_a_frozen_pixtral_tower_keeps_its_block_inputs_under_checkpointing() -> None:
    saved = _saved("tests/data/families/mistral3.json")
    assert saved["activations.vision_checkpoints"] == CHECKPOINTS == 150_994_944
    assert saved["activations.vision.embedding_leaf"] == LEAF == 83_886_080


@pytest.mark.parametrize(("model", "fields"), [
    ("tests/data/families/mistral3.json", {"grad_ckpt": False}),  # no hook without it
    ("qwen3-vl-4b", {}),  # its tower names no input embeddings
])
def test_no_hooked_tower_without_checkpointing_or_input_embeddings(
        model: str, fields: dict[str, object]) -> None:
    assert _saved(model, **fields) == {}
