"""What DeepSpeed's ZeRO-3 engine keeps on the GPU beside the parameters and the optimizer.

DeepSpeed (not FSDP) runs ZeRO-3 when the stack shards with DeepSpeed (`fsdp_version` n/a).
Its stage-3 optimizer (deepspeed/runtime/zero/stage3.py@v0.16.0):

- allocates the flat gradient partition once, zero-filled, in the gradient-accumulation dtype
  (`grad_partitions_flat_buffer`; the engine's `get_data_types`: the model dtype under ZeRO),
  so every gradient of this rank exists from the first step, not as backward makes it;
- keeps one IPG reduce bucket of `reduce_bucket_size` values per communication dtype
  (`ipg_buckets[dtype].buffer = torch.empty(reduce_bucket_size)`, contiguous_gradients=True);
- at the step flattens the gradient partition (`self.flatten`, a copy in the gradient dtype)
  and casts it to the master dtype (`_prepare_fp32_grad_for_sub_group`), one sub-group
  (`sub_group_size` = 1e9 values by default) at a time.
"""

from __future__ import annotations

from vram.knob_rules import effective_fsdp_version
from vram.setup import Sharding, TrainingSetup
from vram.stack import stack_row

#: deepspeed/runtime/zero/config.py@v0.16.0: reduce_bucket_size = 5e8 values.
DEEPSPEED_REDUCE_BUCKET_VALUES = 500_000_000
#: deepspeed/runtime/zero/config.py@v0.16.0: sub_group_size = 1e9 values.
DEEPSPEED_SUB_GROUP_VALUES = 1_000_000_000


def runs_deepspeed_zero3(setup: TrainingSetup) -> bool:
    """ZeRO-3 through DeepSpeed's engine: the stack shards with DeepSpeed, not FSDP."""
    row = stack_row(setup.framework)
    return (setup.sharding is Sharding.ZERO3
            and effective_fsdp_version(setup, row.default_fsdp_version) is None)


def reduce_bucket_values(setup: TrainingSetup) -> int:
    """The reduce bucket: the knob, else the stack's config, else DeepSpeed's default."""
    if setup.zero_reduce_bucket_values is not None:
        return setup.zero_reduce_bucket_values
    default = stack_row(setup.framework).default_zero_reduce_bucket_values
    return default if default is not None else DEEPSPEED_REDUCE_BUCKET_VALUES


def ipg_bucket_bytes(setup: TrainingSetup, comm_dtype_bytes: int) -> int:
    """The IPG reduce bucket (one per communication dtype; one dtype modelled)."""
    return reduce_bucket_values(setup) * comm_dtype_bytes


def step_copies_bytes(partition_values: int, grad_dtype_bytes: int, master_dtype_bytes: int
                      ) -> int:
    """The step's flattened gradient (gradient dtype) and its cast to the master dtype, for the
    largest sub-group of this rank's partition."""
    values = min(partition_values, DEEPSPEED_SUB_GROUP_VALUES)
    copy = grad_dtype_bytes * values
    cast = master_dtype_bytes * values if master_dtype_bytes != grad_dtype_bytes else 0
    return copy + cast
