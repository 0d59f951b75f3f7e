"""Phi-1/1.5/2 (parallel attention and MLP, biases) and Phi-3 (fused projections, RMSNorm)."""

from __future__ import annotations

from dataclasses import dataclass

from vram.model.config_reader import ConfigReader
from vram.model.families.base import (
    act_pow_fp32,
    act_saved,
    attention_linears,
    fused_qkv,
    plain_mlp,
)
from vram.model.spec import LayerStack, Linear, MlpKind, ModelSpec, NormKind, Role


@dataclass(frozen=True, slots=True)
class Phi3:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _phi3(name, r)


@dataclass(frozen=True, slots=True)
class Phi:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _phi(name, r)


def _phi3(name: str, r: ConfigReader) -> ModelSpec:
    """Phi-3: fused qkv_proj and gate_up_proj, RMSNorm, untied head."""
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    n_kv = r.int("num_key_value_heads", default=n_heads)
    head_dim = h // n_heads
    inter = r.int("intermediate_size")
    linears = (
        fused_qkv(h, n_heads, n_kv, head_dim, "qkv_proj", False),
        Linear(name="o_proj", role=Role.O, d_in=n_heads * head_dim, d_out=h),
        Linear(name="gate_up_proj", role=Role.GATE_UP, d_in=h, d_out=2 * inter,
               parts=(inter, inter)),
        Linear(name="down_proj", role=Role.DOWN, d_in=inter, d_out=h),
    )
    stack = LayerStack(
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


def _phi(name: str, r: ConfigReader) -> ModelSpec:
    """Phi-1/1.5/2: biases everywhere, one LayerNorm per block, parallel attention and MLP."""
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    n_kv = r.int("num_key_value_heads", default=n_heads)
    head_dim = h // n_heads
    inter = r.int("intermediate_size")
    linears = (
        *attention_linears(h, n_heads, n_kv, head_dim, names=("q_proj", "k_proj", "v_proj",
                            "dense"), qkv_bias=True, o_bias=True),
        *plain_mlp(h, inter, True, ("fc1", "fc2")),
    )
    stack = LayerStack(
        name="decoder", count=r.int("num_hidden_layers"), linears=linears, other_params=2 * h,
        n_norms=1, norm_kind=NormKind.LAYER, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, mlp_kind=MlpKind.PLAIN, intermediate_size=inter,
        parallel_residual=True, act_saved=act_saved(r, default="gelu_new"),
        act_pow_fp32=act_pow_fp32(r, default="gelu_new"),
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family="phi", hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, extra_params=2 * h,
        tied_embeddings=r.bool("tie_word_embeddings", False), head_bias=True,
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
    )
