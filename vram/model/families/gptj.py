"""GPT-J (EleutherAI/gpt-j-6b): Phi's block shape without attention biases.

transformers/models/gptj/modeling_gptj.py@v5.24.0: token embeddings (no learned positions;
rotary on the first `rotary_dim` dimensions of each q/k head), one LayerNorm `ln_1` per
block feeding attention and the MLP in parallel (`attn_output + mlp(x) + residual`),
q_proj, k_proj, v_proj and out_proj without biases, fc_in -> `gelu_new` -> fc_out with
biases, dropout `resid_pdrop` / `attn_pdrop` (0.0 in gpt-j-6b), a final ln_f and an untied
lm_head with a bias. The eager attention casts q and k to fp32 before q·kᵀ.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.base import act_pow_fp32, act_saved, attention_linears, plain_mlp
from vram.model.spec import LayerStack, MlpKind, ModelSpec, NormKind


@dataclass(frozen=True, slots=True)
class GptJ:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _gptj(name, model_type, r)


def _gptj(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h = r.int("n_embd", "hidden_size")  # GPTJConfig.attribute_map: hidden_size -> n_embd
    n_heads = r.int("n_head", "num_attention_heads")
    if h % n_heads:
        raise ConfigError("n_head", f"must divide the hidden size ({h})")
    head_dim = h // n_heads
    inter = r.int("n_inner", default=4 * h)  # GPTJBlock: 4·n_embd when n_inner is None
    linears = (
        *attention_linears(h, n_heads, n_heads, head_dim,
                           names=("q_proj", "k_proj", "v_proj", "out_proj"),
                           qkv_bias=False, o_bias=False),
        *plain_mlp(h, inter, True, ("fc_in", "fc_out")),
    )
    stack = LayerStack(
        name="decoder", count=r.int("n_layer", "num_hidden_layers"), linears=linears,
        other_params=2 * h, n_norms=1, norm_kind=NormKind.LAYER, n_heads=n_heads,
        n_kv_heads=n_heads, head_dim=head_dim, mlp_kind=MlpKind.PLAIN, intermediate_size=inter,
        parallel_residual=True,
        attn_dropout=r.float("attn_pdrop", 0.0), hidden_dropout=r.float("resid_pdrop", 0.0),
        act_saved=act_saved(r, "activation_function", "gelu_new"),
        act_pow_fp32=act_pow_fp32(r, "activation_function", "gelu_new"),
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family=model_type, hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, extra_params=2 * h,  # ln_f
        tied_embeddings=r.bool("tie_word_embeddings", False), head_bias=True,
        max_position_embeddings=r.int("n_positions", "max_position_embeddings", default=2048),
    )
