"""LoRA on the expert banks (`lora_experts`): the trainable count is PEFT's own, counted on
the model transformers builds (peft/tuners/lora/layer.py@v0.21.2 `ParamWrapper.update_layer`:
lora_A = Linear(in, r·E), lora_B = Linear(r·E, out), so r·E·(in + out) per bank)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vram import TrainingSetup, estimate, load_model  # noqa: E402

pytestmark = pytest.mark.trace

#: transformers 5 names the banks `mlp.experts.gate_up_proj` / `.down_proj` in both types.
BANKS = {"gate_up": ["mlp.experts.gate_up_proj"], "down": ["mlp.experts.down_proj"],
         "all": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}
MIXTRAL = {
    "model_type": "mixtral", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 512,
}
QWEN3_MOE = {
    "model_type": "qwen3_moe", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 256,
    "moe_intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
    "max_position_embeddings": 512,
}


def _peft_trainable(config: dict[str, object], banks: list[str], r: int) -> int:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(str(config["model_type"]), **fields))
        peft_model = get_peft_model(model, LoraConfig(
            r=r, target_modules=["q_proj", "v_proj"], target_parameters=banks))
        trainable, _ = peft_model.get_nb_trainable_parameters()
    return int(trainable)


@pytest.mark.parametrize("config", [MIXTRAL, QWEN3_MOE], ids=["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("choice", list(BANKS))
def test_expert_lora_trainable_equals_peft(config: dict[str, object], choice: str) -> None:
    setup = TrainingSetup(method="lora", lora_rank=8, lora_targets="q_proj,v_proj",
                          lora_experts=choice, precision="bf16-true", framework="axolotl")
    ours = estimate(load_model(config), setup).params.trainable
    assert ours == _peft_trainable(config, BANKS[choice], 8)
