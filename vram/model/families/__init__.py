"""Architecture families: one table from `model_type` to the family that reads its config.

    >>> FAMILIES["llama"].build("my model", "llama", ConfigReader(config))

Adding a family: a module here with a `build` (see `ArchitectureFamily`), one row per
model_type below, a config in `data/models/` and its count pinned in the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.base import ArchitectureFamily
from vram.model.families.bert import Bert
from vram.model.families.deepseek import DeepseekV2
from vram.model.families.dense import DenseTwist
from vram.model.families.falcon import Falcon
from vram.model.families.gpt2 import Gpt2
from vram.model.families.gpt_bigcode import GptBigCode
from vram.model.families.gptj import GptJ
from vram.model.families.hybrid import HYBRID_TYPES, Hybrid
from vram.model.families.llama import VARIANTS, LlamaLike, MistralOrMixtral
from vram.model.families.mllama import MllamaText
from vram.model.families.moe import MOE_TYPES, Moe2026
from vram.model.families.neox import Bloom, GptNeox
from vram.model.families.opt import Opt
from vram.model.families.phi import Phi, Phi3
from vram.model.families.qwen import QwenV1
from vram.model.families.t5 import T5
from vram.model.families.vlm import vision_language
from vram.model.spec import ModelSpec, V4ExpertNames

#: model_type (lower case) -> the family that builds it.
FAMILIES: dict[str, ArchitectureFamily] = {
    **{model_type: LlamaLike(variant) for model_type, variant in VARIANTS.items()},
    "mistral": MistralOrMixtral(),
    "phi3": Phi3(),
    "phi": Phi(),
    "falcon": Falcon(),
    "refinedwebmodel": Falcon(),  # Falcon's original remote-code model_type
    "gpt_neox": GptNeox(),
    "bloom": Bloom(),
    "t5": T5(),
    "mt5": T5(),
    "umt5": T5(),
    "bert": Bert(),
    "gpt2": Gpt2(),
    "opt": Opt(),
    "gptj": GptJ(),
    "gpt_bigcode": GptBigCode(),
    "qwen": QwenV1(),
    "deepseek_v2": DeepseekV2(),
    "deepseek_v3": DeepseekV2(),
    # Kimi K2's config.json: model_type kimi_k2, DeepseekV3ForCausalLM (remote code)
    "kimi_k2": DeepseekV2(),
    # issue 22: the model types of 2025-2026
    **dict.fromkeys(("smollm3", "olmo3", "exaone4", "seed_oss", "glm4", "apertus"),
                    DenseTwist()),
    **dict.fromkeys(MOE_TYPES, Moe2026()),
    **dict.fromkeys(HYBRID_TYPES, Hybrid()),
    "mllama_text_model": MllamaText(),
}


def _language_model(name: str, config: Mapping[str, Any]) -> ModelSpec:
    """A vision-language model's language model, read by the family of its own model type."""
    model_type = str(config.get("model_type", ""))
    family = FAMILIES.get(model_type)
    if family is None or model_type in VLM_FAMILIES:
        raise ConfigError("text_config.model_type", f"{model_type!r:.40} is not a language "
                          "model vram reads")
    return family.build(name, model_type, ConfigReader(config))


VLM_FAMILIES = vision_language(_language_model)
FAMILIES.update(VLM_FAMILIES)

#: Model types whose transformers-4 expert names PEFT rewrites into the banks' target_parameters:
#: transformers/conversion_mapping.py@v5.24.0 `_MODEL_TO_CONVERSION_PATTERN` (qwen2_moe and
#: mixtral patterns) and peft/utils/transformers_weight_conversion.py@v0.21.2 (adds mixtral).
V4_EXPERT_NAMES: dict[str, V4ExpertNames] = {
    **dict.fromkeys(("qwen2_moe", "qwen3_moe", "qwen3_next", "olmoe", "deepseek_v2",
                     "deepseek_v3", "ernie4_5_moe", "glm4_moe"), V4ExpertNames.GATE_UP_DOWN),
    **dict.fromkeys(("mixtral", "minimax_m2"), V4ExpertNames.W1_W3_W2),
}

#: Accepted spellings that the list of supported families does not show.
ALIASES: frozenset[str] = frozenset({"refinedwebmodel", "umt5", "kimi_k2", "mllama_text_model"})

#: The model types a user can name, for messages and docs.
SUPPORTED_FAMILIES: tuple[str, ...] = tuple(sorted(set(FAMILIES) - ALIASES))

__all__ = ["ALIASES", "FAMILIES", "SUPPORTED_FAMILIES", "V4_EXPERT_NAMES", "ArchitectureFamily"]
