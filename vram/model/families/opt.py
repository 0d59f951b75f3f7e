"""OPT (Meta's Open Pre-trained Transformers, facebook/opt-125m ... opt-66b).

transformers/models/opt/modeling_opt.py@v5.24.0: token embeddings of `word_embed_proj_dim`
(projected to the hidden size by `project_in`, and back by `project_out`, where the two
differ: opt-350m), learned positions `OPTLearnedPositionalEmbedding` of
`max_position_embeddings + 2` rows (the offset of 2 fairseq kept), blocks of separate
q_proj, k_proj, v_proj and out_proj and fc1 -> ReLU -> fc2, all with biases (`enable_bias`),
two LayerNorms per block, before each sub-layer (`do_layer_norm_before`) or after each
residual add (opt-350m), dropout (`dropout`, 0.1) after out_proj and after fc2 and
`attention_dropout` (0.0) on the probabilities, a final LayerNorm only in the pre-LN models,
and a head tied to the token embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.base import act_saved, attention_linears, plain_mlp
from vram.model.spec import LayerStack, MlpKind, ModelSpec, NormKind

#: OPTLearnedPositionalEmbedding: `num_embeddings + self.offset` rows, offset 2.
POSITION_OFFSET = 2


@dataclass(frozen=True, slots=True)
class Opt:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _opt(name, model_type, r)


def _opt(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    if h % n_heads:
        raise ConfigError("num_attention_heads", f"must divide hidden_size ({h})")
    head_dim = h // n_heads
    inter = r.int("ffn_dim")
    bias = r.bool("enable_bias", True)
    pre_norm = r.bool("do_layer_norm_before", True)
    # OPTConfig: elementwise_affine LayerNorms have a weight and a bias; without, none
    norm_params = 2 * h if r.bool("layer_norm_elementwise_affine", True) else 0
    linears = (
        *attention_linears(h, n_heads, n_heads, head_dim,
                           names=("q_proj", "k_proj", "v_proj", "out_proj"),
                           qkv_bias=bias, o_bias=bias),
        *plain_mlp(h, inter, bias, ("fc1", "fc2")),
    )
    stack = LayerStack(
        name="decoder", count=r.int("num_hidden_layers"), linears=linears,
        other_params=2 * norm_params, n_norms=2, norm_kind=NormKind.LAYER, n_heads=n_heads,
        n_kv_heads=n_heads, head_dim=head_dim, mlp_kind=MlpKind.PLAIN, intermediate_size=inter,
        post_norm=not pre_norm,
        attn_dropout=r.float("attention_dropout", 0.0), hidden_dropout=r.float("dropout", 0.1),
        act_saved=act_saved(r, "activation_function", "relu"),
        act_output_is_down_input=r.str("activation_function", "relu") == "relu",
    )
    vocab = r.int("vocab_size")
    word_dim = r.int("word_embed_proj_dim", default=h)
    projections = 2 * word_dim * h if word_dim != h else 0  # project_in, project_out (no bias)
    n_positions = r.int("max_position_embeddings", default=2048)
    final_norm = pre_norm and not r.bool("_remove_final_layer_norm", False)
    return ModelSpec(
        name=name, family=model_type, hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * word_dim,
        embedding_extra_params=(n_positions + POSITION_OFFSET) * h,
        extra_params=(norm_params if final_norm else 0) + projections,
        tied_embeddings=r.bool("tie_word_embeddings", True),
        max_position_embeddings=n_positions,
    )
