"""Llama-shaped decoders of 2025-2026 with one twist each (issue 22).

transformers/models/<type>/modeling_<type>.py@v5.24.0:
- `smollm3`: Llama, RoPE skipped on every `no_rope_layer_interval`-th layer (no parameters).
- `olmo3`: OLMo 2's full-width q/k norms and post-norms (`post_attention_layernorm`,
  `post_feedforward_layernorm`) that scale in fp32 (`(weight * x).to(input_dtype)`), three
  sliding-window layers to one full (`layer_types`).
- `exaone4`: per-head q/k norms, post-norms, the same 3:1 local/global pattern.
- `seed_oss`: biases on q, k, v (`attention_bias`) but not on o (`attention_out_bias`), and
  dropout in training on the attention probabilities (`attention_dropout`) and on both residual
  branches (`residual_dropout`), 0.1 each unless the config says otherwise (SeedOssConfig).
- `glm4`: q/k/v biases, a fused `gate_up_proj`, four norms a layer (`post_self_attn_layernorm`,
  `post_mlp_layernorm`).
- `apertus`: per-head q/k norms and a non-gated MLP through xIELU, whose two parameters
  (`alpha_p`, `alpha_n`) are in every layer; it runs as transformers' Python formula
  (`LayerStack.act_xielu`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.model.config_reader import ConfigReader
from vram.model.families.parts import (
    Heads,
    Part,
    Shape,
    attention,
    by_kind,
    fused_mlp,
    layer_types,
    mlp,
    plain_mlp,
    stack,
)
from vram.model.spec import LayerStack, MlpKind, ModelSpec

#: Model types whose every 4th layer is global and the rest slide (OLMo 3, EXAONE 4).
_THREE_TO_ONE = frozenset({"olmo3", "exaone4"})


@dataclass(frozen=True, slots=True)
class DenseTwist:
    """The family reading one of these model types."""

    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return dense_model(name, model_type, r)


def _attention(model_type: str, r: ConfigReader, h: int) -> tuple[Part, Heads]:
    bias = r.bool("attention_bias", model_type in ("seed_oss", "glm4"))
    if model_type == "seed_oss":
        return attention(r, h, qkv_bias=bias, o_bias=r.bool("attention_out_bias", False))
    if model_type == "glm4":
        return attention(r, h, qkv_bias=bias)
    qk = {"olmo3": "full", "exaone4": "head", "apertus": "head"}.get(model_type, "none")
    return attention(r, h, qkv_bias=bias, o_bias=bias, qk_norm=qk)


def _mlp(model_type: str, r: ConfigReader, h: int) -> tuple[Part, MlpKind]:
    inter = r.int("intermediate_size")
    if model_type == "glm4":
        return fused_mlp(h, inter), MlpKind.GATED
    if model_type == "apertus":
        xielu = Part((), 2)  # ApertusMLP's XIELUActivation: alpha_p, alpha_n
        return plain_mlp(h, inter, bias=r.bool("mlp_bias", False)) + xielu, MlpKind.PLAIN
    return mlp(h, inter, bias=r.bool("mlp_bias", False)), MlpKind.GATED


def _dropouts(model_type: str, r: ConfigReader) -> tuple[float, float]:
    """Seed-OSS drops out in training: `attention_dropout` on the probabilities,
    `residual_dropout` on the attention's and the MLP's outputs (SeedOssConfig@v5.24.0 defaults
    0.1 and 0.1; SeedOssAttention / SeedOssMLP `nn.functional.dropout`)."""
    if model_type != "seed_oss":
        return 0.0, 0.0
    return r.float("attention_dropout", 0.1), r.float("residual_dropout", 0.1)


def dense_model(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    att, heads = _attention(model_type, r, h)
    ffn, kind = _mlp(model_type, r, h)
    n_norms = 4 if model_type == "glm4" else 2
    window = r.int("sliding_window") if r.has("sliding_window") else None
    if model_type in _THREE_TO_ONE:
        kinds = layer_types(r, n_layers, lambda i: "full_attention" if (i + 1) % 4 == 0
                            else "sliding_attention")
    else:
        kinds = ["full_attention"] * n_layers

    attn_dropout, hidden_dropout = _dropouts(model_type, r)

    def build(layer_kind: str, count: int) -> LayerStack:
        local = layer_kind == "sliding_attention"
        shape = Shape(heads=heads, mlp_kind=kind, intermediate_size=r.int("intermediate_size"),
                      qk_norm=model_type in ("olmo3", "exaone4", "apertus"), n_norms=n_norms,
                      attention_window=window if local else None,
                      act_xielu=model_type == "apertus", attn_dropout=attn_dropout,
                      norm_scales_in_fp32=model_type == "olmo3",
                      # post_attention_layernorm / post_feedforward_layernorm on the sublayers'
                      # outputs (modeling_olmo3.py, modeling_exaone4.py @v5.24.0): both
                      # norms' backward runs before the attention's
                      post_norm=model_type in ("olmo3", "exaone4"),
                      hidden_dropout=hidden_dropout)
        return stack(layer_kind, count, att + ffn, shape, n_norms * h)

    default_tied = model_type == "smollm3"
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family=model_type, hidden_size=h, vocab_size=vocab,
        stacks=by_kind(kinds, build), embedding_params=vocab * h, extra_params=h,
        tied_embeddings=r.bool("tie_word_embeddings", default_tied),
        max_position_embeddings=r.int("max_position_embeddings", default=4096),
        sliding_window=window if "sliding_attention" in kinds else None,
    )
