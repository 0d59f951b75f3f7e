"""Llama and its relatives: RMSNorm, grouped-query attention, gated MLP, optional MoE.

One builder reads them all; what differs between model types is a `LlamaVariant` row of flags
(biases, norms, q/k norms, experts, tying, soft-capping), each named for what the family's
Transformers code does.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.base import attention_linears, gated_mlp
from vram.model.spec import LayerStack, Linear, MlpKind, ModelSpec, NormKind, Role


class QkNorm(Enum):
    """Norms on queries and keys inside attention."""

    NONE = "none"
    PER_HEAD = "per head"  # Qwen3, Gemma 3: one head_dim-wide weight each for q and k
    FULL_WIDTH = "full width"  # OLMo 2: over the whole q and k projections


@dataclass(frozen=True, slots=True)
class MoeLayout:
    """Routed experts in place of the MLP (Transformers 5: each bank one 3-D tensor)."""

    #: The config key of one expert's MLP width.
    expert_width_key: str = "moe_intermediate_size"
    #: A shared expert beside the routed ones, with its own sigmoid gate (Qwen1.5/2 MoE).
    shared_expert: bool = False


@dataclass(frozen=True, slots=True)
class LlamaVariant:
    """How one Llama-like model type departs from Llama."""

    #: The config key that switches the q/k/v biases on, and its default.
    qkv_bias_key: str = "attention_bias"
    qkv_bias_default: bool = False
    #: Whether o_proj's bias follows `attention_bias` (Qwen2 biases q, k, v only).
    o_bias_follows_attention_bias: bool = True
    #: `nn.LayerNorm` (with a bias) instead of RMSNorm (StableLM).
    layer_norm: bool = False
    #: Norms per layer: 2 (pre-norms), 4 with Gemma 2/3's post-norms.
    n_norms: int = 2
    qk_norm: QkNorm = QkNorm.NONE
    #: False for OLMo 1's non-parametric LayerNorm (no weights at all).
    parametric_norms: bool = True
    moe: MoeLayout | None = None
    tied_default: bool = False
    #: Gemma's RMSNorm scales in fp32 (see `LayerStack.norm_scales_in_fp32`).
    norm_scales_in_fp32: bool = False
    #: Norms on the sublayers' outputs, none before them (see `LayerStack.post_norm`).
    post_norm: bool = False
    #: Gemma 2 soft-caps attention logits and final logits.
    softcap: bool = False
    #: Layers of `layer_types` "sliding_attention" see only `sliding_window` positions and the
    #: "full_attention" ones all: one stack of each (Gemma 3's five local layers to one global,
    #: `_sliding_window_pattern` 6 when the config lists no `layer_types`).
    windows_by_layer_type: bool = False


_GEMMA = LlamaVariant(tied_default=True, norm_scales_in_fp32=True)
_QWEN2 = LlamaVariant(qkv_bias_default=True, o_bias_follows_attention_bias=False)

VARIANTS: dict[str, LlamaVariant] = {
    "llama": LlamaVariant(),
    "mistral": LlamaVariant(),
    "yi": LlamaVariant(),
    "cohere": LlamaVariant(),
    "granite": LlamaVariant(),
    "internlm2": LlamaVariant(),
    "qwen2": _QWEN2,
    "qwen3": LlamaVariant(qk_norm=QkNorm.PER_HEAD),
    "gemma": _GEMMA,
    "gemma2": LlamaVariant(n_norms=4, tied_default=True, norm_scales_in_fp32=True,
                           softcap=True),
    "gemma3_text": LlamaVariant(n_norms=4, qk_norm=QkNorm.PER_HEAD, tied_default=True,
                                windows_by_layer_type=True,
                                norm_scales_in_fp32=True),
    "mixtral": LlamaVariant(moe=MoeLayout(expert_width_key="intermediate_size")),
    "qwen2_moe": LlamaVariant(qkv_bias_default=True, o_bias_follows_attention_bias=False,
                              moe=MoeLayout(shared_expert=True)),
    "qwen3_moe": LlamaVariant(qk_norm=QkNorm.PER_HEAD, moe=MoeLayout()),
    # OLMo 2 scales in fp32 and casts after: `(self.weight * hidden_states).to(input_dtype)`
    # (transformers/models/olmo2/modeling_olmo2.py@v5.24.0 Olmo2RMSNorm)
    # and applies post_attention_layernorm / post_feedforward_layernorm to the sublayers'
    # outputs, with no norm before them (post_norm)
    "olmo2": LlamaVariant(qk_norm=QkNorm.FULL_WIDTH, norm_scales_in_fp32=True, post_norm=True),
    # OLMoE (transformers/models/olmoe/modeling_olmoe.py@v5.24.0): OLMo 2's full-width q/k
    # norms, 64 routed experts (OlmoeExperts' 3-D banks) of width intermediate_size, no
    # shared expert
    "olmoe": LlamaVariant(qk_norm=QkNorm.FULL_WIDTH,
                          moe=MoeLayout(expert_width_key="intermediate_size")),
    "olmo": LlamaVariant(parametric_norms=False),
    "stablelm": LlamaVariant(qkv_bias_key="use_qkv_bias", layer_norm=True),
}


@dataclass(frozen=True, slots=True)
class LlamaLike:
    """The Llama builder for one variant."""

    variant: LlamaVariant

    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _llama_like(name, model_type, self.variant, r)


@dataclass(frozen=True, slots=True)
class MistralOrMixtral:
    """`mistral` configs with `num_local_experts` are Mixtral's (early Mixtral uploads)."""

    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        if r.has("num_local_experts"):
            return _llama_like(name, "mixtral", VARIANTS["mixtral"], r)
        return _llama_like(name, model_type, VARIANTS["mistral"], r)


def _experts(h: int, moe: MoeLayout, r: ConfigReader) -> tuple[list[Linear], int, int, int]:
    """Router, expert banks (and a shared expert): the linears, E, top-k and expert width."""
    n_experts = r.int("num_local_experts", "num_experts")
    top_k = r.int("num_experts_per_tok")
    if top_k > n_experts:
        raise ConfigError("num_experts_per_tok", f"must be at most {n_experts}")
    expert_inter = r.int(moe.expert_width_key)
    fraction = top_k / n_experts
    linears = [
        Linear(name="gate", role=Role.ROUTER, d_in=h, d_out=n_experts),
        # Transformers 5 stores each expert bank as 3-D tensors: gate and up fused.
        Linear(name="experts.gate_up_proj", role=Role.GATE_UP, d_in=h, d_out=2 * expert_inter,
               parts=(expert_inter, expert_inter), copies=n_experts, token_fraction=fraction),
        Linear(name="experts.down_proj", role=Role.DOWN, d_in=expert_inter, d_out=h,
               copies=n_experts, token_fraction=fraction),
    ]
    if moe.shared_expert:
        shared = r.int("shared_expert_intermediate_size")
        linears.extend(gated_mlp(h, shared))
        linears.append(Linear(name="shared_expert_gate", role=Role.AUX, d_in=h, d_out=1))
    return linears, n_experts, top_k, expert_inter


def _llama_like(name: str, model_type: str, v: LlamaVariant, r: ConfigReader) -> ModelSpec:
    """Llama and its relatives: RMSNorm, GQA, gated MLP; variations from the variant row."""
    h = r.int("hidden_size")
    vocab = r.int("vocab_size")
    n_layers = r.int("num_hidden_layers")
    n_heads = r.int("num_attention_heads")
    n_kv = r.int("num_key_value_heads", default=n_heads)
    head_dim = r.int("head_dim", default=h // n_heads)
    if n_heads % n_kv:
        raise ConfigError("num_key_value_heads", f"must divide num_attention_heads ({n_heads})")
    qkv_bias = r.bool("attention_bias", v.qkv_bias_default)
    if v.qkv_bias_key != "attention_bias":
        qkv_bias = r.bool(v.qkv_bias_key, v.qkv_bias_default)
    o_bias = r.bool("attention_bias", False) and v.o_bias_follows_attention_bias
    mlp_bias = r.bool("mlp_bias", False)
    linears: list[Linear] = list(attention_linears(
        h, n_heads, n_kv, head_dim, names=("q_proj", "k_proj", "v_proj", "o_proj"),
        qkv_bias=qkv_bias, o_bias=o_bias,
    ))
    norm_kind = NormKind.LAYER if v.layer_norm else NormKind.RMS
    norm_width = 2 * h if norm_kind is NormKind.LAYER else h  # LayerNorm has a bias
    other = v.n_norms * norm_width
    if v.qk_norm is QkNorm.FULL_WIDTH:
        other += n_heads * head_dim + n_kv * head_dim
    elif v.qk_norm is QkNorm.PER_HEAD:
        other += 2 * head_dim
    if not v.parametric_norms:
        other = 0
    n_experts = 0
    top_k = 0
    if v.moe is not None:
        experts, n_experts, top_k, inter = _experts(h, v.moe, r)
        linears.extend(experts)
    else:
        inter = r.int("intermediate_size")
        linears.extend(gated_mlp(h, inter, mlp_bias))
    tied = r.bool("tie_word_embeddings", v.tied_default)
    sliding = r.int("sliding_window", default=0) if r.has("sliding_window") else 0
    softcap = v.softcap and r.float("attn_logit_softcapping", 50.0) > 0
    stack = LayerStack(
        name="decoder", count=n_layers, linears=tuple(linears), other_params=other,
        n_norms=v.n_norms, norm_kind=norm_kind, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, mlp_kind=MlpKind.GATED, intermediate_size=inter,
        n_experts=n_experts, experts_per_token=top_k, attn_softcap=softcap,
        qk_norm=v.qk_norm is not QkNorm.NONE, norm_scales_in_fp32=v.norm_scales_in_fp32,
        post_norm=v.post_norm,
    )
    final_norm = norm_width if v.parametric_norms else 0
    stacks = _by_window(stack, r, sliding) if v.windows_by_layer_type and sliding else (stack,)
    return ModelSpec(
        name=name, family=model_type, hidden_size=h, vocab_size=vocab, stacks=stacks,
        embedding_params=vocab * h, extra_params=final_norm, tied_embeddings=tied,
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
        sliding_window=sliding or None,
        final_softcap=v.softcap and r.float("final_logit_softcapping", 30.0) > 0,
    )


def _by_window(stack: LayerStack, r: ConfigReader, window: int) -> tuple[LayerStack, ...]:
    """The decoder split into its sliding-window and its global layers (`layer_types`, else
    every 6th layer global: Gemma3TextConfig@v5.24.0 `_sliding_window_pattern`)."""
    given = r.config.get("layer_types")
    if isinstance(given, list) and len(given) == stack.count:
        kinds = [str(k) for k in given]
    else:
        pattern = r.int("sliding_window_pattern", "_sliding_window_pattern", default=6)
        kinds = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(stack.count)]
    order = list(dict.fromkeys(kinds))
    order.remove(kinds[-1])
    return tuple(stack.model_copy(update={
        "name": kind, "count": kinds.count(kind),
        "attention_window": window if kind == "sliding_attention" else None})
        for kind in (*order, kinds[-1]))
