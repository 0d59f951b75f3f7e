"""GPT-2, and the post-LayerNorm `nn.MultiheadAttention` blocks of DeepSpeed's examples.

GPT-2 (transformers/models/gpt2/modeling_gpt2.py@v5.24.0): learned token and position
embeddings (wte, wpe), pre-LN blocks of Conv1D c_attn (fused q, k, v with bias) and c_proj,
a plain MLP (c_fc, `gelu_new`, c_proj), dropout on the attention probabilities and after each
c_proj (`attn_pdrop`, `resid_pdrop`, 0.1 by default), a final ln_f and a head tied to wte.
Conv1D is `addmm(bias, x, W)`: it keeps its input like `nn.Linear`.

`"norm": "post-LayerNorm"` configs describe DeepSpeedExamples'
`training/bf16_master_weight/train.py@ac3800b7` SimpleTransformerModel: the same parameter
shapes per block, but `x = norm1(x + attn(x, x, x)); x = norm2(x + ff(x))` with
`nn.MultiheadAttention(h, heads, batch_first=True)` (no mask, no dropout), `nn.GELU`, no final
norm, and an untied `nn.Linear(h, vocab)` head with a bias.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.base import act_pow_fp32, act_saved, fused_qkv, plain_mlp
from vram.model.spec import LayerStack, Linear, MlpKind, ModelSpec, NormKind, Role

#: The config's `norm` value for DeepSpeed's post-LayerNorm SimpleTransformer blocks.
POST_LAYER_NORM = "post-LayerNorm"


@dataclass(frozen=True, slots=True)
class Gpt2:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        norm = r.str("norm", "pre-LayerNorm")
        if norm == POST_LAYER_NORM:
            return _post_norm_multihead(name, model_type, r)
        if norm != "pre-LayerNorm":
            raise ConfigError("norm", f"must be pre-LayerNorm or {POST_LAYER_NORM}, got "
                                      f"{norm!r:.40}")
        return _gpt2(name, model_type, r)


def _shape(r: ConfigReader) -> tuple[int, int, int, int]:
    """Hidden size, heads, MLP width and layers, under GPT2Config's names or their aliases
    (GPT2Config.attribute_map: hidden_size -> n_embd, ...)."""
    h = r.int("n_embd", "hidden_size")
    n_heads = r.int("n_head", "num_attention_heads")
    if h % n_heads:
        raise ConfigError("n_head", f"must divide the hidden size ({h})")
    inter = r.int("n_inner", "intermediate_size", default=4 * h)  # GPT2MLP: 4·h when None
    return h, n_heads, inter, r.int("n_layer", "num_hidden_layers")


def _gpt2(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h, n_heads, inter, n_layers = _shape(r)
    head_dim = h // n_heads
    stack = LayerStack(
        name="decoder", count=n_layers, linears=block_linears(h, n_heads, n_heads, inter),
        other_params=2 * 2 * h, n_norms=2,
        norm_kind=NormKind.LAYER, n_heads=n_heads, n_kv_heads=n_heads, head_dim=head_dim,
        mlp_kind=MlpKind.PLAIN, intermediate_size=inter,
        # eager_attention_forward: softmax in the scores' dtype, then `.type(value.dtype)`
        softmax_upcast=False,
        attn_dropout=r.float("attn_pdrop", 0.1), hidden_dropout=r.float("resid_pdrop", 0.1),
        act_saved=act_saved(r, "activation_function", "gelu_new"),
        act_pow_fp32=act_pow_fp32(r, "activation_function", "gelu_new"),
    )
    return model_with_positions(name, model_type, r, h, stack, gpt2_positions(r))


def block_linears(h: int, n_heads: int, n_kv: int, inter: int) -> tuple[Linear, ...]:
    """A GPT-2 block's nn.Linear layers, with biases: c_attn (q, k, v fused), c_proj, and the
    MLP's c_fc and c_proj (GPT-BigCode's too, with `n_kv` shared heads)."""
    return (
        fused_qkv(h, n_heads, n_kv, h // n_heads, "attn.c_attn", True),
        Linear(name="attn.c_proj", role=Role.O, d_in=h, d_out=h, bias=True),
        *plain_mlp(h, inter, True, ("mlp.c_fc", "mlp.c_proj")),
    )


def gpt2_positions(r: ConfigReader) -> int:
    """The learned positions (wpe's rows): GPT2Config's n_positions, 1,024 by default."""
    return r.int("n_positions", "max_position_embeddings", default=1024)


def model_with_positions(name: str, model_type: str, r: ConfigReader, h: int,
                         stack: LayerStack, n_positions: int, **extra: int) -> ModelSpec:
    """A GPT-2-shaped model around `stack`: learned token and position embeddings (wte, wpe),
    a final ln_f, the head tied to wte unless the config unties it."""
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family=model_type, hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, embedding_extra_params=n_positions * h,
        extra_params=2 * h,  # ln_f
        tied_embeddings=r.bool("tie_word_embeddings", True),
        max_position_embeddings=n_positions, **extra,
    )


def _post_norm_multihead(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h, n_heads, inter, n_layers = _shape(r)
    head_dim = h // n_heads
    linears = (
        fused_qkv(h, n_heads, n_heads, head_dim, "attention.in_proj", True),
        Linear(name="attention.out_proj", role=Role.O, d_in=h, d_out=h, bias=True),
        *plain_mlp(h, inter, True, ("ff.0", "ff.2")),
    )
    stack = LayerStack(
        name="decoder", count=n_layers, linears=linears, other_params=2 * 2 * h, n_norms=2,
        norm_kind=NormKind.LAYER, n_heads=n_heads, n_kv_heads=n_heads, head_dim=head_dim,
        mlp_kind=MlpKind.PLAIN, intermediate_size=inter,
        causal=False,  # called as attention(x, x, x): no mask at all
        softmax_upcast=False, torch_multihead_attention=True, post_norm=True,
        act_saved=act_saved(r, "hidden_act", "gelu"),
        act_pow_fp32=act_pow_fp32(r, "hidden_act", "gelu"),
    )
    vocab = r.int("vocab_size")
    n_positions = r.int("max_position_embeddings", "n_positions", default=512)
    return ModelSpec(
        name=name, family=model_type, hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, embedding_extra_params=n_positions * h, extra_params=0,
        tied_embeddings=r.bool("tie_word_embeddings", False),
        head_bias=r.bool("lm_head_bias", True), max_position_embeddings=n_positions,
    )
