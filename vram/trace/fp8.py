"""torchao float8 training in the trace (optional: needs torchao, not part of the trace extra).

`convert` swaps the blocks' `nn.Linear`s for torchao's `Float8Linear`
(torchao/float8/float8_linear.py@v0.18.0) with a named recipe
(`Float8LinearConfig.from_recipe_name`, torchao/float8/config.py@v0.18.0): "tensorwise" (one
fp32 scale per tensor) or "rowwise" (one scale per row, `AXISWISE`). The head stays in high
precision (torchtitan's converter filters `output`:
torchtitan/components/quantization/float8.py@v0.2.2 `filter_fqns`; and Transformers' head
is outside the blocks).

What it stores, as the trace sees in eager mode (`matmul_with_hp_or_float8_args`): the
autograd function saves the *high-precision* input and weight (`ctx.save_for_backward(input_hp,
weight_hp_t)`), so the saved activations are those of a bf16 run; the float8 copies of the
input and the weight (1 byte per value, with their scales) live only while the matmul runs,
and the backward casts again (the gradient twice, in two layouts for rowwise). The weights,
gradients and optimizer state are unchanged. Under `torch.compile` the partitioner may save
the float8 casts instead (torchtitan's recommended setting); the eager trace does not model
that. torchao's CUDA-only kernels are not needed: `torch._scaled_mm` has a meta kernel.

Blockwise (torchao/prototype/blockwise_fp8_training/linear.py@v0.18.0: 1x128 activation and
128x128 weight blocks, Triton kernels only) and Transformer Engine are not traced: the closed
form cites what they store.
"""

from __future__ import annotations

import importlib
from typing import Any

from vram.trace.build import Built, TraceUnsupported

RECIPES = ("tensorwise", "rowwise")


def convert(built: Built, recipe: str, *, fsdp_all_gather: bool = False) -> None:
    """Swap the repeated blocks' linear layers for torchao `Float8Linear` in place. With
    `fsdp_all_gather` (tensorwise only, as torchtitan allows: float8.py@v0.2.2) the weights
    become `WeightWithDynamicFloat8CastTensor`s and FSDP2 all-gathers them in float8."""
    if recipe not in RECIPES:
        raise TraceUnsupported(f"fp8: the trace runs torchao's {', '.join(RECIPES)}; "
                               f"{recipe} is estimated, not traced")
    try:  # optional, outside the trace extra: imported by name (no stubs to check against)
        float8 = importlib.import_module("torchao.float8")
    except ImportError as exc:
        raise TraceUnsupported("fp8: torchao is not installed (pip install torchao)") from exc
    if fsdp_all_gather:
        if recipe != "tensorwise":
            raise TraceUnsupported("fp8: the float8 all-gather is tensorwise only")
        config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    else:
        config = float8.Float8LinearConfig.from_recipe_name(recipe)

    def divisible(module: Any, _fqn: str) -> bool:
        # torch._scaled_mm needs both dims of the weight divisible by 16
        weight = module.weight
        return bool(weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0)

    for _, blocks in built.layer_lists:
        float8.convert_to_float8_training(blocks, config=config, module_filter_fn=divisible)
