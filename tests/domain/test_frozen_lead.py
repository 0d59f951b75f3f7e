"""Under LoRA without checkpointing, what runs before the first trainable tensor keeps nothing
(`vram.memory.activations.lead`).

The traced figures are the CPU trace's activations at its peak ("backward / head"), b1, bf16,
LoRA r16 on q_proj, v_proj, HF Trainer, no checkpointing, transformers 5.24.0's PyTorch fallback
of the mixers (`mixer_kernels` false), each type's default config (`tests/data/families/`) in
its default layer order, cut to 4 layers: `benchmarks/trace_grid_hybrid.py`'s default-order
rows. Counting every layer's saved set, the estimate read +62.9 % (Nemotron-H: a Mamba-2 and an
MoE block before the first attention), +20.2 % (Falcon-H1: layer 0's Mamba-2 beside the
attention), +43.5 % (Qwen3.5: three Gated DeltaNet layers first) and +1.4 % (Qwen3: layer 0's
input norm and k norm).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.trace_grid import same_moment
from vram import TrainingSetup, estimate, load_model
from vram.memory.activations.lead import frozen_lead, layer_positions
from vram.stacks.profile import profile_for

FAMILIES = Path(__file__).resolve().parents[1] / "data" / "families"

#: (model type, depth, seq_len, traced activations at the peak in bytes).
TRACED = [
    ("nemotron_h", None, 512, 871_543_808),
    ("falcon_h1", 4, 512, 2_829_654_016),
    ("qwen3_5_text", 4, 512, 1_620_359_168),
    ("qwen3", 4, 512, 1_477_927_936),
]


def _config(model_type: str, depth: int | None) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((FAMILIES / f"{model_type}.json").read_text())
    if depth is not None:
        config["num_hidden_layers"] = depth
        if isinstance(config.get("layer_types"), list):
            config["layer_types"] = config["layer_types"][:depth]
    return config


def _setup(seq_len: int, **changes: object) -> TrainingSetup:
    fields: dict[str, Any] = {"framework": "hf-trainer", "method": "lora",
                              "lora_targets": "q_proj,v_proj", "lora_rank": 16,
                              "optimizer": "adamw", "precision": "bf16-true", "micro_batch": 1,
                              "seq_len": seq_len, "attention": "sdpa", "mixer_kernels": False}
    return TrainingSetup(**{**fields, **changes})


@pytest.mark.parametrize(("model_type", "depth", "seq_len", "traced"), TRACED)
def test_default_layer_order_matches_the_trace(model_type: str, depth: int | None,
                                               seq_len: int, traced: int) -> None:
    ours = estimate(load_model(_config(model_type, depth)), _setup(seq_len))
    activations = same_moment(ours, "backward / head").activation_bytes
    assert abs(activations - traced) / traced < 0.01, (activations, traced)


def test_layers_before_the_first_adapter_are_counted_out() -> None:
    """Nemotron-H's default blocks: Mamba-2, MoE, attention, MLP; q_proj, v_proj adapt the
    attention block only, so the Mamba-2 and MoE blocks keep nothing."""
    model = load_model(_config("nemotron_h", None))
    setup = _setup(512)
    lead = frozen_lead(model, setup, profile_for(setup))
    assert lead is not None
    before = dict(zip((stack.name for stack in model.stacks), lead.before, strict=True))
    assert sorted(before.values()) == [0, 0, 1, 1]
    first = model.stacks[lead.first]
    assert layer_positions(model)[lead.first] == (2,) and first.n_heads > 0


@pytest.mark.parametrize("changes", [
    {"grad_ckpt": True},  # transformers' checkpointing calls enable_input_require_grads
    {"method": "full"},  # the embedding trains
    {"lora_targets": "all-linear"},  # the Mamba-2 in_proj is adapted: layer 0 trains
    {"framework": "deepspeed"},  # no adapter path read: counted as every layer keeping
])
def test_every_layer_keeps_when_the_input_needs_a_gradient(changes: dict[str, object]) -> None:
    model = load_model(_config("nemotron_h", None))
    setup = _setup(512, **changes)
    lead = frozen_lead(model, setup, profile_for(setup))
    assert lead is None or not any(lead.before)


def test_the_frozen_lead_lowers_the_estimate_by_the_lead_layers() -> None:
    """Against the same model with an attention block first, the default order's estimate
    drops by what the Mamba-2 and MoE blocks before it would keep."""
    config = _config("nemotron_h", None)
    default = estimate(load_model(config), _setup(512))
    attention_first = estimate(load_model({**config, "layers_block_type": [
        "full_attention", "linear_attention", "moe", "mlp"]}), _setup(512))
    assert default.bucket_bytes["activations"] < 0.7 * attention_first.bucket_bytes[
        "activations"]
