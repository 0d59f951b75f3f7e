"""Vision-language models: a vision tower, a projector and a language model (issue 22).

The class a fine-tuner loads is the image-text-to-text one (`AutoModelForImageTextToText`):
its parameters are the language model's, the vision tower's and the projector's. The language
model is read from `text_config` by the family of its own model type (Qwen2.5-VL's config.json
is flat: its text keys sit at the top). Whether the head is tied follows the composite config's
own `tie_word_embeddings` (transformers 5.24.0 reads it there: a Mistral 3 config with
`text_config.tie_word_embeddings: false` still ties), with each class's default.

Image tokens, the vision tower's activations and its own dtype are not modelled yet: such an
estimate says so (`ModelSpec.approximate_why`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families import vision
from vram.model.families.base import ArchitectureFamily
from vram.model.families.towers import TOWERS
from vram.model.spec import ModelSpec

#: Vision-language types whose image step is not held to the exact trace, and why: their
#: estimates with images say they are approximate (the others: benchmarks/trace_grid_vlm.py).
APPROXIMATE_VISION = {
    "mllama": ("mllama: the images reach the language model through cross-attention layers "
               "over the tiles' states; the tower's activations are counted, that "
               "cross-attention's kept tensors over the image states are not, so activations "
               "and the peak are approximate with images."),
    "llama4": ("llama4: transformers 5.24.0 cannot run its image step (its forward reads "
               "image_outputs off the text model's output), so the tower's activations are "
               "not held to the exact trace: approximate with images."),
    "qwen3_5": ("qwen3_5: the tower is Qwen3-VL's, held to the trace there; this type's "
                "image step is not traced (its Gated DeltaNet layers run a slow fallback on a "
                "CPU)."),
}

#: transformers 5.24.0 configuration classes' `tie_word_embeddings` defaults.
_TIED_DEFAULT = {"gemma3": True, "paligemma": True, "mistral3": True, "internvl": True}

#: Types whose wrapper reads `use_cache` from the top-level config and passes it down, so the
#: language model never reads its own: idefics3/modeling_idefics3.py@v5.24.0 L621,
#: smolvlm/modeling_smolvlm.py@v5.24.0 L511 (`merge_with_config_defaults` on the wrapper's
#: forward). The others' language models read `text_config.use_cache` (traced: a Trainer-style
#: top-level `use_cache=False` and no checkpointing still build a DynamicCache for Qwen3-VL,
#: Gemma 3, LLaVA, Mistral 3, PaliGemma, InternVL; benchmarks/VLM_TRACE_NOTES.md).
_CACHE_FROM_TOP = frozenset({"idefics3", "smolvlm"})

#: Types whose tower's `get_input_embeddings` is its patch embedding (`VisionSpec.input_hooked`):
#: pixtral/modeling_pixtral.py@v5.24.0 L398-399 (Mistral 3), siglip/modeling_siglip.py L853
#: (Gemma 3, PaliGemma), clip/modeling_clip.py L905 (LLaVA), internvl/modeling_internvl.py
#: L452, idefics3/modeling_idefics3.py L424, smolvlm/modeling_smolvlm.py L330,
#: qwen2_5_vl/modeling_qwen2_5_vl.py L389 (`_input_embed_layer = "patch_embed"`). Qwen3-VL's,
#: Qwen3.5's, mllama's and Llama 4's towers name none (`PreTrainedModel.get_input_embeddings`,
#: modeling_utils.py@v5.24.0 L969-1000, finds no `embed_tokens`).
_HOOKED_TOWERS = frozenset({"mistral3", "gemma3", "paligemma", "llava", "internvl", "idefics3",
                            "smolvlm", "qwen2_5_vl"})

#: The language model's model_type when `text_config` does not name one.
_TEXT_TYPE = {"qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3", "qwen3_5": "qwen3_5_text",
              "internvl": "qwen2", "llava": "llama", "idefics3": "llama", "smolvlm": "llama",
              "mistral3": "mistral",
              "gemma3": "gemma3_text", "llama4": "llama4_text", "paligemma": "gemma",
              "mllama": "mllama_text_model"}
#: Language models whose transformers model type names a text model vram reads as another.
_TEXT_AS = {"qwen2_5_vl_text": "qwen2", "qwen3_vl_text": "qwen3"}


def _qwen2_5_vl(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    return vision.qwen2_5_vl(v)


def _qwen3_vl(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    return vision.qwen3_vl(v)


def _gemma3(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    # Gemma3MultiModalProjector: mm_soft_emb_norm (vision width), mm_input_projection_weight
    h = v.int("hidden_size")
    return vision.siglip(v), h * text_h + h


def _paligemma(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    out = r.int("projection_dim", default=text_h)
    return vision.siglip(v), v.int("hidden_size") * out + out


def _llava(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    # LlavaMultiModalProjector: linear_1 (vision -> text), GELU, linear_2 (text -> text)
    bias = 2 * text_h if r.bool("multimodal_projector_bias", True) else 0
    return vision.clip(v), v.int("hidden_size") * text_h + text_h * text_h + bias


def _internvl(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    # InternVLMultiModalProjector: LayerNorm and linear_1 over the pixel-unshuffled width
    wide = int(v.int("hidden_size") / r.float("downsample_ratio", 0.5) ** 2)
    return vision.internvit(v), 2 * wide + wide * text_h + text_h + text_h * text_h + text_h


def _idefics3(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    # Idefics3Connector: one bias-free Linear over scale_factor² pixel-shuffled patches
    return vision.idefics3(v), v.int("hidden_size") * r.int("scale_factor") ** 2 * text_h


def _mistral3(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    # Mistral3MultiModalProjector: RMSNorm, the patch merger (h·m² -> h), linear_1, linear_2
    h, m = v.int("hidden_size"), r.int("spatial_merge_size")
    bias = 2 * text_h if r.bool("multimodal_projector_bias", False) else 0
    return vision.pixtral(v), h + h * m * m * h + h * text_h + text_h * text_h + bias


def _llama4(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    # Llama4MultiModalProjector: linear_1 (vision_output_dim -> text), no bias
    return vision.llama4(v), v.int("vision_output_dim") * text_h


def _mllama(v: ConfigReader, r: ConfigReader, text_h: int) -> tuple[int, int]:
    # MllamaForConditionalGeneration.multi_modal_projector: Linear(vision_output_dim, text)
    return vision.mllama(v), v.int("vision_output_dim") * text_h + text_h


_TOWERS: dict[str, Callable[[ConfigReader, ConfigReader, int], tuple[int, int]]] = {
    "qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl, "qwen3_5": _qwen3_vl, "gemma3": _gemma3,
    "paligemma": _paligemma, "llava": _llava, "internvl": _internvl, "idefics3": _idefics3,
    # SmolVLM2: Idefics3's tower and connector under its own type (smolvlm/modular_smolvlm.py
    # @v5.24.0 builds SmolVLMVisionTransformer and SmolVLMConnector from Idefics3's)
    "smolvlm": _idefics3, "mistral3": _mistral3, "llama4": _llama4, "mllama": _mllama,
}
VLM_TYPES = tuple(_TOWERS)


def _text_config(model_type: str, config: Mapping[str, Any]) -> dict[str, Any]:
    given = config.get("text_config")
    if isinstance(given, Mapping):
        text = dict(given)
    else:  # Qwen2.5-VL: the language model's keys at the top level
        text = {k: v for k, v in config.items() if k != "vision_config"}
    kind = str(text.get("model_type") or _TEXT_TYPE[model_type])
    text["model_type"] = _TEXT_AS.get(kind, _TEXT_TYPE[model_type] if kind == model_type else kind)
    return text


def _text_use_cache(r: ConfigReader) -> bool:
    """The language model's own `use_cache` (True in every text config class's defaults; a
    flat config's top-level keys are its text config's)."""
    given = r.config.get("text_config")
    text = given if isinstance(given, Mapping) else r.config
    return bool(text.get("use_cache", True))


@dataclass(frozen=True, slots=True)
class VisionLanguage:
    """The family of one vision-language model type; `text` reads its language model."""

    text: Callable[[str, Mapping[str, Any]], ModelSpec]

    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        vision_config = r.config.get("vision_config")
        if not isinstance(vision_config, Mapping):
            raise ConfigError("vision_config", "missing: a vision-language config has one")
        lm = self.text(name, _text_config(model_type, r.config))
        v = ConfigReader(vision_config)
        tower, projector = _TOWERS[model_type](v, r, lm.hidden_size)
        tied = r.bool("tie_word_embeddings", _TIED_DEFAULT.get(model_type, False))
        note = " ".join(n for n in (lm.approximate_why if lm.approximate else "",
                                    APPROXIMATE_VISION.get(model_type, "")) if n)
        return lm.model_copy(update={
            "family": model_type, "vision_params": tower, "projector_params": projector,
            "vision": TOWERS[model_type](v, r, lm.hidden_size).model_copy(update={
                "text_cache": model_type not in _CACHE_FROM_TOP and _text_use_cache(r),
                "input_hooked": model_type in _HOOKED_TOWERS}),
            "tied_embeddings": tied, "approximate": bool(note), "approximate_why": note})


def vision_language(text: Callable[[str, Mapping[str, Any]], ModelSpec]) -> dict[
        str, ArchitectureFamily]:
    """A `FAMILIES` row for every vision-language type, reading the language model with
    `text` (the table's own reader, passed in to keep the import order one way)."""
    family = VisionLanguage(text)
    return dict.fromkeys(VLM_TYPES, family)
