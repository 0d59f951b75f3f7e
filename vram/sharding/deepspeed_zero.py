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

Its parameter coordinator (deepspeed/runtime/zero/partitioned_param_coordinator.py@v0.18.4)
gathers each module's parameters whole before it runs, and after it releases only those not
used again within `stage3_max_reuse_distance` parameters of the recorded trace (#L553). Every
parameter is used again in backward, and between a module's forward and its backward run the
forward and the backward of every later module: so once the trace is recorded (from the second
step), the modules in the last `max_reuse_distance / 2` parameters of the forward stay gathered
until their backward. Up to `stage3_prefetch_bucket_size` more are gathered ahead, while fewer
than `stage3_max_live_parameters` are gathered (#L384). Parameters under
`stage3_param_persistence_threshold` values are never partitioned. On several GPUs a gathered
parameter is a new full tensor beside the shard; on one GPU it is the shard itself
(partition_parameters.py@v0.18.4#L68, `NoGatherHandle`), a copy only when the shard lives in
host memory (parameter offload).

ZeRO-1/2 (deepspeed/runtime/zero/stage_1_and_2.py@v0.18.4#L2239-L2251) keep one IPG bucket of
`reduce_bucket_size` values in the model dtype (contiguous_gradients, the default), two with
`overlap_comm` (off by default for ZeRO-1/2, on for ZeRO-3: config.py@v0.18.4#L369). ZeRO-3
keeps one per communication dtype whatever `overlap_comm` (stage3.py@v0.18.4#L611). The
parameter all-gather after a ZeRO-1/2 step runs into the flat 16-bit buffer itself
(runtime/utils.py@v0.18.4#L1016-L1019 all_gather_into_tensor), so `allgather_bucket_size`
holds no memory of its own.

Without DeepSpeed's memory-efficient Linear (`zero3_linear_wrap`, installed by zero.Init, and
for any model only from DeepSpeed 0.19.4, #8189), `F.linear`'s autograd keeps `weight.t()`, a
view of the gathered weight: releasing the parameter swaps its `.data` but the view keeps the
gathered storage until that Linear's backward. Every Linear outside checkpointed layers then
stays gathered from its forward to its backward.

With the optimizer offloaded (ZeRO-Offload) the gradient partition, the master and the states
live in pinned host memory (stage3.py@v0.18.4#L306: `self.device` is the CPU); the IPG bucket,
the 16-bit parameters (unless offloaded too) and the gathered parameters stay on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.model.params import ParamGroup, trainable_params
from vram.setup import Offload, Sharding, TrainingSetup
from vram.setup.layout import shard_group
from vram.sharding.shards import Shards
from vram.stacks.profile import profile_for
from vram.stacks.resolve import resolve

#: deepspeed/runtime/zero/config.py@v0.18.4#L112: reduce_bucket_size = 5e8 values.
DEEPSPEED_REDUCE_BUCKET_VALUES = 500_000_000
#: deepspeed/runtime/zero/config.py@v0.18.4#L174: sub_group_size = 1e9 values.
DEEPSPEED_SUB_GROUP_VALUES = 1_000_000_000
#: deepspeed/runtime/zero/config.py@v0.18.4#L214: stage3_prefetch_bucket_size = 5e7.
DEEPSPEED_PREFETCH_BUCKET_VALUES = 50_000_000
#: deepspeed/runtime/zero/config.py@v0.18.4#L220: stage3_param_persistence_threshold = 1e5.
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000
#: deepspeed/runtime/zero/config.py@v0.18.4#L237: stage3_max_live_parameters = 1e9.
DEEPSPEED_MAX_LIVE_PARAMETERS = 1_000_000_000
#: deepspeed/runtime/zero/config.py@v0.18.4#L243: stage3_max_reuse_distance = 1e9.
DEEPSPEED_MAX_REUSE_DISTANCE = 1_000_000_000


def runs_deepspeed_zero(setup: TrainingSetup) -> bool:
    """ZeRO-1/2/3 through DeepSpeed's engine: the stack shards with DeepSpeed, not FSDP."""
    return resolve(setup).deepspeed


def runs_deepspeed_zero3(setup: TrainingSetup) -> bool:
    """ZeRO-3 through DeepSpeed's engine."""
    return setup.sharding is Sharding.ZERO3 and runs_deepspeed_zero(setup)


def overlap_comm(setup: TrainingSetup) -> bool:
    """The knob, else DeepSpeed's default: on for ZeRO-3 only (config.py@v0.18.4#L369)."""
    if setup.zero_overlap_comm is not None:
        return setup.zero_overlap_comm
    return setup.sharding is Sharding.ZERO3


def ipg_buckets(setup: TrainingSetup) -> int:
    """IPG reduce buckets on the GPU: ZeRO-1/2 double theirs with overlap_comm; ZeRO-3 keeps
    one (per communication dtype; one dtype modelled)."""
    return 2 if setup.sharding is not Sharding.ZERO3 and overlap_comm(setup) else 1


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def persistence_threshold(setup: TrainingSetup) -> int:
    """The knob, else the stack's config, else DeepSpeed's 1e5."""
    return _or_default(resolve(setup).run.zero_param_persistence_threshold,
                 DEEPSPEED_PERSISTENCE_THRESHOLD)


def linear_wrapper(setup: TrainingSetup) -> bool:
    """DeepSpeed's zero3_linear_wrap is F.linear: the knob, else the stack's (a model built in
    deepspeed.zero.Init), else installed."""
    installed = resolve(setup).run.zero3_linear_wrapper
    return True if installed is None else installed


@dataclass(frozen=True, slots=True)
class LiveParameters:
    """Parameters ZeRO-3 holds gathered (whole) at the top of the step, in values."""

    kept_for_backward: int
    prefetched: int

    @property
    def total(self) -> int:
        return self.kept_for_backward + self.prefetched


def live_parameters(setup: TrainingSetup, gathered_values: int, largest_module: int,
                    retained_linear_values: int = 0) -> LiveParameters:
    """What stays gathered from the end of the forward to the top of the backward: the last
    `max_reuse_distance / 2` parameters of the forward (at least the module running), or the
    Linear weights autograd retains without the memory-efficient Linear if more, and the
    prefetch while fewer than `max_live_parameters` are gathered; never more than the model's
    partitioned parameters (`gathered_values`)."""
    reuse = _or_default(setup.zero_max_reuse_distance, DEEPSPEED_MAX_REUSE_DISTANCE)
    kept = min(gathered_values, max(reuse // 2, largest_module, retained_linear_values))
    live_cap = _or_default(setup.zero_max_live_parameters, DEEPSPEED_MAX_LIVE_PARAMETERS)
    prefetch = min(_or_default(setup.zero_prefetch_bucket_values, DEEPSPEED_PREFETCH_BUCKET_VALUES),
                   max(0, live_cap - kept), gathered_values - kept)
    return LiveParameters(kept, prefetch)


def gathers_copies(setup: TrainingSetup) -> bool:
    """A gathered parameter is its own tensor on several GPUs, or when the shard lives in host
    memory; on one GPU it is the shard itself."""
    return shard_group(setup) > 1 or setup.offload is Offload.PARAMS_OPTIMIZER


def reduce_bucket_values(setup: TrainingSetup) -> int:
    """The reduce bucket: the knob, else the stack's config, else DeepSpeed's default."""
    return _or_default(resolve(setup).run.zero_reduce_bucket_values, DEEPSPEED_REDUCE_BUCKET_VALUES)


def ipg_bucket_bytes(setup: TrainingSetup, comm_dtype_bytes: int) -> int:
    """The IPG reduce buckets (`ipg_buckets`) in the communication dtype."""
    return ipg_buckets(setup) * reduce_bucket_values(setup) * comm_dtype_bytes


def step_copies_bytes(partition_values: int, grad_dtype_bytes: int, master_dtype_bytes: int
                      ) -> int:
    """The step's flattened gradient (gradient dtype) and its cast to the master dtype, for the
    largest sub-group of this rank's partition."""
    values = min(partition_values, DEEPSPEED_SUB_GROUP_VALUES)
    copy = grad_dtype_bytes * values
    cast = master_dtype_bytes * values if master_dtype_bytes != grad_dtype_bytes else 0
    return copy + cast


@dataclass(frozen=True, slots=True)
class ZeroBuffers:
    """DeepSpeed ZeRO's own device buffers (`vram.sharding.deepspeed_zero`)."""

    preallocated_gradients: bool = False
    bucket_bytes: int = 0
    step_copies_bytes: int = 0


def zero_buffers(setup: TrainingSetup, groups: list[ParamGroup], shards: Shards, *,
                 gradients_on_device: bool) -> ZeroBuffers:
    """DeepSpeed's engine: the IPG reduce bucket(s) on the GPU (ZeRO-1/2/3, offloaded or
    not); under ZeRO-3 with the gradients on the GPU, the flat gradient partition (allocated at
    init) and the step's flattened and master-dtype gradient copies."""
    trainable = trainable_params(groups)
    if not runs_deepspeed_zero(setup) or not trainable:
        return ZeroBuffers()
    policy = profile_for(setup).precision
    grad_dtype = policy.gradients
    bucket = ipg_bucket_bytes(setup, grad_dtype)
    if setup.sharding is not Sharding.ZERO3 or not gradients_on_device:
        return ZeroBuffers(False, bucket)
    master_dtype = policy.master or grad_dtype
    partition = trainable // shards.gradients
    return ZeroBuffers(True, bucket, step_copies_bytes(partition, grad_dtype, master_dtype))
