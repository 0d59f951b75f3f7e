"""T5 / mT5 / T0: encoder-decoder, relative position bias, gated or plain FF, no biases."""

from __future__ import annotations

from dataclasses import dataclass

from vram.model.config_reader import ConfigReader
from vram.model.families.base import act_pow_fp32, act_saved, gated_mlp, plain_mlp
from vram.model.spec import LayerStack, Linear, MlpKind, ModelSpec, NormKind, Role


@dataclass(frozen=True, slots=True)
class T5:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _t5(name, model_type, r)


def _t5(name: str, family: str, r: ConfigReader) -> ModelSpec:
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
        ff: tuple[Linear, ...] = gated_mlp(d, d_ff, names=("wi_0", "wi_1", "wo"))
    else:
        ff = plain_mlp(d, d_ff, False, ("wi", "wo"))
    mlp_kind = MlpKind.GATED if gated else MlpKind.PLAIN
    rel_bias = buckets * n_heads  # in the first layer of each stack
    dropout = r.float("dropout_rate", 0.1)  # T5Config default
    act_kept = act_saved(r, "dense_act_fn", "gelu_new" if gated else "relu")
    act_pow = act_pow_fp32(r, "dense_act_fn", "gelu_new" if gated else "relu")
    encoder = LayerStack(
        name="encoder", count=n_enc, linears=(*attention(""), *ff), other_params=2 * d,
        n_norms=2, norm_kind=NormKind.RMS, n_heads=n_heads, n_kv_heads=n_heads, head_dim=d_kv,
        mlp_kind=mlp_kind, intermediate_size=d_ff, causal=False, attn_dropout=dropout,
        hidden_dropout=dropout, mlp_inner_dropout=True, act_saved=act_kept,
        act_pow_fp32=act_pow,
        softmax_upcast=False,
    )
    decoder = LayerStack(
        name="decoder", count=n_dec, linears=(*attention(""), *attention("cross_"), *ff),
        other_params=3 * d, n_norms=3, norm_kind=NormKind.RMS, n_heads=n_heads,
        n_kv_heads=n_heads, head_dim=d_kv, mlp_kind=mlp_kind, intermediate_size=d_ff,
        cross_attention=True, attn_dropout=dropout, hidden_dropout=dropout,
        mlp_inner_dropout=True,
        act_saved=act_kept, act_pow_fp32=act_pow, softmax_upcast=False,
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family=family, hidden_size=d, vocab_size=vocab, stacks=(encoder, decoder),
        embedding_params=vocab * d, extra_params=2 * d + 2 * rel_bias,
        tied_embeddings=r.bool("tie_word_embeddings", True),
        max_position_embeddings=r.int("n_positions", default=512),
    )
