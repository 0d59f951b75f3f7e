"""Mixture-of-experts decoders of 2025-2026 (issue 22; `docs/expert-lora.md`).

transformers/models/<type>/modeling_<type>.py@v5.24.0:
- `gpt_oss`: q/k/v/o biases, one learned sink logit per head, experts with biases behind a
  router with a bias (`GptOssMLP.router`), sliding-window and full layers alternating.
- `glm4_moe`: the first `first_k_dense_replace` layers dense, then routed experts plus
  `n_shared_experts` shared ones; q/k/v biases per `attention_bias`, per-head q/k norms per
  `use_qk_norm`; the multi-token-prediction layer (`num_nextn_predict_layers`) is not built.
- `ernie4_5_moe`: experts from `moe_layer_start_index` to `moe_layer_end_index` every
  `moe_layer_interval` layers, shared experts, and the router's `e_score_correction_bias` an
  `nn.Parameter` (`Ernie4_5_MoeStatics`).
- `llama4_text`: every `interleave_moe_layer_step`-th layer routed (top-1, plus one shared
  expert of the expert width), the others a dense MLP of `intermediate_size_mlp`; chunked
  attention (`attention_chunk_size`) on the layers that rotate, NoPE on every 4th (the
  estimate treats the chunked layers as full attention: with SDPA or flash both keep q, k, v
  and the output, `docs/attention-variants.md`).
- `minimax_m2`: full-width q/k norms and routed experts in every layer (no shared expert).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vram.model.config_reader import ConfigReader
from vram.model.families.parts import (
    Heads,
    Part,
    Shape,
    attention,
    by_kind,
    experts,
    mlp,
    stack,
)
from vram.model.spec import LayerStack, ModelSpec


@dataclass(frozen=True, slots=True)
class Moe2026:
    """The family reading one of these model types."""

    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _BUILDERS[model_type](name, model_type, r)


def _model(name: str, model_type: str, r: ConfigReader, stacks: tuple[LayerStack, ...],
           tied_default: bool, window: int | None = None) -> ModelSpec:
    h, vocab = r.int("hidden_size"), r.int("vocab_size")
    return ModelSpec(
        name=name, family=model_type, hidden_size=h, vocab_size=vocab, stacks=stacks,
        embedding_params=vocab * h, extra_params=h,
        tied_embeddings=r.bool("tie_word_embeddings", tied_default),
        max_position_embeddings=r.int("max_position_embeddings", default=4096),
        sliding_window=window,
    )


def _routed_stack(kind: str, count: int, part: Part, heads: Heads, h: int, *, n: int, top_k: int,
                  width: int, shared: int = 0, qk_norm: bool = False,
                  window: int | None = None, extra: int = 0, sinks: bool = False,
                  fp32_norms: bool = False, softmax_upcast: bool = True,
                  act_saved: int = 1) -> LayerStack:
    shape = Shape(heads=heads, intermediate_size=width, n_experts=n, experts_per_token=top_k,
                  shared_expert_width=shared, qk_norm=qk_norm, attention_window=window,
                  attention_sinks=sinks, norm_scales_in_fp32=fp32_norms,
                  softmax_upcast=softmax_upcast, act_saved=act_saved)
    return stack(kind, count, part, shape, 2 * h + extra)


def _dense_stack(kind: str, count: int, part: Part, heads: Heads, h: int, inter: int, *,
                 qk_norm: bool = False) -> LayerStack:
    return stack(kind, count, part, Shape(heads=heads, intermediate_size=inter, qk_norm=qk_norm),
                 2 * h)


def gpt_oss(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    att, heads = attention(r, h, qkv_bias=True, o_bias=True, sinks=True)
    n, k, w = r.int("num_local_experts"), r.int("num_experts_per_tok"), r.int("intermediate_size")
    ffn = experts(h, w, n, k, router="router", router_bias=True, bank_bias=True)
    window = r.int("sliding_window") if r.has("sliding_window") else None
    given = r.config.get("layer_types")
    kinds = [str(t) for t in given] if isinstance(given, list) and given else [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]

    def build(kind: str, count: int) -> LayerStack:
        local = window if kind == "sliding_attention" else None
        # GptOssRMSNorm: `(self.weight * hidden_states).to(input_dtype)`, scaled in fp32; its
        # eager softmax in the logits' own dtype (`dtype=combined_logits.dtype`); its clamped
        # GLU (`GptOssExperts._apply_gate`) keeps clamp(gate), sigmoid(alpha·gate), the GLU and
        # up + 1 beside gate/up: four I-wide tensors where SwiGLU keeps one
        return _routed_stack(kind, count, att + ffn, heads, h, n=n, top_k=k, width=w,
                             window=local, sinks=True, fp32_norms=True, softmax_upcast=False,
                             act_saved=4)
    return _model(name, model_type, r, by_kind(kinds, build), False, window)


def glm4_moe(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    qk_norm = r.bool("use_qk_norm", False)
    att, heads = attention(r, h, qkv_bias=r.bool("attention_bias", False),
                           qk_norm="head" if qk_norm else "none")
    n_dense = min(r.config.get("first_k_dense_replace") or 0, n_layers)
    n, k = r.int("n_routed_experts"), r.int("num_experts_per_tok")
    w = r.int("moe_intermediate_size")
    shared = w * r.int("n_shared_experts", default=1)
    routed = att + experts(h, w, n, k) + mlp(h, shared, prefix="mlp.shared_experts.")
    dense = att + mlp(h, r.int("intermediate_size"))

    def build(kind: str, count: int) -> LayerStack:
        if kind == "dense":
            return _dense_stack(kind, count, dense, heads, h, r.int("intermediate_size"),
                                qk_norm=qk_norm)
        return _routed_stack(kind, count, routed, heads, h, n=n, top_k=k, width=w,
                             shared=shared, qk_norm=qk_norm)
    kinds = ["dense" if i < n_dense else "moe" for i in range(n_layers)]
    return _model(name, model_type, r, by_kind(kinds, build), False)


def ernie4_5_moe(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    bias = r.bool("use_bias", False)
    att, heads = attention(r, h, qkv_bias=bias, o_bias=bias)
    start = r.config.get("moe_layer_start_index") or 0
    end = r.config.get("moe_layer_end_index")
    end = n_layers - 1 if end is None or end < 0 else end
    step = r.int("moe_layer_interval", default=1)
    n, k, w = r.int("moe_num_experts"), r.int("moe_k"), r.int("moe_intermediate_size")
    shared = w * (r.config.get("moe_num_shared_experts") or 0)
    routed = att + experts(h, w, n, k)
    if shared:
        routed = routed + mlp(h, shared, prefix="mlp.shared_experts.")

    def build(kind: str, count: int) -> LayerStack:
        if kind == "dense":
            inter = r.int("intermediate_size")
            return _dense_stack(kind, count, att + mlp(h, inter), heads, h, inter)
        # + the router's e_score_correction_bias, one nn.Parameter entry per expert
        return _routed_stack(kind, count, routed, heads, h, n=n, top_k=k, width=w,
                             shared=shared, extra=n)
    kinds = ["moe" if start <= i <= end and (i + 1) % step == 0 else "dense"
             for i in range(n_layers)]
    return _model(name, model_type, r, by_kind(kinds, build), True)


def llama4_text(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    bias = r.bool("attention_bias", False)
    att, heads = attention(r, h, qkv_bias=bias, o_bias=bias)
    step = r.int("interleave_moe_layer_step", default=1)
    given = r.config.get("moe_layers")
    moe_layers = set(given) if isinstance(given, list) else {
        i for i in range(n_layers) if (i + 1) % step == 0}
    n, k, w = r.int("num_local_experts"), r.int("num_experts_per_tok"), r.int("intermediate_size")
    routed = att + experts(h, w, n, k, prefix="feed_forward.", router="router") + mlp(
        h, w, prefix="feed_forward.shared_expert.")

    def build(kind: str, count: int) -> LayerStack:
        if kind == "dense":
            inter = r.int("intermediate_size_mlp")
            return _dense_stack(kind, count, att + mlp(h, inter, prefix="feed_forward."), heads,
                                h, inter)
        return _routed_stack(kind, count, routed, heads, h, n=n, top_k=k, width=w, shared=w)
    kinds = ["moe" if i in moe_layers else "dense" for i in range(n_layers)]
    return _model(name, model_type, r, by_kind(kinds, build), False)


def minimax_m2(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    att, heads = attention(r, h, qk_norm="full")
    n, k, w = r.int("num_local_experts"), r.int("num_experts_per_tok"), r.int("intermediate_size")
    routed = att + experts(h, w, n, k)
    layers = _routed_stack("moe", n_layers, routed, heads, h, n=n, top_k=k, width=w, qk_norm=True)
    return _model(name, model_type, r, (layers,), False)


_BUILDERS: dict[str, Callable[[str, str, ConfigReader], ModelSpec]] = {
    "gpt_oss": gpt_oss, "glm4_moe": glm4_moe, "ernie4_5_moe": ernie4_5_moe,
    "llama4_text": llama4_text, "minimax_m2": minimax_m2,
}
MOE_TYPES = tuple(_BUILDERS)
