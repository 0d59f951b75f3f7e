"""Mixture-of-experts layers on fake tensors, as a CUDA GPU runs them.

Transformers 5.24 runs every MoE type's experts through `grouped_mm` by default, whatever the
dtype (transformers/modeling_utils.py@v5.24.0 `get_correct_experts_implementation`;
transformers/integrations/moe.py@v5.24.0 `grouped_mm_experts_forward`): the `tokens * top_k`
assignments are sorted by expert and each bank is one grouped matmul, so every shape is static
and the trace is exact whatever the routing.

With `experts_implementation="eager"` transformers loops over the experts, and which tokens
an expert receives depends on the router's values, which fake tensors do not have (`nonzero` /
`torch.where` have data-dependent shapes). The trace then runs the eager loop with the
assignment spread evenly: of the `tokens * top_k` assignments, expert `e` receives
`tokens * top_k // E` (+1 for the first `tokens * top_k % E` experts). Every tensor the eager
loop allocates (the one-hot expert mask, the gathered tokens, the gate/up and down
projections, the weighted output accumulated with `index_add_`) is allocated with those
shapes. A real batch routes unevenly, so the activations of a real step scatter around this.

On CUDA, `torch._grouped_mm` takes bf16, fp16 and fp32 operands: bf16 on sm90/sm100 runs the
CUTLASS kernel, anything else a loop of `mm_out` into the same output tensor
(aten/src/ATen/native/cuda/GroupedBlas.cpp@pytorch 00d4eaf9 `_grouped_mm_cuda`;
aten/src/ATen/native/GroupedMMUtils.h `_grouped_mm_validate_inputs`, `_grouped_mm_fallback`).
The op's meta kernel in torch 2.13 checks for bf16 only (torch/_meta_registrations.py
`_meta_grouped_mm_common`), so on fake tensors an fp32 bank (fp32 and autocast recipes, a QLoRA
model's upcast banks) cannot run it. For those, `cuda_grouped_mm` runs `CudaGroupedMm`, an
autograd Function with the CUDA op's memory: it allocates the `[rows, out]` output in the
operands' dtype, saves its input when the bank needs a gradient and the bank when the input
does (autograd saves an operand only for the other's gradient), and its backward allocates the
input's gradient and the bank's in the bank's own strides. bf16 banks run the real op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn


class CudaGroupedMm(torch.autograd.Function):
    """`torch._grouped_mm(input [rows, in], weight [E, in, out], offs)` as CUDA allocates it."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                offs: torch.Tensor) -> torch.Tensor:
        needs_input, needs_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)
        ctx.input_shape = input.shape
        ctx.weight_layout = (weight.shape, weight.stride())
        return input.new_empty((input.shape[0], weight.shape[-1]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        input, weight = ctx.saved_tensors
        grad_input = grad.new_empty(ctx.input_shape) if ctx.needs_input_grad[0] else None
        # in the bank's own layout (aten's `_grouped_mm_mat_b_backward` takes mat_b's strides),
        # so the parameter's `.grad` takes it as it is, through the transpose view
        grad_weight = (grad.new_empty_strided(*ctx.weight_layout) if ctx.needs_input_grad[1]
                       else None)
        del input, weight
        return grad_input, grad_weight, None


@contextlib.contextmanager
def cuda_grouped_mm() -> Iterator[None]:
    """Inside: transformers' grouped experts run `CudaGroupedMm` for banks that are not bf16."""
    from transformers.integrations import moe

    original: Callable[..., torch.Tensor] = moe._grouped_mm

    def grouped_mm(input: torch.Tensor, weight: torch.Tensor,
                   offs: torch.Tensor) -> torch.Tensor:
        if weight.dtype == torch.bfloat16:
            return original(input, weight, offs)
        result: torch.Tensor = CudaGroupedMm.apply(input.to(weight.dtype), weight, offs)
        return result

    moe._grouped_mm = grouped_mm
    try:
        yield
    finally:
        moe._grouped_mm = original


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
