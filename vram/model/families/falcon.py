"""Falcon: fused query_key_value (multi-query or grouped), parallel attention, tied head."""

from __future__ import annotations

from dataclasses import dataclass

from vram.model.config_reader import ConfigReader
from vram.model.families.base import fused_qkv, plain_mlp
from vram.model.spec import LayerStack, Linear, MlpKind, ModelSpec, NormKind, Role


@dataclass(frozen=True, slots=True)
class Falcon:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _falcon(name, r)


def _falcon(name: str, r: ConfigReader) -> ModelSpec:
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
        fused_qkv(h, n_heads, n_kv, head_dim, "query_key_value", bias),
        Linear(name="dense", role=Role.O, d_in=h, d_out=h, bias=bias),
        *plain_mlp(h, inter, bias, ("dense_h_to_4h", "dense_4h_to_h")),
    )
    parallel = r.bool("parallel_attn", True)
    n_norms = 2 if (new_arch or not parallel) else 1
    stack = LayerStack(
        name="decoder", count=r.int("num_hidden_layers", "n_layer"), linears=linears,
        other_params=n_norms * 2 * h, n_norms=n_norms, norm_kind=NormKind.LAYER,
        n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, mlp_kind=MlpKind.PLAIN,
        intermediate_size=inter, parallel_residual=parallel, softmax_upcast=False,
        returns_attention_probs=True, scores_live_through_softmax=True,
        eager_broadcasts_kv=True, hf_sdpa_runs_math=True,
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family="falcon", hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, extra_params=2 * h,
        tied_embeddings=r.bool("tie_word_embeddings", True),
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
    )
