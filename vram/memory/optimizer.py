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
from vram.model.params import ParamGroup, allocated_bytes, trainable_params
from vram.model.spec import ModelSpec
from vram.result import LineItem
from vram.setup import Offload, Optimizer, TrainingSetup
from vram.sharding.shards import Shards
from vram.stacks.profile import StackProfile
from vram.units import BF16_BYTES, FP32_BYTES, INT8_BYTES, ceil_div

#: bitsandbytes' blockwise quantization of optimizer state: one fp32 absmax per 256 values
#: (bitsandbytes/functional.py@0.44.1 optimizer_update_8bit_blockwise).
BNB_BLOCK = 256
#: bitsandbytes keeps 32-bit state for tensors under this many values
#: (bitsandbytes/optim/optimizer.py@0.44.1 Optimizer8bit min_8bit_size=4096).
BNB_MIN_8BIT_SIZE = 4096
#: bitsandbytes pages a state only for tensors of at least 1e5 values (optimizer.py@0.44.1
#: get_state_buffer: `if not self.is_paged or A.numel() < 1e5: torch.zeros_like(A)`).
BNB_MIN_PAGED_SIZE = 100_000
#: torchao's 4-bit states: two 4-bit codes per byte and an fp32 scale per 128 values, plus a
#: 16-entry fp32 lookup table per state; tensors under 4096 values, or not a multiple of the
#: block, keep a plain state like the parameter (torchao/optim/subclass_4bit.py@029bb60
#: OptimState4bit.zeros; torchao/optim/adam.py@0372e5f _AdamBase._new_buffer, AdamW4bit
#: block_size=128).
TORCHAO_4BIT_BLOCK = 128
TORCHAO_MIN_QUANT_SIZE = 4096
TORCHAO_QMAP_VALUES = 16
#: GaLore's recipes project with rank = hidden / 4 (Zhao et al. 2024, Table 2: 60M 128/512,
#: 350M 256/1024, 1B 512/2048, 7B 1024/4096; jiaweizzhao/GaLore scripts/single_gpu/
#: llama_7b.sh@8460814 --rank 1024).
GALORE_RANK_DIVISOR = 4
#: The parameter groups GaLore projects: the layers' attention and MLP Linear weights
#: (torchrun_main.py@8460814 galore_params: nn.Linear modules named attn/mlp); every other
#: parameter steps with bitsandbytes' 8-bit Adam.
GALORE_GROUPS = frozenset({"linears"})


class StateFormat(Enum):
    """How one optimizer state is stored."""

    #: Like the parameter (`torch.zeros_like(param)`), or fp32 beside an fp32 master copy.
    DENSE = "dense"
    #: Always fp32, whatever the parameter dtype (bitsandbytes' 32-bit optimizers:
    #: `optim_bits == 32 -> torch.float32`, bitsandbytes/optim/optimizer.py@0.44.1 init_state).
    DENSE_FP32 = "dense fp32"
    #: bitsandbytes blockwise 8-bit: uint8 values + an fp32 absmax per 256-value block.
    BLOCKWISE_8BIT = "8-bit blockwise"
    #: Adafactor's factored second moment: fp32 row and column statistics of each matrix, a full
    #: fp32 statistic for each vector.
    FACTORED = "factored"
    #: torchao blockwise 4-bit: packed 4-bit codes + an fp32 scale per 128-value block.
    BLOCKWISE_4BIT = "4-bit blockwise"
    #: GaLore: the Linear weights' states live in a rank-r projection (8-bit blockwise), beside
    #: the projection matrix; other parameters keep 8-bit blockwise states.
    GALORE_8BIT = "GaLore projected, 8-bit"


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
    #: Its name in Transformers' `TrainingArguments.optim` (axolotl, LLaMA-Factory and TRL
    #: pass it through): what `vram.io.export` writes and the readers read. None: it has none.
    hf_optim: str | None = None


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
        steps_in_backward=False, formula=_ADAM_FORMULA, source=_ADAMW,
        hf_optim="adamw_torch_fused"),
    Optimizer.PAGED_ADAMW: OptimizerSpec(
        2, StateFormat.DENSE_FP32, StepTemporaries.NONE, paged=True,
        steps_in_backward=False, formula="2 states × 4 B (fp32) × trainable params",
        source="bitsandbytes/optim/adamw.py@0.44.1 PagedAdamW (optim_bits=32, is_paged)",
        hf_optim="paged_adamw_32bit"),
    Optimizer.ADAMW_IN_BACKWARD: OptimizerSpec(
        2, StateFormat.DENSE, StepTemporaries.NONE, paged=False, steps_in_backward=True,
        formula=_ADAM_FORMULA,
        source="torchtune/training/_optimizer_in_bwd.py@v0.3.0 (register_post_accumulate_"
               "grad_hook steps and frees each gradient)"),
    Optimizer.ADAMW_8BIT: OptimizerSpec(
        2, StateFormat.BLOCKWISE_8BIT, StepTemporaries.NONE, paged=False,
        steps_in_backward=False, formula=_BNB_FORMULA, source=_BNB,
        hf_optim="adamw_bnb_8bit"),
    Optimizer.PAGED_ADAMW_8BIT: OptimizerSpec(
        2, StateFormat.BLOCKWISE_8BIT, StepTemporaries.NONE, paged=True,
        steps_in_backward=False, formula=_BNB_FORMULA, source=_BNB + " PagedAdamW8bit",
        hf_optim="paged_adamw_8bit"),
    Optimizer.SGD: OptimizerSpec(
        0, StateFormat.DENSE, StepTemporaries.NONE, paged=False, steps_in_backward=False,
        formula="plain SGD keeps no state", source="torch/optim/sgd.py@v2.4.0 momentum=0",
        hf_optim="sgd"),
    Optimizer.SGD_MOMENTUM: OptimizerSpec(
        1, StateFormat.DENSE, StepTemporaries.NONE, paged=False, steps_in_backward=False,
        formula=_ONE_FORMULA, source="torch/optim/sgd.py@v2.4.0 momentum_buffer"),
    Optimizer.LION: OptimizerSpec(
        1, StateFormat.DENSE, StepTemporaries.FOREACH_STATE, paged=False,
        steps_in_backward=False, formula=_ONE_FORMULA,
        source="lucidrains/lion-pytorch lion_pytorch.py@0.2.2 (exp_avg); Chen et al. 2023",
        hf_optim="lion_32bit"),
    Optimizer.ADAFACTOR: OptimizerSpec(
        1, StateFormat.FACTORED, StepTemporaries.LARGEST_PARAM_FP32, paged=False,
        steps_in_backward=False,
        formula=("4 bytes × (rows + columns) per matrix (factored second moment), "
                 "each vector in 512-byte allocator blocks"),
        source="transformers/optimization.py@v4.46.0 Adafactor (beta1=None: no first moment)",
        hf_optim="adafactor"),
    Optimizer.ADAMW_4BIT: OptimizerSpec(
        2, StateFormat.BLOCKWISE_4BIT, StepTemporaries.NONE, paged=False,
        steps_in_backward=False,
        formula=("2 states × (0.5 byte + 4 bytes per 128-value block); states like the "
                 "parameter for tensors under 4096 values"),
        source=("torchao/optim/adam.py@0372e5f AdamW4bit (block_size=128; one compiled "
                "single-parameter step, no full-size temporaries)"),
        hf_optim="adamw_torch_4bit"),
    Optimizer.GALORE_ADAMW8BIT_PER_LAYER: OptimizerSpec(
        2, StateFormat.GALORE_8BIT, StepTemporaries.NONE, paged=False, steps_in_backward=True,
        formula=("Linear weights: 2 states × r × max(d_in, d_out) in 8 bits + the r × "
                 "min(d_in, d_out) projection; other params: 8-bit Adam; r = hidden / 4"),
        source=("jiaweizzhao/GaLore torchrun_main.py@8460814 galore_adamw8bit_per_layer "
                "(GaLoreAdamW8bit per parameter, stepped in register_post_accumulate_grad_"
                "hook); galore_torch/galore_projector.py@8460814"),
        hf_optim="galore_adamw_8bit_layerwise"),
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
    #: Of a paged optimizer's state, what stays ordinary device memory (tensors under 1e5
    #: values: `BNB_MIN_PAGED_SIZE`).
    unpaged_bytes: int = 0


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


def torchao_4bit_tensor_bytes(numel: int, dense_bytes: int) -> int:
    """torchao's 4-bit state of one tensor, one state, as the CUDA allocator charges it."""
    if numel < TORCHAO_MIN_QUANT_SIZE or numel % TORCHAO_4BIT_BLOCK:
        return allocated_bytes(dense_bytes * numel)
    return (allocated_bytes(numel // 2)
            + allocated_bytes(FP32_BYTES * (numel // TORCHAO_4BIT_BLOCK))
            + allocated_bytes(FP32_BYTES * TORCHAO_QMAP_VALUES))


def blockwise_4bit_bytes(group: ParamGroup, dense_bytes: int) -> int:
    """One 4-bit state of a group: tensor by tensor where the group lists its tensors (or its
    matrices), else over its values pooled."""
    if group.tensors:
        return sum(count * torchao_4bit_tensor_bytes(numel, dense_bytes)
                   for numel, count in group.tensors)
    if group.matrices:
        listed = sum(m.count * torchao_4bit_tensor_bytes(m.rows * m.cols, dense_bytes)
                     for m in group.matrices)
        rest = max(0, group.n_params - sum(m.numel for m in group.matrices))
        return listed + dense_bytes * rest
    n = group.n_params
    return n // 2 + FP32_BYTES * ceil_div(n, TORCHAO_4BIT_BLOCK)


def galore_matrix_bytes(rows: int, cols: int, rank: int, dense_bytes: int) -> int:
    """GaLore's Adam state of one matrix: two 8-bit states of the projected gradient
    (r × the larger side) and the orthogonal projection (r × the smaller side), kept in the
    gradient's dtype (galore_projector.py get_orthogonal_matrix: `.type(original_type)`)."""
    r = min(rank, rows, cols)
    projected = r * max(rows, cols)
    return (2 * bnb_8bit_tensor_bytes(projected)
            + allocated_bytes(dense_bytes * r * min(rows, cols)))


def galore_bytes(group: ParamGroup, rank: int, dense_bytes: int) -> int:
    """Every state of a group under GaLore (projected Linear weights; 8-bit Adam otherwise)."""
    if group.key not in GALORE_GROUPS or not group.matrices:
        return 2 * blockwise_8bit_bytes(group)
    return sum(m.count * galore_matrix_bytes(m.rows, m.cols, rank, dense_bytes)
               for m in group.matrices)


def _state_bytes(spec: OptimizerSpec, group: ParamGroup, dense_bytes: int,
                 projection_rank: int) -> int:
    """Every state of one group."""
    if spec.state_format is StateFormat.BLOCKWISE_8BIT:
        return spec.states * blockwise_8bit_bytes(group)
    if spec.state_format is StateFormat.BLOCKWISE_4BIT:
        return spec.states * blockwise_4bit_bytes(group, dense_bytes)
    if spec.state_format is StateFormat.GALORE_8BIT:
        return galore_bytes(group, projection_rank, dense_bytes)
    if spec.state_format is StateFormat.FACTORED:
        return spec.states * factored_bytes(group)
    if spec.state_format is StateFormat.DENSE_FP32:
        return spec.states * FP32_BYTES * group.n_params
    return spec.states * dense_bytes * group.n_params


def projection_rank(hidden_size: int) -> int:
    """GaLore's rank for a model of `hidden_size` (its recipes: hidden / 4)."""
    return max(1, hidden_size // GALORE_RANK_DIVISOR)


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
                    galore_rank: int = 128) -> OptimizerState:
    """State bytes for the trainable groups (before any sharding). `state_dtype_bytes`: a dense
    state value (`PrecisionPolicy.states`); `fused`: the stack steps AdamW/Lion with fused
    kernels; `largest_param`: values in the largest trainable tensor; `galore_rank`: GaLore's
    projection rank (`projection_rank`)."""
    spec = optimizer_spec(setup.optimizer)
    trainable = [g for g in groups if g.trainable]
    total = sum(_state_bytes(spec, g, state_dtype_bytes, galore_rank) for g in trainable)
    temp = _step_temp_bytes(spec, trainable, state_dtype_bytes, fused=fused,
                            largest_param=largest_param)
    unpaged = sum(_unpaged_bytes(spec, g, state_dtype_bytes) for g in trainable) \
        if spec.paged else 0
    return OptimizerState(total, spec.formula if trainable else "", temp, spec.paged,
                          min(unpaged, total))


def _unpaged_bytes(spec: OptimizerSpec, group: ParamGroup, dense_bytes: int) -> int:
    """A paged optimizer's state of the group's tensors under 1e5 values (kept on the device).
    Groups that list neither tensors nor matrices are large tensors: all paged."""
    sizes = list(group.tensors) or [(m.rows * m.cols, m.count) for m in group.matrices]
    small = [(numel, count) for numel, count in sizes if numel < BNB_MIN_PAGED_SIZE]
    if spec.state_format is StateFormat.BLOCKWISE_8BIT:
        return spec.states * sum(count * bnb_8bit_tensor_bytes(numel) for numel, count in small)
    per_value = FP32_BYTES if spec.state_format is StateFormat.DENSE_FP32 else dense_bytes
    return spec.states * per_value * sum(numel * count for numel, count in small)


# ------------------------------------------------------------------------------------------
# The optimizer's part of one setup's memory
# ------------------------------------------------------------------------------------------


def largest_trainable(model: ModelSpec, setup: TrainingSetup,
                       groups: list[ParamGroup]) -> int:
    """Values in the largest trainable tensor (per-parameter optimizer loops size their
    temporaries to it)."""
    trainable = {g.key for g in groups if g.trainable}
    sizes = [0]
    if trainable & {"embedding", "head"}:
        sizes.append(model.vocab_size * model.hidden_size)
    if "linears" in trainable:
        # an MoE expert bank is one 3-D parameter: all its copies at once
        sizes.append(max(ln.d_in * ln.d_out * ln.copies
                         for st in model.stacks for ln in st.linears))
    if "lora" in trainable:
        widest = max(max(ln.d_in, ln.d_out) for st in model.stacks for ln in st.linears)
        sizes.append(setup.lora_rank * max(widest, model.vocab_size if "lm_head" in str(
            setup.lora_targets) else 0))
    return max(sizes)


def _master_bytes(groups: list[ParamGroup], profile: StackProfile) -> int:
    """A mixed recipe keeps an fp32 master copy of 16-bit trainable weights (DeepSpeed's
    bf16/fp16 optimizers; see `vram.stacks.precision`)."""
    return profile.precision.master * trainable_params(groups)


@dataclass(frozen=True, slots=True)
class OptimizerPart:
    items: list[LineItem]
    state: OptimizerState
    paged_bytes: int
    host_bytes: int
    step_temp_bytes: int


def optimizer_part(model: ModelSpec, groups: list[ParamGroup], setup: TrainingSetup,
                    profile: StackProfile, shards: Shards) -> OptimizerPart:
    master_full = _master_bytes(groups, profile)
    state = optimizer_state(groups, setup, fused=profile.fused_optimizer,
                            state_dtype_bytes=profile.precision.states,
                            largest_param=largest_trainable(model, setup, groups),
                            galore_rank=projection_rank(model.hidden_size))
    master = master_full // shards.optimizer
    state_bytes = state.state_bytes // shards.optimizer
    unpaged = state.unpaged_bytes // shards.optimizer
    paged = state_bytes - unpaged if state.paged else 0
    divided = f" ÷ {shards.optimizer}" if shards.optimizer > 1 else ""
    if setup.offload in (Offload.OPTIMIZER, Offload.PARAMS_OPTIMIZER):
        return OptimizerPart([], state, 0, state_bytes + master, 0)
    items = [LineItem(
        key="optimizer.states", label=f"{setup.optimizer.value} state",
        formula=state.formula + divided,
        inputs={"trainable_params": trainable_params(groups), "shards": shards.optimizer},
        bytes=unpaged if state.paged else state_bytes, source="see vram.memory.optimizer",
        note="paged: kept in CUDA unified memory, invisible to PyTorch's counters (tensors "
             "under 1e5 values stay device memory)" if state.paged else "",
    )]
    if master:
        per_param = profile.precision.master
        items.append(LineItem(
            key="optimizer.master",
            label=f"{'fp32' if per_param == FP32_BYTES else '16-bit'} master weights "
                  "(the optimizer's own copy)",
            formula=f"{per_param} B × trainable params" + divided, inputs={}, bytes=master,
            source="DeepSpeed bf16/fp16 optimizer; DeepSpeed ZeRO clones its master partition "
                   "(deepspeed/runtime/zero/stage3.py@v0.18.4#L988-L990)",
        ))
    return OptimizerPart(items, state, paged, 0, state.step_temp_bytes // shards.optimizer)
