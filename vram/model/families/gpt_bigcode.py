"""GPT-BigCode: StarCoder, StarCoderBase and SantaCoder (multi-query GPT-2 blocks).

transformers/models/gpt_bigcode/modeling_gpt_bigcode.py@v5.24.0: learned token and position
embeddings (wte, wpe), pre-LN blocks (ln_1, ln_2) of `nn.Linear` c_attn (fused q and one
shared k/v head when `multi_query`, else q, k, v for every head; with bias) and c_proj, an
MLP c_fc -> `gelu_pytorch_tanh` -> c_proj with biases, dropout on the probabilities and after
each c_proj (`attn_pdrop`, `resid_pdrop`, 0.1 by default), a final ln_f and a head tied to
wte. The eager attention repeats k/v to every head (`repeat_kv`) and takes the softmax in
fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.base import act_saved
from vram.model.families.gpt2 import block_linears, gpt2_positions, model_with_positions
from vram.model.spec import LayerStack, MlpKind, ModelSpec, NormKind


@dataclass(frozen=True, slots=True)
class GptBigCode:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        return _gpt_bigcode(name, model_type, r)


def _gpt_bigcode(name: str, model_type: str, r: ConfigReader) -> ModelSpec:
    h = r.int("n_embd", "hidden_size")  # GPTBigCodeConfig.attribute_map
    n_heads = r.int("n_head", "num_attention_heads")
    if h % n_heads:
        raise ConfigError("n_head", f"must divide the hidden size ({h})")
    head_dim = h // n_heads
    n_kv = 1 if r.bool("multi_query", True) else n_heads
    inter = r.int("n_inner", default=4 * h)  # GPTBigCodeBlock: 4·h when n_inner is None
    stack = LayerStack(
        name="decoder", count=r.int("n_layer", "num_hidden_layers"),
        linears=block_linears(h, n_heads, n_kv, inter),
        other_params=2 * 2 * h, n_norms=2, norm_kind=NormKind.LAYER, n_heads=n_heads,
        n_kv_heads=n_kv, head_dim=head_dim, mlp_kind=MlpKind.PLAIN, intermediate_size=inter,
        attn_dropout=r.float("attn_pdrop", 0.1), hidden_dropout=r.float("resid_pdrop", 0.1),
        act_saved=act_saved(r, "activation_function", "gelu_pytorch_tanh"),
    )
    n_positions = gpt2_positions(r)
    # GPTBigCodeModel.bias: torch.tril(torch.ones((max_positions, max_positions),
    # dtype=torch.bool)), a non-persistent buffer moved to the GPU with the model
    return model_with_positions(name, model_type, r, h, stack, n_positions,
                                buffer_bytes=n_positions * n_positions)
