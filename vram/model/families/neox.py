"""GPT-NeoX / Pythia and BLOOM: fused qkv with biases, LayerNorms, plain GELU MLP."""

from __future__ import annotations

from dataclasses import dataclass

from vram.model.config_reader import ConfigReader
from vram.model.families.base import fused_qkv, plain_mlp
from vram.model.spec import LayerStack, Linear, MlpKind, ModelSpec, NormKind, Role


@dataclass(frozen=True, slots=True)
class GptNeox:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _gpt_neox(name, r)


@dataclass(frozen=True, slots=True)
class Bloom:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _bloom(name, r)


def _gpt_neox(name: str, r: ConfigReader) -> ModelSpec:
    """GPT-NeoX / Pythia / StableLM-alpha: fused qkv, biases, two LayerNorms, parallel residual."""
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    head_dim = h // n_heads
    inter = r.int("intermediate_size", default=4 * h)
    bias = r.bool("attention_bias", True)
    linears = (
        fused_qkv(h, n_heads, n_heads, head_dim, "query_key_value", bias),
        Linear(name="dense", role=Role.O, d_in=h, d_out=h, bias=bias),
        *plain_mlp(h, inter, True, ("dense_h_to_4h", "dense_4h_to_h")),
    )
    stack = LayerStack(
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


def _bloom(name: str, r: ConfigReader) -> ModelSpec:
    """BLOOM: ALiBi, fused qkv, biases, an embedding LayerNorm, tied head."""
    h = r.int("hidden_size", "n_embed")
    n_heads = r.int("n_head", "num_attention_heads")
    head_dim = h // n_heads
    inter = 4 * h
    linears = (
        fused_qkv(h, n_heads, n_heads, head_dim, "query_key_value", True),
        Linear(name="dense", role=Role.O, d_in=h, d_out=h, bias=True),
        *plain_mlp(h, inter, True, ("dense_h_to_4h", "dense_4h_to_h")),
    )
    stack = LayerStack(
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
