"""Optimizer state: one row per optimizer, and the arithmetic of its states and temporaries.

Each `OptimizerSpec` says what an optimizer keeps per trainable parameter (how many states, in
which format), what its step allocates beside them, whether its state is paged and whether it
steps inside backward. `optimizer_state` turns a row and the run's parameter groups into bytes.

Sources: torch.optim.AdamW keeps exp_avg and exp_avg_sq like the parameter (Loshchilov & Hutter
2019); bitsandbytes 8-bit optimizers keep uint8 states with an fp32 absmax per 256-value block and
fall back to 32-bit states for tensors under 4096 values (Dettmers et al. 2022, "8-bit Optimizers
via Block-wise Quantization"); Adafactor keeps row and column statistics of the second moment and
no first moment by default (Shazeer & Stern 2018; transformers' Adafactor beta1=None); Lion keeps
one momentum (Chen et al. 2023); SGD with momentum one buffer, plain SGD none.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from vram.errors import VramError
from vram.params import ParamGroup, allocated_bytes
from vram.setup import Optimizer, TrainingSetup
from vram.units import BF16_BYTES, FP32_BYTES, INT8_BYTES, ceil_div

#: bitsandbytes' blockwise quantization of optimizer state: one fp32 absmax per 256 values
#: (bitsandbytes/functional.py@0.44.1 optimizer_update_8bit_blockwise).
BNB_BLOCK = 256
#: bitsandbytes keeps 32-bit state for tensors under this many values
#: (bitsandbytes/optim/optimizer.py@0.44.1 Optimizer8bit min_8bit_size=4096).
BNB_MIN_8BIT_SIZE = 4096


class StateFormat(Enum):
    """How one optimizer state is stored."""

    #: Like the parameter (`torch.zeros_like(param)`), or fp32 beside an fp32 master copy.
    DENSE = "dense"
    #: bitsandbytes blockwise 8-bit: uint8 values + an fp32 absmax per 256-value block.
    BLOCKWISE_8BIT = "8-bit blockwise"
    #: Adafactor's factored second moment: fp32 row and column statistics of each matrix, a full
    #: fp32 statistic for each vector.
    FACTORED = "factored"


class StepTemporaries(Enum):
    """What the step allocates beside the states."""

    NONE = "none"
    #: foreach kernels make one state-sized list (AdamW's sqrt(exp_avg_sq), Lion's update)
    #: unless the stack runs the fused kernel.
    FOREACH_STATE = "one state-sized list unless fused"
    #: transformers' Adafactor steps one parameter at a time in fp32: the gradient and the
    #: parameter upcast (16-bit models), grad² and the update, for the largest parameter.
    LARGEST_PARAM_FP32 = "fp32 copies of the largest parameter"


@dataclass(frozen=True, slots=True)
class OptimizerSpec:
    """What one optimizer keeps and allocates (see `OPTIMIZERS`)."""

    #: Full-size states per trainable parameter (Adafactor: its one factored statistic).
    states: int
    state_format: StateFormat
    step_temporaries: StepTemporaries
    #: The state lives in CUDA unified memory (bitsandbytes paged optimizers).
    paged: bool
    #: Each parameter steps (and frees its gradient) as soon as its gradient is ready.
    steps_in_backward: bool
    formula: str
    source: str


_ADAMW = "torch/optim/adamw.py@v2.4.0 (exp_avg, exp_avg_sq; foreach sqrt(exp_avg_sq))"
_BNB = "bitsandbytes/optim/optimizer.py@0.44.1 Optimizer8bit (blockwise, min_8bit_size=4096)"
_ADAM_FORMULA = "2 states × dtype bytes × trainable params"
_BNB_FORMULA = ("2 states × (1 byte + 4 bytes per 256-value block); 32-bit states for "
                "tensors under 4096 values")
_ONE_FORMULA = "1 state × dtype bytes × trainable params"

#: Every optimizer `vram` knows, one row each.
OPTIMIZERS: MappingProxyType[Optimizer, OptimizerSpec] = MappingProxyType({
    Optimizer.ADAMW: OptimizerSpec(
        2, StateFormat.DENSE, StepTemporaries.FOREACH_STATE, paged=False,
        steps_in_backward=False, formula=_ADAM_FORMULA, source=_ADAMW),
    Optimizer.PAGED_ADAMW: OptimizerSpec(
        2, StateFormat.DENSE, StepTemporaries.FOREACH_STATE, paged=True,
        steps_in_backward=False, formula=_ADAM_FORMULA,
        source="bitsandbytes/optim/adamw.py@0.44.1 PagedAdamW (optim_bits=32, is_paged)"),
    Optimizer.ADAMW_IN_BACKWARD: OptimizerSpec(
        2, StateFormat.DENSE, StepTemporaries.NONE, paged=False, steps_in_backward=True,
        formula=_ADAM_FORMULA,
        source="torchtune/training/_optimizer_in_bwd.py@v0.3.0 (register_post_accumulate_"
               "grad_hook steps and frees each gradient)"),
    Optimizer.ADAMW_8BIT: OptimizerSpec(
        2, StateFormat.BLOCKWISE_8BIT, StepTemporaries.NONE, paged=False,
        steps_in_backward=False, formula=_BNB_FORMULA, source=_BNB),
    Optimizer.PAGED_ADAMW_8BIT: OptimizerSpec(
        2, StateFormat.BLOCKWISE_8BIT, StepTemporaries.NONE, paged=True,
        steps_in_backward=False, formula=_BNB_FORMULA, source=_BNB + " PagedAdamW8bit"),
    Optimizer.SGD: OptimizerSpec(
        0, StateFormat.DENSE, StepTemporaries.NONE, paged=False, steps_in_backward=False,
        formula="plain SGD keeps no state", source="torch/optim/sgd.py@v2.4.0 momentum=0"),
    Optimizer.SGD_MOMENTUM: OptimizerSpec(
        1, StateFormat.DENSE, StepTemporaries.NONE, paged=False, steps_in_backward=False,
        formula=_ONE_FORMULA, source="torch/optim/sgd.py@v2.4.0 momentum_buffer"),
    Optimizer.LION: OptimizerSpec(
        1, StateFormat.DENSE, StepTemporaries.FOREACH_STATE, paged=False,
        steps_in_backward=False, formula=_ONE_FORMULA,
        source="lucidrains/lion-pytorch lion_pytorch.py@0.2.2 (exp_avg); Chen et al. 2023"),
    Optimizer.ADAFACTOR: OptimizerSpec(
        1, StateFormat.FACTORED, StepTemporaries.LARGEST_PARAM_FP32, paged=False,
        steps_in_backward=False,
        formula=("4 bytes × (rows + columns) per matrix (factored second moment), "
                 "each vector in 512-byte allocator blocks"),
        source="transformers/optimization.py@v4.46.0 Adafactor (beta1=None: no first moment)"),
})


def optimizer_spec(optimizer: Optimizer) -> OptimizerSpec:
    """The row of `optimizer`; one without a row is an error, not a guess."""
    spec = OPTIMIZERS.get(optimizer)
    if spec is None:
        known = ", ".join(sorted(o.value for o in OPTIMIZERS))
        raise VramError(f"optimizer: no profile for {optimizer.value!r}; known: {known}")
    return spec


def steps_in_backward(setup: TrainingSetup) -> bool:
    """Whether the optimizer steps inside backward, freeing each gradient as it is made."""
    return optimizer_spec(setup.optimizer).steps_in_backward


@dataclass(frozen=True, slots=True)
class OptimizerState:
    state_bytes: int
    formula: str
    step_temp_bytes: int
    paged: bool


def fp32_vectors_bytes(*lengths: int) -> int:
    """Allocated bytes of one fp32 vector per length (Adafactor's row/column statistics)."""
    return sum(allocated_bytes(FP32_BYTES * n) for n in lengths)


def factored_bytes(group: ParamGroup) -> int:
    """Adafactor's second moment of a group: an fp32 row and column vector per matrix, each
    its own allocation; vectors keep a full fp32 statistic."""
    rows_cols = sum(m.count * fp32_vectors_bytes(m.rows, m.cols) for m in group.matrices)
    in_matrices = sum(m.numel for m in group.matrices)
    return rows_cols + FP32_BYTES * max(0, group.n_params - in_matrices)


def bnb_8bit_tensor_bytes(numel: int) -> int:
    """bitsandbytes' 8-bit Adam state of one tensor, one state, as the CUDA allocator charges
    it: uint8 values and an fp32 absmax per 256 values; a tensor under 4096 values keeps an
    fp32 state instead (min_8bit_size)."""
    if numel < BNB_MIN_8BIT_SIZE:
        return allocated_bytes(FP32_BYTES * numel)
    return allocated_bytes(INT8_BYTES * numel) + allocated_bytes(
        FP32_BYTES * ceil_div(numel, BNB_BLOCK))


def blockwise_8bit_bytes(group: ParamGroup) -> int:
    """One 8-bit state of a group: tensor by tensor where the group lists its tensors, else
    over its values pooled (large matrices: per-tensor rounding is negligible)."""
    if group.tensors:
        return sum(count * bnb_8bit_tensor_bytes(numel) for numel, count in group.tensors)
    n = group.n_params
    return INT8_BYTES * n + FP32_BYTES * ceil_div(n, BNB_BLOCK)


def _state_bytes(spec: OptimizerSpec, group: ParamGroup, dense_bytes: int) -> int:
    """Every state of one group."""
    if spec.state_format is StateFormat.BLOCKWISE_8BIT:
        return spec.states * blockwise_8bit_bytes(group)
    if spec.state_format is StateFormat.FACTORED:
        return spec.states * factored_bytes(group)
    return spec.states * dense_bytes * group.n_params


def _step_temp_bytes(spec: OptimizerSpec, trainable: list[ParamGroup], state_dtype_bytes: int,
                     *, fused: bool, largest_param: int) -> int:
    """What the step allocates beside the states (freed when it ends)."""
    if not trainable:
        return 0
    if spec.step_temporaries is StepTemporaries.FOREACH_STATE and not fused:
        return sum(state_dtype_bytes * g.n_params for g in trainable)
    if spec.step_temporaries is StepTemporaries.LARGEST_PARAM_FP32:
        copies = 4 if state_dtype_bytes == BF16_BYTES else 2
        return copies * FP32_BYTES * largest_param
    return 0


def optimizer_state(groups: list[ParamGroup], setup: TrainingSetup, *, fused: bool,
                    state_dtype_bytes: int = FP32_BYTES, largest_param: int = 0,
                    ) -> OptimizerState:
    """State bytes for the trainable groups (before any sharding). `state_dtype_bytes`: a dense
    state value (`PrecisionPolicy.states`); `fused`: the stack steps AdamW/Lion with fused
    kernels; `largest_param`: values in the largest trainable tensor."""
    spec = optimizer_spec(setup.optimizer)
    trainable = [g for g in groups if g.trainable]
    total = sum(_state_bytes(spec, g, state_dtype_bytes) for g in trainable)
    temp = _step_temp_bytes(spec, trainable, state_dtype_bytes, fused=fused,
                            largest_param=largest_param)
    return OptimizerState(total, spec.formula if trainable else "", temp, spec.paged)
