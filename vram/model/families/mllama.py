"""Llama 3.2 Vision's language model (`mllama_text_model`): Llama layers with a gated
cross-attention layer at each index of `cross_attention_layers`.

transformers/models/mllama/modeling_mllama.py@v5.24.0: `MllamaCrossAttentionDecoderLayer` has
`cross_attn` (q, k, v, o without biases, per-head `q_norm`/`k_norm`), the scalar gates
`cross_attn_attn_gate` and `cross_attn_mlp_gate`, an MLP and two norms; its keys and values
come from the vision tower's states, not from the text. The token embedding has 8 rows more than
the vocabulary (`vocab_size + 8`: the image tokens), the head `vocab_size`.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.model.config_reader import ConfigReader
from vram.model.families.parts import Shape, attention, by_kind, mlp, stack
from vram.model.spec import LayerStack, ModelSpec

#: Rows of MllamaTextModel.embed_tokens beyond `vocab_size` (`config.vocab_size + 8`).
IMAGE_TOKEN_ROWS = 8


@dataclass(frozen=True, slots=True)
class MllamaText:
    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
        att, heads = attention(r, h)
        inter = r.int("intermediate_size")
        ffn = mlp(h, inter)
        cross = set(r.config.get("cross_attention_layers") or [])

        def build(kind: str, count: int) -> LayerStack:
            extra = 2 * heads.head_dim + 2 if kind == "cross" else 0  # q/k norms, two gates
            return stack(kind, count, att + ffn, Shape(heads=heads, intermediate_size=inter),
                         2 * h + extra)
        kinds = ["cross" if i in cross else "self" for i in range(n_layers)]
        vocab = r.int("vocab_size")
        return ModelSpec(
            name=name, family=model_type, hidden_size=h, vocab_size=vocab,
            stacks=by_kind(kinds, build), embedding_params=(vocab + IMAGE_TOKEN_ROWS) * h,
            extra_params=h, tied_embeddings=r.bool("tie_word_embeddings", False),
            max_position_embeddings=r.int("max_position_embeddings", default=131072),
        )
