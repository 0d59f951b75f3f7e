"""What torchao's float8 training adds inside a layer's backward (the `fp8` knob, issue 23).

torchao's eager float8 linear (`matmul_with_hp_or_float8_args`, torchao/float8/
float8_linear.py@v0.18.0 #L29-L204) saves the high-precision input and weight, so what a
layer keeps for backward is the bf16 run's; the casts happen around each matmul. In the
backward each linear casts its output gradient twice (dim0 for the input's gradient, dim1 for
the weight's), its weight once and its saved input once, each a local of the backward function,
alive until it returns. One cast of `n` values (`hp_tensor_and_scale_to_float8`,
torchao/float8/float8_training_tensor.py@v0.18.0 #L123-L153 `_ToFloat8ConstrFunc`;
`to_fp8_saturated`, float8_utils.py@v0.18.0 #L118-L139) makes `tensor.to(float32) * scale`
(4 bytes a value, beside the upcast until the product exists), clamps it (4 more) and writes the
float8 result (1): 9 bytes a value at its height, 1 byte kept (plus an fp32 scale per tensor or
per row: negligible). Tensorwise and rowwise cast the same tensors (the trace: within 0.1 %).

Two moments of a gated MLP's backward can then top the bf16 layer's backward peak:

* an up or gate projection casting its `[tokens, I]` output gradient along dim1 while the dim0
  cast is kept: 1 + 9 bytes a token and MLP unit, of which 2 stand in for the product's
  gradient the bf16 peak holds and which is freed by then (read off the grid's traces); with
  its weight's cast kept (1 byte a weight): `8 t I + W`;
* a projection casting its weight (`I x h` values: 9 bytes each) once the MLP's saved tensors
  and the backward's transients are released: `9 W - 7.5 t I` (the release read off the
  traces, not derived: the bf16 transient's 4 bytes a token and unit and 3.5 of the MLP's
  saved ones).

The larger of the two (at short sequences the weight cast, past a few thousand tokens the
gradient casts) is added to each layer-backward moment. Held to the parallel trace grid's
float8 rows (benchmarks/trace_grid_parallel.txt, Llama 3.1 8B and Mistral 7B, 1,024-16,384
tokens a rank: activations within 5 %) and to one traced MLP of Llama 3.1 8B's shape at 1,024
tokens (the weight cast: 417.4 MB above the bf16 peak, the formula 418.4 MB). Not modelled:
torchao's blockwise recipe (Triton kernels only, not traced), Transformer Engine (saves the
quantized input: `te`), `torch.compile` (its kernels and partitioner decide; no term), the
forward's casts (smaller than the backward's), float8 MoE experts.
"""

from __future__ import annotations

from vram.model.spec import ModelSpec
from vram.setup import Fp8Recipe, TrainingSetup

SOURCE = ("torchao/float8/float8_linear.py@v0.18.0 matmul_with_hp_or_float8_args.backward; "
          "torchao/float8/float8_training_tensor.py@v0.18.0 _ToFloat8ConstrFunc")
#: The recipes whose backward casts this models: torchao's float8 linear, eager.
TORCHAO_EAGER = frozenset({Fp8Recipe.TENSORWISE, Fp8Recipe.ROWWISE})


def layer_backward_cast_bytes(model: ModelSpec, setup: TrainingSetup, tokens: int, *,
                              compiled: bool = False) -> int:
    """Float8 casts alive in a layer's backward above its bf16 peak: the larger of the output
    gradients' casts `8 t I + W` and the weight's `9 W - 7.5 t I` (module docstring). Not
    when compiled: Inductor generates the casts and its partitioner chooses what to save, so
    the eager intermediates above are not what runs (the trace runs eager)."""
    if setup.fp8 not in TORCHAO_EAGER or compiled or len(model.stacks) != 1:
        return 0
    stack = model.stacks[0]
    if stack.n_experts or not stack.linears:
        return 0
    w = max(linear.weight_params for linear in stack.linears)
    t_i = tokens * stack.intermediate_size
    gradient_casts = 8 * t_i + w
    weight_cast = 9 * w - 15 * t_i // 2
    return max(gradient_casts, weight_cast)
