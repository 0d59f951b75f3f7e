"""The closed form of a post-LayerNorm `nn.MultiheadAttention` block, held to PyTorch itself.

DeepSpeed's SimpleTransformerBlock (DeepSpeedExamples training/bf16_master_weight/train.py
@ac3800b7) is not a Transformers model, so the trace cannot build it. Its saved tensors are
counted here directly: every tensor autograd saves in one block's forward (saved-tensor hooks),
deduplicated by storage, parameters aside.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from vram import TrainingSetup, model_from_config  # noqa: E402
from vram.memory.activations import layer_activations  # noqa: E402
from vram.stacks.profile import profile_for  # noqa: E402


class SimpleTransformerBlock(nn.Module):
    """The block of DeepSpeedExamples' train.py, as written there."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.ff = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn_out, _ = self.attention(x, x, x)
        x = self.norm1(x + attn_out)
        return self.norm2(x + self.ff(x))


def _saved_bytes(block: nn.Module, x: torch.Tensor) -> int:
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return sum(saved.values())


def test_post_norm_multihead_block_saves_what_the_closed_form_counts() -> None:
    hidden, heads, batch, seq = 64, 4, 2, 32
    block = SimpleTransformerBlock(hidden, heads).to(torch.bfloat16).train()
    x = torch.randn(batch, seq, hidden, dtype=torch.bfloat16, requires_grad=True)
    measured_per_token = _saved_bytes(block, x) / (batch * seq)

    spec = model_from_config({
        "model_type": "gpt2", "norm": "post-LayerNorm", "vocab_size": 100,
        "hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": 1,
        "max_position_embeddings": seq, "hidden_act": "gelu", "tie_word_embeddings": False})
    setup = TrainingSetup(method="full", precision="bf16-true", micro_batch=batch,
                          seq_len=seq, attention="eager", framework="other")
    ours = layer_activations(spec, spec.decoder, setup, profile_for(setup)).bytes_per_token
    # LayerNorm's mean and rstd: fp32 on CUDA (what the estimate counts, 2 x 4 bytes per
    # norm), the input's dtype on CPU (2 x 2 bytes), where this runs.
    cpu_stats, cuda_stats = 2 * 2 * 2, 2 * 2 * 4
    assert measured_per_token == ours - cuda_stats + cpu_stats
