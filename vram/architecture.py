"""A model's shape, read from a Hugging Face `config.json`, with exact parameter counts.

A `ModelSpec` lists, per stack of identical layers, every Linear layer with its Hugging Face
module name, its input and output widths and whether it has a bias. Everything else the
estimator needs (norm widths, attention shape, MLP type, MoE routing) is a field too. Parameter
counts follow from the spec and equal `model.num_parameters()` of the Transformers model.

    >>> spec = model_from_config({"model_type": "llama", ...})
    >>> spec.n_params
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from vram.config_checks import checked_model
from vram.errors import ConfigError, FileReadError
from vram.files import read_limited

#: Largest config.json accepted: real ones are a few KB; anything bigger is not a config.
MAX_CONFIG_BYTES = 1_000_000

_LIMITS: dict[str, int] = {
    "vocab_size": 10_000_000,
    "hidden_size": 1_000_000,
    "intermediate_size": 4_000_000,
    "num_hidden_layers": 10_000,
    "num_attention_heads": 100_000,
    "num_key_value_heads": 100_000,
    "head_dim": 100_000,
    "max_position_embeddings": 100_000_000,
    "num_local_experts": 100_000,
    "num_experts_per_tok": 100_000,
}


class Role(StrEnum):
    """What a Linear layer does, independent of how a family names it."""

    Q = "q"
    K = "k"
    V = "v"
    QKV = "qkv"
    O = "o"  # noqa: E741 - the attention output projection
    GATE = "gate"
    UP = "up"
    GATE_UP = "gate_up"
    DOWN = "down"
    ROUTER = "router"
    CROSS_Q = "cross_q"
    CROSS_K = "cross_k"
    CROSS_V = "cross_v"
    CROSS_O = "cross_o"


#: Which LoRA target names (PEFT naming) select which roles.
TARGET_ROLES: dict[str, frozenset[Role]] = {
    "q_proj": frozenset({Role.Q, Role.CROSS_Q}),
    "k_proj": frozenset({Role.K, Role.CROSS_K}),
    "v_proj": frozenset({Role.V, Role.CROSS_V}),
    "o_proj": frozenset({Role.O, Role.CROSS_O}),
    "gate_proj": frozenset({Role.GATE}),
    "up_proj": frozenset({Role.UP}),
    "down_proj": frozenset({Role.DOWN}),
}

#: For a fused projection, the roles it holds.
FUSED_PARTS: dict[Role, frozenset[Role]] = {
    Role.QKV: frozenset({Role.Q, Role.K, Role.V}),
    Role.GATE_UP: frozenset({Role.GATE, Role.UP}),
}


class Linear(BaseModel):
    """One `nn.Linear` of a layer (or `copies` of it, for MoE experts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    role: Role
    d_in: int
    d_out: int
    bias: bool = False
    copies: int = 1
    #: Output widths of the parts of a fused projection (q, k, v) or (gate, up), in order.
    parts: tuple[int, ...] = ()
    #: Tokens that pass through each copy, as a fraction of all tokens (top-k / experts).
    token_fraction: float = 1.0

    @property
    def weight_params(self) -> int:
        return self.d_in * self.d_out * self.copies

    @property
    def params(self) -> int:
        return (self.d_in * self.d_out + (self.d_out if self.bias else 0)) * self.copies


class MlpKind(StrEnum):
    GATED = "gated"  # SwiGLU / GeGLU: act(gate(x)) * up(x), then down
    PLAIN = "plain"  # fc1 -> act -> fc2


class NormKind(StrEnum):
    RMS = "rms"
    LAYER = "layer"


class Stack(BaseModel):
    """`count` identical layers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    count: int
    linears: tuple[Linear, ...]
    #: Parameters per layer that are not in a Linear (norm weights and biases).
    other_params: int
    n_norms: int
    norm_kind: NormKind
    n_heads: int
    n_kv_heads: int
    head_dim: int
    mlp_kind: MlpKind
    intermediate_size: int
    causal: bool = True
    cross_attention: bool = False
    parallel_residual: bool = False
    n_experts: int = 0
    experts_per_token: int = 0
    #: Gemma 2 style soft-capping of attention logits (forces explicit scores in some stacks).
    attn_softcap: bool = False
    #: Gemma's RMSNorm scales in fp32 (`normed * (1.0 + weight.float())`) and casts after, so a
    #: trained weight keeps the fp32 normalized input (Llama's casts first, then scales).
    norm_scales_in_fp32: bool = False
    #: Query/key norms inside attention (Qwen3, OLMo 2).
    qk_norm: bool = False
    #: Transformers' eager attention takes the softmax in fp32 and casts the probabilities
    #: back (Llama family, Phi, Gemma 2, GPT-NeoX, BLOOM); Falcon, BERT and T5 take it in the
    #: scores' own dtype.
    softmax_upcast: bool = True
    #: The layer returns its eager attention probabilities with its output, and the model's
    #: loop holds that output until the next layer returns (Transformers' Falcon).
    returns_attention_probs: bool = False
    #: Transformers' eager attention multiplies by k and v broadcast over the query heads
    #: (Falcon's `query_layer @ key_layer.transpose(-1, -2)`) instead of materializing
    #: `repeat_kv` copies, which the matmuls then keep (Llama family).
    eager_broadcasts_kv: bool = False
    #: Dropout in training: on attention probabilities and on the residual branches.
    attn_dropout: float = 0.0
    hidden_dropout: float = 0.0
    #: I-wide tensors the MLP activation keeps for backward in Transformers' implementation:
    #: 1 for fused kernels (SiLU, F.gelu), 4 for the Python tanh formula of `gelu_new` /
    #: `gelu_fast` (its input, tanh output, 0.5·x and 1 + tanh), 2 for `quick_gelu`.
    act_saved: int = 1

    @property
    def params_per_layer(self) -> int:
        return sum(linear.params for linear in self.linears) + self.other_params

    @property
    def params(self) -> int:
        return self.count * self.params_per_layer


class HeadKind(StrEnum):
    LM = "lm"  # next-token logits over the vocabulary
    CLASSIFIER = "classifier"  # a small sequence-classification head


class ModelSpec(BaseModel):
    """Everything about a model that decides its training memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    family: str
    hidden_size: int
    vocab_size: int
    stacks: tuple[Stack, ...]
    #: Token embedding parameters (vocab x hidden), shared between encoder and decoder.
    embedding_params: int
    #: Learned position / token-type embeddings and embedding norms.
    embedding_extra_params: int = 0
    #: Final norms and other parameters outside the layers and the head.
    extra_params: int = 0
    tied_embeddings: bool = True
    head_kind: HeadKind = HeadKind.LM
    head_bias: bool = False
    n_labels: int = 2
    max_position_embeddings: int = 0
    sliding_window: int | None = None
    #: Gemma 2 soft-caps the final logits (tanh), which keeps one more vocabulary-wide tensor.
    final_softcap: bool = False
    approximate: bool = False

    @property
    def head_params(self) -> int:
        """The output layer's own parameters (zero when it is tied to the embedding)."""
        if self.head_kind is HeadKind.CLASSIFIER:
            return 0  # not part of the published backbone count; a few thousand parameters
        weight = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return weight + (self.vocab_size if self.head_bias else 0)

    @property
    def layer_params(self) -> int:
        return sum(stack.params for stack in self.stacks)

    @property
    def n_params(self) -> int:
        """Total parameters, as `model.num_parameters()` counts them."""
        return (
            self.embedding_params
            + self.embedding_extra_params
            + self.layer_params
            + self.extra_params
            + self.head_params
        )

    @property
    def n_layers(self) -> int:
        return sum(stack.count for stack in self.stacks)

    @property
    def decoder(self) -> Stack:
        """The stack that produces the output (the last one)."""
        return self.stacks[-1]

    @property
    def is_moe(self) -> bool:
        return any(stack.n_experts > 0 for stack in self.stacks)

    @property
    def is_encoder_decoder(self) -> bool:
        return len(self.stacks) > 1


# --------------------------------------------------------------------------------------------
# Reading a config
# --------------------------------------------------------------------------------------------


class _Reader:
    """Typed access to a config dict; every problem names the key."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def int(self, key: str, *alternatives: str, default: int | None = None) -> int:
        for name in (key, *alternatives):
            value = self.config.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    raise ConfigError(name, f"must be a whole number, got {value!r:.40}")
            limit = _LIMITS.get(name, 100_000_000)
            if not 1 <= value <= limit:
                raise ConfigError(name, f"must be between 1 and {limit:,}, got {value:,}")
            return value
        if default is not None:
            return default
        raise ConfigError(key, "missing: this architecture needs it")

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false, got {value!r:.40}")
        return value

    def float(self, key: str, default: float) -> float:
        value = self.config.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value
        ):
            raise ConfigError(key, f"must be a number, got {value!r:.40}")
        return float(value)

    def str(self, key: str, default: str) -> str:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(key, f"must be text, got {value!r:.40}")
        return value


#: transformers.activations: which activations are Python formulas and what they keep.
_ACT_SAVED: dict[str, int] = {"gelu_new": 4, "gelu_fast": 4, "quick_gelu": 2}


def _act_saved(r: _Reader, key: str = "hidden_act", default: str = "silu") -> int:
    return _ACT_SAVED.get(r.str(key, default), 1)


def _attention_linears(
    h: int, n_heads: int, n_kv: int, head_dim: int, *, names: tuple[str, str, str, str],
    qkv_bias: bool, o_bias: bool, prefix: str = "",
) -> tuple[Linear, ...]:
    q_name, k_name, v_name, o_name = names
    q_out, kv_out = n_heads * head_dim, n_kv * head_dim
    cross = prefix == "cross_"
    return (
        Linear(name=q_name, role=Role.CROSS_Q if cross else Role.Q, d_in=h, d_out=q_out,
               bias=qkv_bias),
        Linear(name=k_name, role=Role.CROSS_K if cross else Role.K, d_in=h, d_out=kv_out,
               bias=qkv_bias),
        Linear(name=v_name, role=Role.CROSS_V if cross else Role.V, d_in=h, d_out=kv_out,
               bias=qkv_bias),
        Linear(name=o_name, role=Role.CROSS_O if cross else Role.O, d_in=q_out, d_out=h,
               bias=o_bias),
    )


def _fused_qkv(h: int, n_heads: int, n_kv: int, head_dim: int, name: str, bias: bool) -> Linear:
    q_out, kv_out = n_heads * head_dim, n_kv * head_dim
    return Linear(name=name, role=Role.QKV, d_in=h, d_out=q_out + 2 * kv_out, bias=bias,
                  parts=(q_out, kv_out, kv_out))


def _gated_mlp(h: int, inter: int, bias: bool = False, *, names: tuple[str, str, str] = (
    "gate_proj", "up_proj", "down_proj"), copies: int = 1, token_fraction: float = 1.0,
) -> tuple[Linear, ...]:
    gate, up, down = names
    return (
        Linear(name=gate, role=Role.GATE, d_in=h, d_out=inter, bias=bias, copies=copies,
               token_fraction=token_fraction),
        Linear(name=up, role=Role.UP, d_in=h, d_out=inter, bias=bias, copies=copies,
               token_fraction=token_fraction),
        Linear(name=down, role=Role.DOWN, d_in=inter, d_out=h, bias=bias, copies=copies,
               token_fraction=token_fraction),
    )


def _plain_mlp(h: int, inter: int, bias: bool, names: tuple[str, str]) -> tuple[Linear, ...]:
    return (
        Linear(name=names[0], role=Role.UP, d_in=h, d_out=inter, bias=bias),
        Linear(name=names[1], role=Role.DOWN, d_in=inter, d_out=h, bias=bias),
    )


_LLAMA_LIKE = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "mixtral",
    "qwen2_moe", "qwen3_moe", "olmo2", "olmo", "yi", "stablelm", "cohere", "granite",
    "internlm2", "deepseek_v2_lite_none",
}


def _llama_like(name: str, family: str, r: _Reader) -> ModelSpec:
    """Llama and its relatives: RMSNorm, GQA, gated MLP; variations named by family."""
    h = r.int("hidden_size")
    vocab = r.int("vocab_size")
    n_layers = r.int("num_hidden_layers")
    n_heads = r.int("num_attention_heads")
    n_kv = r.int("num_key_value_heads", default=n_heads)
    head_dim = r.int("head_dim", default=h // n_heads)
    if n_heads % n_kv:
        raise ConfigError("num_key_value_heads", f"must divide num_attention_heads ({n_heads})")
    qkv_bias = r.bool("attention_bias", family in {"qwen2", "qwen2_moe"})
    if family == "stablelm":
        qkv_bias = r.bool("use_qkv_bias", False)
    o_bias = r.bool("attention_bias", False) and family not in {"qwen2", "qwen2_moe"}
    mlp_bias = r.bool("mlp_bias", False)
    linears: list[Linear] = list(_attention_linears(
        h, n_heads, n_kv, head_dim, names=("q_proj", "k_proj", "v_proj", "o_proj"),
        qkv_bias=qkv_bias, o_bias=o_bias,
    ))
    norm_kind = NormKind.LAYER if family == "stablelm" else NormKind.RMS
    norm_width = 2 * h if norm_kind is NormKind.LAYER else h  # LayerNorm has a bias
    n_norms = 4 if family in {"gemma2", "gemma3_text"} else 2
    other = n_norms * norm_width
    qk_norm = family in {"qwen3", "qwen3_moe", "gemma3_text", "olmo2"}
    if family == "olmo2":
        other = 2 * h + n_heads * head_dim + n_kv * head_dim  # post norms + q/k norms
    elif qk_norm:
        other += 2 * head_dim
    if family == "olmo":
        other = 0  # OLMo 1 uses non-parametric LayerNorm
    n_experts = 0
    top_k = 0
    if family in {"mixtral", "qwen2_moe", "qwen3_moe"}:
        n_experts = r.int("num_local_experts", "num_experts")
        top_k = r.int("num_experts_per_tok")
        if top_k > n_experts:
            raise ConfigError("num_experts_per_tok", f"must be at most {n_experts}")
        expert_inter = (
            r.int("intermediate_size") if family == "mixtral" else r.int("moe_intermediate_size")
        )
        linears.append(Linear(name="gate", role=Role.ROUTER, d_in=h, d_out=n_experts))
        # Transformers 5 stores each expert bank as 3-D tensors: gate and up fused.
        fraction = top_k / n_experts
        linears.append(Linear(name="experts.gate_up_proj", role=Role.GATE_UP, d_in=h,
                              d_out=2 * expert_inter, parts=(expert_inter, expert_inter),
                              copies=n_experts, token_fraction=fraction))
        linears.append(Linear(name="experts.down_proj", role=Role.DOWN, d_in=expert_inter,
                              d_out=h, copies=n_experts, token_fraction=fraction))
        if family == "qwen2_moe":
            shared = r.int("shared_expert_intermediate_size")
            linears.extend(_gated_mlp(h, shared))
            linears.append(Linear(name="shared_expert_gate", role=Role.ROUTER, d_in=h, d_out=1))
        inter = expert_inter
    else:
        inter = r.int("intermediate_size")
        linears.extend(_gated_mlp(h, inter, mlp_bias))
    tied_default = family in {"gemma", "gemma2", "gemma3_text"}
    tied = r.bool("tie_word_embeddings", tied_default)
    sliding = r.int("sliding_window", default=0) if r.has("sliding_window") else 0
    softcap = family == "gemma2" and r.float("attn_logit_softcapping", 50.0) > 0
    stack = Stack(
        name="decoder", count=n_layers, linears=tuple(linears), other_params=other,
        n_norms=n_norms, norm_kind=norm_kind, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, mlp_kind=MlpKind.GATED, intermediate_size=inter,
        n_experts=n_experts, experts_per_token=top_k, attn_softcap=softcap, qk_norm=qk_norm,
        norm_scales_in_fp32=family in {"gemma", "gemma2", "gemma3_text"},
    )
    final_norm = 0 if family == "olmo" else norm_width
    return ModelSpec(
        name=name, family=family, hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, extra_params=final_norm, tied_embeddings=tied,
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
        sliding_window=sliding or None,
        final_softcap=family == "gemma2" and r.float("final_logit_softcapping", 30.0) > 0,
    )


def _phi3(name: str, r: _Reader) -> ModelSpec:
    """Phi-3: fused qkv_proj and gate_up_proj, RMSNorm, untied head."""
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    n_kv = r.int("num_key_value_heads", default=n_heads)
    head_dim = h // n_heads
    inter = r.int("intermediate_size")
    linears = (
        _fused_qkv(h, n_heads, n_kv, head_dim, "qkv_proj", False),
        Linear(name="o_proj", role=Role.O, d_in=n_heads * head_dim, d_out=h),
        Linear(name="gate_up_proj", role=Role.GATE_UP, d_in=h, d_out=2 * inter,
               parts=(inter, inter)),
        Linear(name="down_proj", role=Role.DOWN, d_in=inter, d_out=h),
    )
    stack = Stack(
        name="decoder", count=r.int("num_hidden_layers"), linears=linears, other_params=2 * h,
        n_norms=2, norm_kind=NormKind.RMS, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        mlp_kind=MlpKind.GATED, intermediate_size=inter,
    )
    vocab = r.int("vocab_size")
    sliding = r.int("sliding_window", default=0) if r.has("sliding_window") else 0
    return ModelSpec(
        name=name, family="phi3", hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, extra_params=h, tied_embeddings=r.bool(
            "tie_word_embeddings", False),
        max_position_embeddings=r.int("max_position_embeddings", default=4096),
        sliding_window=sliding or None,
    )


def _phi(name: str, r: _Reader) -> ModelSpec:
    """Phi-1/1.5/2: biases everywhere, one LayerNorm per block, parallel attention and MLP."""
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    n_kv = r.int("num_key_value_heads", default=n_heads)
    head_dim = h // n_heads
    inter = r.int("intermediate_size")
    linears = (
        *_attention_linears(h, n_heads, n_kv, head_dim, names=("q_proj", "k_proj", "v_proj",
                            "dense"), qkv_bias=True, o_bias=True),
        *_plain_mlp(h, inter, True, ("fc1", "fc2")),
    )
    stack = Stack(
        name="decoder", count=r.int("num_hidden_layers"), linears=linears, other_params=2 * h,
        n_norms=1, norm_kind=NormKind.LAYER, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, mlp_kind=MlpKind.PLAIN, intermediate_size=inter,
        parallel_residual=True, act_saved=_act_saved(r, default="gelu_new"),
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family="phi", hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, extra_params=2 * h,
        tied_embeddings=r.bool("tie_word_embeddings", False), head_bias=True,
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
    )


def _falcon(name: str, r: _Reader) -> ModelSpec:
    """Falcon: fused query_key_value (multi-query or grouped), parallel attention, tied head."""
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads", "n_head")
    new_arch = r.bool("new_decoder_architecture", False)
    multi_query = r.bool("multi_query", True)
    if new_arch:
        n_kv = r.int("num_kv_heads", "num_key_value_heads", default=n_heads)
    else:
        n_kv = 1 if multi_query else n_heads
    head_dim = h // n_heads
    bias = r.bool("bias", False)
    inter = r.int("ffn_hidden_size", "intermediate_size", default=4 * h)
    linears = (
        _fused_qkv(h, n_heads, n_kv, head_dim, "query_key_value", bias),
        Linear(name="dense", role=Role.O, d_in=h, d_out=h, bias=bias),
        *_plain_mlp(h, inter, bias, ("dense_h_to_4h", "dense_4h_to_h")),
    )
    parallel = r.bool("parallel_attn", True)
    n_norms = 2 if (new_arch or not parallel) else 1
    stack = Stack(
        name="decoder", count=r.int("num_hidden_layers", "n_layer"), linears=linears,
        other_params=n_norms * 2 * h, n_norms=n_norms, norm_kind=NormKind.LAYER,
        n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, mlp_kind=MlpKind.PLAIN,
        intermediate_size=inter, parallel_residual=parallel, softmax_upcast=False,
        returns_attention_probs=True, eager_broadcasts_kv=True,
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family="falcon", hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, extra_params=2 * h,
        tied_embeddings=r.bool("tie_word_embeddings", True),
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
    )


def _gpt_neox(name: str, r: _Reader) -> ModelSpec:
    """GPT-NeoX / Pythia / StableLM-alpha: fused qkv, biases, two LayerNorms, parallel residual."""
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    head_dim = h // n_heads
    inter = r.int("intermediate_size", default=4 * h)
    bias = r.bool("attention_bias", True)
    linears = (
        _fused_qkv(h, n_heads, n_heads, head_dim, "query_key_value", bias),
        Linear(name="dense", role=Role.O, d_in=h, d_out=h, bias=bias),
        *_plain_mlp(h, inter, True, ("dense_h_to_4h", "dense_4h_to_h")),
    )
    stack = Stack(
        name="decoder", count=r.int("num_hidden_layers"), linears=linears, other_params=4 * h,
        n_norms=2, norm_kind=NormKind.LAYER, n_heads=n_heads, n_kv_heads=n_heads,
        head_dim=head_dim, mlp_kind=MlpKind.PLAIN, intermediate_size=inter,
        parallel_residual=r.bool("use_parallel_residual", True),
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family="gpt_neox", hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, extra_params=2 * h,
        tied_embeddings=r.bool("tie_word_embeddings", False),
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
    )


def _bloom(name: str, r: _Reader) -> ModelSpec:
    """BLOOM: ALiBi, fused qkv, biases, an embedding LayerNorm, tied head."""
    h = r.int("hidden_size", "n_embed")
    n_heads = r.int("n_head", "num_attention_heads")
    head_dim = h // n_heads
    inter = 4 * h
    linears = (
        _fused_qkv(h, n_heads, n_heads, head_dim, "query_key_value", True),
        Linear(name="dense", role=Role.O, d_in=h, d_out=h, bias=True),
        *_plain_mlp(h, inter, True, ("dense_h_to_4h", "dense_4h_to_h")),
    )
    stack = Stack(
        name="decoder", count=r.int("n_layer", "num_hidden_layers"), linears=linears,
        other_params=4 * h, n_norms=2, norm_kind=NormKind.LAYER, n_heads=n_heads,
        n_kv_heads=n_heads, head_dim=head_dim, mlp_kind=MlpKind.PLAIN, intermediate_size=inter,
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family="bloom", hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, embedding_extra_params=2 * h, extra_params=2 * h,
        tied_embeddings=r.bool("tie_word_embeddings", True),
        max_position_embeddings=r.int("seq_length", "max_position_embeddings", default=2048),
    )


def _t5(name: str, family: str, r: _Reader) -> ModelSpec:
    """T5 / mT5 / T0: encoder-decoder, relative position bias, gated or plain FF, no biases."""
    d = r.int("d_model")
    d_ff = r.int("d_ff")
    d_kv = r.int("d_kv")
    n_heads = r.int("num_heads")
    n_enc = r.int("num_layers")
    n_dec = r.int("num_decoder_layers", default=n_enc)
    ff_proj = r.str("feed_forward_proj", "relu")
    gated = ff_proj.startswith("gated")
    buckets = r.int("relative_attention_num_buckets", default=32)
    inner = n_heads * d_kv

    def attention(prefix: str) -> tuple[Linear, ...]:
        cross = prefix == "cross_"
        roles = (
            (Role.CROSS_Q, Role.CROSS_K, Role.CROSS_V, Role.CROSS_O) if cross
            else (Role.Q, Role.K, Role.V, Role.O)
        )
        return tuple(
            Linear(name=n, role=role, d_in=d if n != "o" else inner,
                   d_out=inner if n != "o" else d)
            for n, role in zip(("q", "k", "v", "o"), roles, strict=True)
        )

    if gated:
        ff: tuple[Linear, ...] = _gated_mlp(d, d_ff, names=("wi_0", "wi_1", "wo"))
    else:
        ff = _plain_mlp(d, d_ff, False, ("wi", "wo"))
    mlp_kind = MlpKind.GATED if gated else MlpKind.PLAIN
    rel_bias = buckets * n_heads  # in the first layer of each stack
    dropout = r.float("dropout_rate", 0.1)  # T5Config default
    act_saved = _act_saved(r, "dense_act_fn", "gelu_new" if gated else "relu")
    encoder = Stack(
        name="encoder", count=n_enc, linears=(*attention(""), *ff), other_params=2 * d,
        n_norms=2, norm_kind=NormKind.RMS, n_heads=n_heads, n_kv_heads=n_heads, head_dim=d_kv,
        mlp_kind=mlp_kind, intermediate_size=d_ff, causal=False, attn_dropout=dropout,
        hidden_dropout=dropout, act_saved=act_saved, softmax_upcast=False,
    )
    decoder = Stack(
        name="decoder", count=n_dec, linears=(*attention(""), *attention("cross_"), *ff),
        other_params=3 * d, n_norms=3, norm_kind=NormKind.RMS, n_heads=n_heads,
        n_kv_heads=n_heads, head_dim=d_kv, mlp_kind=mlp_kind, intermediate_size=d_ff,
        cross_attention=True, attn_dropout=dropout, hidden_dropout=dropout,
        act_saved=act_saved, softmax_upcast=False,
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family=family, hidden_size=d, vocab_size=vocab, stacks=(encoder, decoder),
        embedding_params=vocab * d, extra_params=2 * d + 2 * rel_bias,
        tied_embeddings=r.bool("tie_word_embeddings", True),
        max_position_embeddings=r.int("n_positions", default=512),
    )


def _bert(name: str, r: _Reader) -> ModelSpec:
    """BERT encoder with pooler, trained with a small classification head."""
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    inter = r.int("intermediate_size")
    head_dim = h // n_heads
    linears = (
        *_attention_linears(h, n_heads, n_heads, head_dim, names=("query", "key", "value",
                            "dense"), qkv_bias=True, o_bias=True),
        *_plain_mlp(h, inter, True, ("intermediate.dense", "output.dense")),
    )
    stack = Stack(
        name="encoder", count=r.int("num_hidden_layers"), linears=linears, other_params=4 * h,
        n_norms=2, norm_kind=NormKind.LAYER, n_heads=n_heads, n_kv_heads=n_heads,
        head_dim=head_dim, mlp_kind=MlpKind.PLAIN, intermediate_size=inter, causal=False,
        attn_dropout=r.float("attention_probs_dropout_prob", 0.1),  # BertConfig defaults
        hidden_dropout=r.float("hidden_dropout_prob", 0.1), softmax_upcast=False,
    )
    vocab = r.int("vocab_size")
    max_pos = r.int("max_position_embeddings", default=512)
    type_vocab = r.int("type_vocab_size", default=2)
    return ModelSpec(
        name=name, family="bert", hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, embedding_extra_params=(max_pos + type_vocab) * h + 2 * h,
        extra_params=h * h + h, tied_embeddings=True, head_kind=HeadKind.CLASSIFIER,
        n_labels=2, max_position_embeddings=max_pos,
    )


SUPPORTED_FAMILIES: tuple[str, ...] = tuple(sorted(
    (_LLAMA_LIKE - {"deepseek_v2_lite_none"})
    | {"phi3", "phi", "falcon", "gpt_neox", "bloom", "t5", "mt5", "bert"}
))


def model_from_config(config: Mapping[str, Any], name: str = "custom model") -> ModelSpec:
    """Read a Hugging Face config dict. Raises ConfigError naming the key that is wrong."""
    return checked_model(config, lambda: _read_model(config, name))  # vram.config_checks


def _read_model(config: Mapping[str, Any], name: str) -> ModelSpec:
    if not isinstance(config, Mapping):
        raise ConfigError("config.json", "must be a JSON object")
    r = _Reader(config)
    family = r.str("model_type", "")
    if not family:
        raise ConfigError("model_type", "missing: cannot tell the architecture")
    family = family.lower()
    if family == "mistral" and r.has("num_local_experts"):
        family = "mixtral"
    if family in _LLAMA_LIKE:
        return _llama_like(name, family, r)
    builders = {
        "phi3": _phi3, "phi": _phi, "falcon": _falcon, "RefinedWebModel".lower(): _falcon,
        "gpt_neox": _gpt_neox, "bloom": _bloom, "bert": _bert,
    }
    if family in builders:
        return builders[family](name, r)
    if family in {"t5", "mt5", "umt5"}:
        return _t5(name, family, r)
    allowed = ", ".join(SUPPORTED_FAMILIES)
    raise ConfigError("model_type", f"{family!r:.40} is not supported; supported: {allowed}")


def _reject_constant(name: str) -> float:
    raise ConfigError("config.json", f"{name} is not a valid number")


def read_config_text(text: str | bytes) -> dict[str, Any]:
    """Parse config.json text safely: size-capped, JSON only, no NaN or Infinity."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            "config.json", f"too large ({len(text):,} bytes; a config is at most "
            f"{MAX_CONFIG_BYTES:,} bytes)"
        )
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ConfigError("config.json", f"not valid JSON ({str(exc)[:80]})") from None
    except ConfigError:
        raise
    except ValueError:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits)
        raise ConfigError("config.json", "a number is too long (no config value has more "
                          "than 4,300 digits)") from None
    if not isinstance(data, dict):
        raise ConfigError("config.json", "must be a JSON object")
    return data


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
