"""Qwen (v1, `model_type: qwen`, remote code `modeling_qwen.py` of Qwen/Qwen-7B).

QWenBlock: RMSNorm ln_1 and ln_2; QWenAttention's `c_attn = nn.Linear(h, 3 · kv_channels ·
heads)` with a bias, `c_proj` without (`no_bias`); QWenMLP's `w1`, `w2` (h -> intermediate_size
// 2 each, no bias) and `c_proj` back to h, computing `c_proj(w1(x) * silu(w2(x)))`; a final
ln_f and an untied lm_head (Qwen/Qwen-7B modeling_qwen.py, QWenMLP and QWenAttention; the
Qwen-7B-Chat mirror undefdev/Qwen-7B-Chat@04df5dd has the same layout with `ffn_hidden_size`).

The published config's `intermediate_size` (22016 for Qwen-7B) is twice the width of each
projection. A config that carries `qwen_published_intermediate_size` (the validation set's)
states the per-projection width in `intermediate_size` instead; both must then agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.base import fused_qkv, gated_mlp
from vram.model.spec import LayerStack, Linear, MlpKind, ModelSpec, NormKind, Role


@dataclass(frozen=True, slots=True)
class QwenV1:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _qwen(name, model_type, r)


def _projection_width(r: ConfigReader) -> int:
    """Width of w1 and w2: `config.intermediate_size // 2` in QWenMLP."""
    if r.has("qwen_published_intermediate_size"):
        width = r.int("qwen_published_intermediate_size") // 2
        stated = r.int("intermediate_size", default=width)
        if stated != width:
            raise ConfigError("intermediate_size", f"must be qwen_published_intermediate_size"
                                                   f" / 2 = {width:,}, got {stated:,}")
        return width
    published = r.int("intermediate_size", "ffn_hidden_size")
    if published % 2:
        raise ConfigError("intermediate_size", f"must be even (w1 and w2 each take half), "
                                               f"got {published:,}")
    return published // 2


def _qwen(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h = r.int("hidden_size")
    n_heads = r.int("num_attention_heads")
    head_dim = r.int("kv_channels", default=h // n_heads)
    n_kv = r.int("num_key_value_heads", default=n_heads)
    if n_kv != n_heads:
        raise ConfigError("num_key_value_heads", f"Qwen v1 has no grouped attention: must "
                                                 f"equal num_attention_heads ({n_heads})")
    bias = not r.bool("no_bias", True)
    inter = _projection_width(r)
    linears = (
        fused_qkv(h, n_heads, n_heads, head_dim, "attn.c_attn", True),
        Linear(name="attn.c_proj", role=Role.O, d_in=n_heads * head_dim, d_out=h, bias=bias),
        # intermediate = w1(x) * silu(w2(x)): w2 is the gate, w1 the up projection
        *gated_mlp(h, inter, bias, names=("mlp.w2", "mlp.w1", "mlp.c_proj")),
    )
    stack = LayerStack(
        name="decoder", count=r.int("num_hidden_layers"), linears=linears, other_params=2 * h,
        n_norms=2, norm_kind=NormKind.RMS, n_heads=n_heads, n_kv_heads=n_heads,
        head_dim=head_dim, mlp_kind=MlpKind.GATED, intermediate_size=inter,
        # QWenAttention._attn: softmax in the scores' dtype, then `.type(value.dtype)`
        softmax_upcast=False,
    )
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family=model_type, hidden_size=h, vocab_size=vocab, stacks=(stack,),
        embedding_params=vocab * h, extra_params=h,  # ln_f
        tied_embeddings=r.bool("tie_word_embeddings", False),
        max_position_embeddings=r.int("max_position_embeddings", "seq_length", default=8192),
    )
