"""Mixture-of-experts layers on fake tensors.

With bf16 weights (`bf16-true`) the trace runs transformers' default experts implementation,
`grouped_mm`: it sorts the `tokens * top_k` assignments by expert, so every shape is static and
the trace is exact whatever the routing. `grouped_mm` needs bf16 operands, so the fp32 and
autocast recipes run the eager per-expert loop instead, with routing assumed uniform:

Which tokens an expert receives depends on the router's values, which fake tensors do not have
(`nonzero` / `torch.where` have data-dependent shapes). The trace therefore runs transformers'
eager expert loop with the assignment spread evenly: of the `tokens * top_k` assignments, expert
`e` receives `tokens * top_k // E` (+1 for the first `tokens * top_k % E` experts). Every
tensor the eager loop allocates (the one-hot expert mask, the gathered tokens, the gate/up and
down projections, the weighted output accumulated with `index_add_`) is allocated with those
shapes. A real batch routes unevenly, so the activations of a real step scatter around this.

The experts are 3D parameters, not `nn.Linear`: QLoRA leaves them unquantized and LoRA cannot
target them (PEFT's `target_modules` sees only the attention projections).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

IMPLEMENTATION = "vram_uniform"


def uniform_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' eager `MixtralExperts.forward` with an even token-to-expert assignment."""
    final = torch.zeros_like(hidden_states)
    tokens, top_k = top_k_index.shape
    n_experts = self.num_experts
    with torch.no_grad():
        expert_mask = torch.zeros((tokens, top_k, n_experts + 1), dtype=torch.long)
        expert_mask = expert_mask.permute(2, 1, 0)
    total = tokens * top_k
    for expert in range(n_experts):
        count = total // n_experts + (1 if expert < total % n_experts else 0)
        if count == 0:
            continue
        top_k_pos = torch.zeros(count, dtype=torch.long)
        token_idx = torch.zeros(count, dtype=torch.long)
        current = hidden_states[token_idx]
        gate_up = nn.functional.linear(current, self.gate_up_proj[expert])
        gate, up = gate_up.chunk(2, dim=-1)
        out = self.act_fn(gate) * up
        out = nn.functional.linear(out, self.down_proj[expert])
        out = out * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, out.to(final.dtype))
    del expert_mask
    return final


def patch_moe() -> None:
    """Register the uniform-routing experts forward with transformers."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if IMPLEMENTATION not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, uniform_experts_forward)


def use_uniform_experts(model: nn.Module) -> None:
    """Point every experts module of `model` at the uniform-routing forward."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_experts_implementation"):
            config._experts_implementation = IMPLEMENTATION
