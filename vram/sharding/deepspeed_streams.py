"""What DeepSpeed ZeRO-3 keeps reserved in its all-gather stream's pool.

With `overlap_comm` (on by default for ZeRO-3, deepspeed/runtime/zero/config.py@v0.18.4#L369)
the parameter coordinator gets a stream of its own for the all-gathers
(parameter_offload.py@v0.18.4#L148-L149: `Stream() if overlap_comm else default_stream()`).
Every gathered parameter is allocated on it (deepspeed@v0.18.4):

* `__all_gather_params_` calls `all_gather_coalesced` under
  `with get_accelerator().stream(self.__allgather_stream)`
  (partitioned_param_coordinator.py#L501-L504): a single tensor's all-gather buffer
  (`param_buffer`, partition_parameters.py#L1324) becomes its `param.data`; a coalesced fetch
  all-gathers into one flat buffer (`flat_tensor`, #L1232) and `wait` (also called under the
  all-gather stream, coordinator #L331-L337) copies each parameter out of it with `torch.cat`
  (#L761), the flat buffer freed when the handle is dropped;
* on one GPU with the shards in host memory, `NoGatherHandle` copies the shard in (#L58-L70),
  under the same stream;
* `free_param` (#L300-L310) records the compute stream on the gathered storage and swaps
  `param.data` for an empty tensor: the block returns to the all-gather stream's pool.

The caching allocator serves a cached block only to the stream that allocated it
(c10/cuda/CUDACachingAllocator.cpp `get_free_block`; `vram.memory.allocator.blocks`), so the
pool's high water (the most parameters gathered at once, `vram.memory.weights`'s live window,
and the flat buffer of a coalesced prefetch beside them) stays reserved through the step, out
of the compute stream's reach. The estimate counts the gathered parameters live at each moment;
the pool beyond what it counts at the reserved peak's moment is this reserved term. Without
`overlap_comm` the all-gathers run on the compute stream and share its pool.
"""

from __future__ import annotations

from vram.result import LineItem
from vram.setup import TrainingSetup
from vram.sharding.deepspeed_zero import gathers_copies, overlap_comm, runs_deepspeed_zero3

SOURCE = ("deepspeed/runtime/zero/parameter_offload.py@v0.18.4#L148-L149 (all-gather stream "
          "with overlap_comm); partitioned_param_coordinator.py@v0.18.4#L331-L337, #L501-L504 "
          "(gathers and waits under it); partition_parameters.py@v0.18.4#L1232, #L1324 (flat "
          "and single buffers), #L300-L310 free_param; c10/cuda/CUDACachingAllocator.cpp "
          "get_free_block (a free block serves its own stream only)")


def runs_allgather_stream(setup: TrainingSetup) -> bool:
    """DeepSpeed ZeRO-3 with `overlap_comm` and gathered parameters that are copies (several
    GPUs, or the shards in host memory): the all-gathers allocate on a stream of their own."""
    return runs_deepspeed_zero3(setup) and overlap_comm(setup) and gathers_copies(setup)


def allgather_pool_item(window_bytes: int, flat_bytes: int, counted_bytes: int
                        ) -> LineItem | None:
    """The all-gather stream's cached blocks beyond the `counted_bytes` of gathered parameters
    the estimate holds live at the reserved peak's moment: the most gathered at once
    (`window_bytes`) + one coalesced prefetch's flat buffer (`flat_bytes`) − counted."""
    extra = window_bytes + flat_bytes - counted_bytes
    if extra <= 0:
        return None
    return LineItem.assemble(
        "overhead.zero3_allgather_stream", "DeepSpeed ZeRO-3 all-gather stream's cached blocks "
        "(other streams cannot reuse them)",
        "most parameters gathered at once + a coalesced prefetch's flat buffer − the gathered "
        "parameters counted at the reserved peak",
        {"window": window_bytes, "flat_buffer": flat_bytes, "counted": counted_bytes},
        extra, SOURCE)
