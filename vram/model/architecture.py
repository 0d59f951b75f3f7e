"""A model's shape, read from a Hugging Face `config.json`, with exact parameter counts.

The spec types live in `vram.model.spec`, safe config reading in `vram.model.config_reader`,
and each family's builder in `vram.model.families`; this module is the entry point that ties
them together.

    >>> spec = model_from_config({"model_type": "llama", ...})
    >>> spec.n_params
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vram.errors import ConfigError, FileReadError
from vram.files import read_limited
from vram.model.config_checks import checked_model
from vram.model.config_reader import MAX_CONFIG_BYTES, ConfigReader, read_config_text
from vram.model.families import FAMILIES, SUPPORTED_FAMILIES, V4_EXPERT_NAMES
from vram.model.spec import (
    FUSED_PARTS,
    TARGET_ROLES,
    HeadKind,
    LayerStack,
    Linear,
    MlpKind,
    ModelSpec,
    NormKind,
    Role,
)

__all__ = [
    "FUSED_PARTS",
    "MAX_CONFIG_BYTES",
    "SUPPORTED_FAMILIES",
    "TARGET_ROLES",
    "HeadKind",
    "LayerStack",
    "Linear",
    "MlpKind",
    "ModelSpec",
    "NormKind",
    "Role",
    "config_for_param_count",
    "model_from_config",
    "model_from_config_file",
    "model_from_param_count",
    "read_config_text",
]


def model_from_config(config: Mapping[str, Any], name: str = "custom model") -> ModelSpec:
    """Read a Hugging Face config dict. Raises ConfigError naming the key that is wrong."""
    return checked_model(config, lambda: _read_model(config, name))  # vram.model.config_checks


def _read_model(config: Mapping[str, Any], name: str) -> ModelSpec:
    if not isinstance(config, Mapping):
        raise ConfigError("config.json", "must be a JSON object")
    r = ConfigReader(config)
    model_type = r.str("model_type", "")
    if not model_type:
        raise ConfigError("model_type", "missing: cannot tell the architecture")
    model_type = model_type.lower()
    family = FAMILIES.get(model_type)
    if family is None:
        if llama_shaped(config):
            return _as_llama(name, model_type, r)
        allowed = ", ".join(SUPPORTED_FAMILIES)
        raise ConfigError(
            "model_type", f"{model_type!r:.40} is not supported; supported: {allowed}")
    spec = family.build(name, model_type, r)
    if model_type in V4_EXPERT_NAMES and spec.is_moe:
        spec = spec.model_copy(update={"v4_expert_names": V4_EXPERT_NAMES[model_type]})
    return spec


#: The keys a Llama decoder's config.json gives its shape with.
_LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "vocab_size")
#: Keys that say the model is something Llama's builder would read wrongly: experts, another
#: mixer than attention, a vision tower, a nested language model, an encoder-decoder.
_NOT_LLAMA_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
                   "vision_config", "text_config", "layers_block_type", "mamba_d_state",
                   "ssm_state_size", "linear_num_value_heads", "kv_lora_rank", "is_encoder_decoder",
                   "cross_attention_layers")

_APPROXIMATE = ("model_type {model_type!r:.40} is not one vram knows; its config is Llama-shaped "
                "(hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
                "vocab_size), so it is estimated as a Llama decoder with those shapes: "
                "parameters and every figure are approximate.")


def llama_shaped(config: Mapping[str, Any]) -> bool:
    """Whether an unknown model type's config reads as a Llama decoder: Llama's shape keys,
    none of the keys of another architecture, only attention in `layer_types`."""
    if not all(isinstance(config.get(k), int) for k in _LLAMA_KEYS):
        return False
    if any(config.get(k) not in (None, False, 0) for k in _NOT_LLAMA_KEYS):
        return False
    kinds = config.get("layer_types")
    return not isinstance(kinds, list) or all(
        k in ("full_attention", "sliding_attention") for k in kinds)


def _as_llama(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    spec = FAMILIES["llama"].build(name, model_type, r)
    return spec.model_copy(update={"approximate": True, "approximate_why": _APPROXIMATE.format(
        model_type=model_type)})


def model_from_config_file(path: str | Path, name: str | None = None) -> ModelSpec:
    """Read a config.json file: a regular file of at most MAX_CONFIG_BYTES (vram.files)."""
    try:
        data = read_limited(path, MAX_CONFIG_BYTES, what="config.json")
    except FileReadError as exc:
        raise ConfigError("model", str(exc)) from None
    return model_from_config(read_config_text(data), name or Path(path).stem)


def config_for_param_count(n_params: int) -> dict[str, Any]:
    """A plausible Llama-style config.json for a bare parameter count.

    Shape rule (Llama 2/3 sizes): about 12·L·h² parameters in the layers with L ≈ h/128,
    GQA with 8 KV heads from 3B up, gated MLP of width 3.5·h, 128k vocabulary from 0.5B up.
    """
    if isinstance(n_params, bool) or not isinstance(n_params, int):
        raise ConfigError("params", "must be a whole number")
    if not 10_000_000 <= n_params <= 10_000_000_000_000:
        raise ConfigError("params", f"must be between 10 million and 10 trillion, got {n_params:,}")
    vocab = 128_256 if n_params >= 500_000_000 else 32_000
    budget = max(n_params - 2 * vocab * 1024, n_params // 2)
    gqa = n_params >= 3_000_000_000
    step = 1024 if gqa else 128  # with GQA, heads come in groups of 8
    h = max(round((budget * 128 / 13) ** (1 / 3) / step) * step, 256)
    n_heads = max(h // 128, 2)
    n_kv = 8 if gqa else n_heads
    inter = round(3.5 * h / 256) * 256
    tied = n_params < 5_000_000_000
    per_layer = (
        2 * h * h + 2 * h * (n_kv * 128 if n_kv != n_heads else h) + 3 * h * inter + 2 * h
    )
    head = vocab * h * (1 if tied else 2)
    n_layers = max(1, round((n_params - head - h) / per_layer))
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": n_layers, "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv, "head_dim": h // n_heads, "vocab_size": vocab,
        "tie_word_embeddings": tied, "max_position_embeddings": 131_072,
    }


def model_from_param_count(n_params: int, name: str | None = None) -> ModelSpec:
    """A Llama-style model of about `n_params` parameters; marked approximate."""
    config = config_for_param_count(n_params)
    spec = model_from_config(config, name or f"~{n_params / 1e9:.1f}B parameters")
    return spec.model_copy(update={"approximate": True})
