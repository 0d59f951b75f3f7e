"""DeepSeek-V2 / V2-Lite / V3: multi-head latent attention (MLA), shared plus routed experts.

DeepSeek-V3 (transformers/models/deepseek_v3/modeling_deepseek_v3.py@v5.24.0) has the same
parameters per layer; its router's `e_score_correction_bias` is a buffer, and the multi-token
prediction layer (`num_nextn_predict_layers`) is not built by Transformers.

transformers/models/deepseek_v2/modeling_deepseek_v2.py@v5.24.0:
- DeepseekV2Attention: q_proj (h -> heads·(d_nope + d_rope)), or q_a_proj -> q_a_layernorm ->
  q_b_proj with `q_lora_rank`; kv_a_proj_with_mqa (h -> kv_lora_rank + d_rope),
  kv_a_layernorm on the latent, kv_b_proj (latent -> heads·(d_nope + d_v)), o_proj
  (heads·d_v -> h). SDPA sees q and k of heads·(d_nope + d_rope) and v of heads·d_v.
- DeepseekV2DecoderLayer: `DeepseekV2Moe if layer_idx >= first_k_dense_replace else
  DeepseekV2MLP`: the first layers are dense (width intermediate_size), the rest route each
  token to `num_experts_per_tok` of `n_routed_experts` (DeepseekV2Experts' 3-D banks, width
  moe_intermediate_size, router weight E × h) and run `n_shared_experts` shared ones as one
  MLP of width moe_intermediate_size × n_shared_experts.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.base import gated_mlp
from vram.model.spec import LayerStack, Linear, MlpKind, ModelSpec, NormKind, Role


@dataclass(frozen=True, slots=True)
class DeepseekV2:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _deepseek_v2(name, model_type, r)


def _mla_linears(h: int, r: ConfigReader) -> tuple[list[Linear], int]:
    """The attention Linears and the norm parameters they bring (the latent norms)."""
    heads = r.int("num_attention_heads")
    d_nope, d_rope = r.int("qk_nope_head_dim"), r.int("qk_rope_head_dim")
    d_v = r.int("v_head_dim")
    rank = r.int("kv_lora_rank")
    bias = r.bool("attention_bias", False)
    qk = heads * (d_nope + d_rope)
    linears: list[Linear] = []
    norms = rank
    if r.has("q_lora_rank"):
        q_rank = r.int("q_lora_rank")
        linears += [Linear(name="q_a_proj", role=Role.Q, d_in=h, d_out=q_rank, bias=bias),
                    Linear(name="q_b_proj", role=Role.Q, d_in=q_rank, d_out=qk)]
        norms += q_rank
    else:
        linears.append(Linear(name="q_proj", role=Role.Q, d_in=h, d_out=qk))
    linears += [
        Linear(name="kv_a_proj_with_mqa", role=Role.K, d_in=h, d_out=rank + d_rope, bias=bias),
        Linear(name="kv_b_proj", role=Role.KV_UP, d_in=rank, d_out=heads * (d_nope + d_v)),
        Linear(name="o_proj", role=Role.O, d_in=heads * d_v, d_out=h, bias=bias),
    ]
    return linears, norms


def _deepseek_v2(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h = r.int("hidden_size")
    n_layers = r.int("num_hidden_layers")
    heads = r.int("num_attention_heads")
    attention, latent_norms = _mla_linears(h, r)
    head_dim = r.int("qk_nope_head_dim") + r.int("qk_rope_head_dim")
    shape = {"n_norms": 2, "norm_kind": NormKind.RMS, "n_heads": heads, "n_kv_heads": heads,
             "head_dim": head_dim, "v_head_dim": r.int("v_head_dim"),
             "kv_lora_rank": r.int("kv_lora_rank"), "mlp_kind": MlpKind.GATED,
             "q_lora_rank": r.int("q_lora_rank") if r.has("q_lora_rank") else 0}
    other = 2 * h + latent_norms
    # DeepseekV2Config's default is 0 (every layer routed); the reader's ints start at 1
    n_dense = 0 if not r.config.get("first_k_dense_replace") else min(
        r.int("first_k_dense_replace"), n_layers)
    stacks: list[LayerStack] = []
    if n_dense:
        inter = r.int("intermediate_size")
        stacks.append(LayerStack(name="dense", count=n_dense, other_params=other,
                            linears=(*attention, *gated_mlp(h, inter)),
                            intermediate_size=inter, **shape))
    if n_layers > n_dense:
        n_experts = r.int("n_routed_experts")
        top_k = r.int("num_experts_per_tok")
        if top_k > n_experts:
            raise ConfigError("num_experts_per_tok", f"must be at most {n_experts}")
        width = r.int("moe_intermediate_size")
        shared = width * r.int("n_shared_experts", default=1)
        fraction = top_k / n_experts
        experts = (
            Linear(name="mlp.gate", role=Role.ROUTER, d_in=h, d_out=n_experts),
            Linear(name="mlp.experts.gate_up_proj", role=Role.GATE_UP, d_in=h, d_out=2 * width,
                   parts=(width, width), copies=n_experts, token_fraction=fraction),
            Linear(name="mlp.experts.down_proj", role=Role.DOWN, d_in=width, d_out=h,
                   copies=n_experts, token_fraction=fraction),
            *gated_mlp(h, shared, names=("mlp.shared_experts.gate_proj",
                                         "mlp.shared_experts.up_proj",
                                         "mlp.shared_experts.down_proj")),
        )
        stacks.append(LayerStack(name="moe", count=n_layers - n_dense, other_params=other,
                            linears=(*attention, *experts), intermediate_size=width,
                            n_experts=n_experts, experts_per_token=top_k,
                            shared_expert_width=shared, **shape))
    vocab = r.int("vocab_size")
    return ModelSpec(
        name=name, family=model_type, hidden_size=h, vocab_size=vocab, stacks=tuple(stacks),
        embedding_params=vocab * h, extra_params=h,  # the final norm
        tied_embeddings=r.bool("tie_word_embeddings", False),
        max_position_embeddings=r.int("max_position_embeddings", default=4096),
    )
