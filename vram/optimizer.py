"""Optimizer state: bytes each optimizer keeps per trainable parameter, and step temporaries.

Sources: torch.optim.AdamW keeps exp_avg and exp_avg_sq like the parameter (Loshchilov & Hutter
2019); bitsandbytes 8-bit optimizers keep uint8 states with an fp32 absmax per 256-value block and
fall back to 32-bit states for tensors under 4096 values (Dettmers et al. 2022, "8-bit Optimizers
via Block-wise Quantization"); Adafactor keeps row and column statistics of the second moment and
no first moment by default (Shazeer & Stern 2018; transformers' Adafactor beta1=None); Lion keeps
one momentum (Chen et al. 2023); SGD with momentum one buffer, plain SGD none.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.params import STORAGE_BYTES, ParamGroup, Storage, allocated_bytes
from vram.setup import Optimizer, TrainingSetup

BNB_BLOCK = 256
#: bitsandbytes keeps 32-bit state for tensors under this many values (min_8bit_size).
SMALL_8BIT = 4096


@dataclass(frozen=True, slots=True)
class OptimizerState:
    state_bytes: int
    formula: str
    step_temp_bytes: int
    paged: bool


def _state_dtype_bytes(group: ParamGroup, master_fp32: bool) -> int:
    """torch optimizers create states with `zeros_like(param)`: the parameter's dtype; with an
    fp32 master copy (DeepSpeed's mixed-precision optimizer) the states are fp32 like it."""
    if master_fp32 or group.storage not in (Storage.FP32, Storage.BF16):
        return 4
    return int(STORAGE_BYTES[group.storage])


def _bnb_8bit_bytes(numel: int) -> int:
    """bitsandbytes' 8-bit Adam state of one tensor, as the CUDA allocator charges it: two
    uint8 states and two fp32 absmax vectors (one per 256 values); tensors under 4096 values
    keep two fp32 states instead (bitsandbytes/optim/optimizer.py, min_8bit_size)."""
    if numel < SMALL_8BIT:
        return 2 * allocated_bytes(4 * numel)
    return 2 * (allocated_bytes(numel) + allocated_bytes(4 * -(-numel // BNB_BLOCK)))


def optimizer_state(groups: list[ParamGroup], setup: TrainingSetup, *, fused: bool,
                    master_fp32: bool = False, largest_param: int = 0) -> OptimizerState:
    """State bytes for the trainable groups (before any sharding)."""
    trainable = [g for g in groups if g.trainable]
    opt = setup.optimizer
    total = 0
    temp = 0
    formula = ""
    for group in trainable:
        n = group.n_params
        b = _state_dtype_bytes(group, master_fp32)
        if opt in (Optimizer.ADAMW, Optimizer.PAGED_ADAMW, Optimizer.ADAMW_IN_BACKWARD):
            total += 2 * b * n
            temp += b * n  # foreach AdamW: sqrt(exp_avg_sq) as a new list of tensors
            formula = "2 states × dtype bytes × trainable params"
        elif opt in (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT):
            if group.tensors:
                total += sum(k * _bnb_8bit_bytes(numel) for numel, k in group.tensors)
            else:
                big = n - group.small_numel
                total += 2 * (big + 4 * -(-big // BNB_BLOCK)) + 2 * 4 * group.small_numel
            formula = ("2 states × (1 byte + 4 bytes per 256-value block); 32-bit states for "
                       "tensors under 4096 values")
        elif opt in (Optimizer.SGD_MOMENTUM, Optimizer.LION):
            total += b * n
            temp += b * n if opt is Optimizer.LION else 0
            formula = "1 state × dtype bytes × trainable params"
        elif opt is Optimizer.ADAFACTOR:
            total += group.factored_bytes if group.factored_bytes else 4 * n
            formula = ("4 bytes × (rows + columns) per matrix (factored second moment), "
                       "each vector in 512-byte allocator blocks")
            # transformers' Adafactor steps one parameter at a time in fp32: the gradient and
            # the parameter upcast (16-bit models), grad² and the update, for the largest one.
            copies = 4 if b == 2 else 2
            temp = max(temp, copies * 4 * largest_param)
        else:
            formula = "plain SGD keeps no state"
    paged = opt in (Optimizer.PAGED_ADAMW, Optimizer.PAGED_ADAMW_8BIT)
    # `fused` is the stack's AdamW/Lion kernel choice; Adafactor always steps in Python.
    if (fused and opt is not Optimizer.ADAFACTOR) or opt is Optimizer.ADAMW_IN_BACKWARD:
        temp = 0
    return OptimizerState(total, formula, temp, paged)
