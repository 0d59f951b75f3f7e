"""BERT: an encoder with a pooler, trained with a small classification head."""

from __future__ import annotations

from dataclasses import dataclass

from vram.model.config_reader import ConfigReader
from vram.model.families.base import attention_linears, plain_mlp
from vram.model.spec import HeadKind, LayerStack, MlpKind, ModelSpec, NormKind


@dataclass(frozen=True, slots=True)
class Bert:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _bert(name, r)


def _bert(name: str, r: ConfigReader) -> ModelSpec:
    """BERT encoder with pooler, trained with a small classification head."""
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    inter = r.int("intermediate_size")
    head_dim = h // n_heads
    linears = (
        *attention_linears(h, n_heads, n_heads, head_dim, names=("query", "key", "value",
                            "dense"), qkv_bias=True, o_bias=True),
        *plain_mlp(h, inter, True, ("intermediate.dense", "output.dense")),
    )
    stack = LayerStack(
        name="encoder", count=r.int("num_hidden_layers"), linears=linears, other_params=4 * h,
        n_norms=2, norm_kind=NormKind.LAYER, n_heads=n_heads, n_kv_heads=n_heads,
        head_dim=head_dim, mlp_kind=MlpKind.PLAIN, intermediate_size=inter, causal=False,
        attn_dropout=r.float("attention_probs_dropout_prob", 0.1),  # BertConfig defaults
        hidden_dropout=r.float("hidden_dropout_prob", 0.1), mlp_inner_dropout=True,
        softmax_upcast=False, input_norm=False,  # BertLayer: LayerNorm after each residual add
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
