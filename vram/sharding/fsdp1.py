"""What FSDP1 (`FullyShardedDataParallel`, FULL_SHARD) keeps reserved in its own streams' pools.

FSDP1 all-gathers each unit into its padded unsharded flat parameter on the unshard stream
(`_runtime_utils._unshard`: `with state._device_handle.stream(unshard_stream): handle.unshard()`,
whose `_alloc_padded_unsharded_flat_param` resizes the storage there), and with CPU offload it
copies the unit's shard to the GPU on the pre-unshard stream first (`FlatParamHandle.pre_unshard`
-> `flat_param_to(device)` under `pre_unshard_stream`). The caching allocator serves a cached
block only to the stream that allocated it (CUDACachingAllocator.cpp `get_free_block`: the pool is
ordered by stream, then size; `vram.memory.allocator.blocks`), so what those streams cached is
reserved and out of reach of the compute stream, whatever the compute stream needs.

How much they cache (torch/distributed/fsdp, read at v2.2.0):

* the root unit (the embedding, final norm and head under a per-block wrap) is all-gathered at
  the start of the forward and not freed after it (`_post_forward_reshard`: "Do not free the
  root's parameters in the post-forward for FULL_SHARD", `not state._is_root`);
* a block is freed after its forward and its backward with `record_stream` on the compute
  stream (`FlatParamHandle._free_unsharded_flat_param`), so its block returns to the unshard pool
  only once the compute stream has passed the free; `limit_all_gathers=True` (the default, and
  Accelerate's) makes a new all-gather wait for the oldest of two queued free events
  (`_limiter_utils._FreeEventQueue`, `_max_num_inflight_all_gathers = 2`): in backward, with
  BACKWARD_PRE prefetch, the block running, the next one down being gathered, and the one above
  (freed, its event not yet waited on) are three blocks of the pool;
* under CPU offload, the shard copied in for each all-gather (the root's the largest) is a block
  of the pre-unshard stream's pool.

The estimate counts two blocks (or a block and the head) as gathered parameters in every moment
(`vram.memory.weights`, "weights.gathered"; on PyTorch <= 2.1 also every frozen weight, left
unsharded in backward: "weights.unsharded_frozen"); the pools beyond that are this reserved
term.
"""

from __future__ import annotations

from vram.model.params import DENSE_STORAGE, ParamGroup
from vram.model.spec import ModelSpec
from vram.result import LineItem
from vram.setup import Offload, Sharding, TrainingSetup
from vram.setup.layout import shard_group
from vram.sharding.fsdp2 import gather_bytes
from vram.stacks.profile import StackProfile
from vram.stacks.resolve import resolve

SOURCE = ("torch/distributed/fsdp/_runtime_utils.py@v2.2.0 _unshard, _post_forward_reshard; "
          "_flat_param.py@v2.2.0 _free_unsharded_flat_param (record_stream), pre_unshard; "
          "_limiter_utils.py@v2.2.0 _FreeEventQueue (2 in flight); "
          "c10/cuda/CUDACachingAllocator.cpp@v2.2.0 get_free_block "
          "(a free block serves its own stream only)")

#: Parameter groups of the root unit under a per-block wrap (Accelerate's
#: TRANSFORMER_BASED_WRAP, fsdp_qlora's and LitGPT's block policies).
ROOT_KEYS = ("embedding", "embedding_extra", "head")
#: Parameter groups of a block unit (adapters are units of their own under PEFT's
#: `fsdp_auto_wrap_policy` and fsdp_qlora's lambda policy: a few MB, left out).
BLOCK_KEYS = ("linears", "expert_banks", "norms")
#: Blocks of the unshard stream's pool at its high water: the block running, the next one
#: being gathered (BACKWARD_PRE), the one freed before them (`_max_num_inflight_all_gathers`
#: = 2 queued free events, the oldest waited on before a new all-gather).
POOL_BLOCKS = 3


def runs_fsdp1_full_shard(setup: TrainingSetup) -> bool:
    """FSDP1 (not DeepSpeed, not `fully_shard`) sharding the weights over more than one GPU."""
    run = resolve(setup)
    return (setup.sharding is Sharding.ZERO3 and shard_group(setup) > 1 and not run.deepspeed
            and run.run.fsdp_version == 1)


def unit_bytes(group: ParamGroup, profile: StackProfile) -> int:
    """A group all-gathered: quantized weights as they are stored (their packed
    `quant_storage` codes and scales), else in the all-gather dtype
    (`vram.sharding.fsdp2.gather_bytes`)."""
    if group.storage not in DENSE_STORAGE.values():
        return group.bytes
    return group.n_params * gather_bytes(group, profile)


def _unit_bytes(groups: list[ParamGroup], keys: tuple[str, ...], profile: StackProfile) -> int:
    return sum(unit_bytes(g, profile) for g in groups if g.key in keys)


def pool_bytes(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
               groups: list[ParamGroup]) -> tuple[int, int, int]:
    """The root unit's and one block's all-gathered bytes, and the pre-unshard stream's shard
    copy (CPU offload only: the largest unit's shard)."""
    root = _unit_bytes(groups, ROOT_KEYS, profile)
    block = _unit_bytes(groups, BLOCK_KEYS, profile) // max(1, model.n_layers)
    offloaded = setup.offload is Offload.PARAMS_OPTIMIZER
    copy = max(root, block) // shard_group(setup) if offloaded else 0
    return root, block, copy


def unshard_pool_item(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                      groups: list[ParamGroup], gathered: int) -> LineItem | None:
    """The unshard and pre-unshard streams' cached blocks beyond the `gathered` bytes the
    estimate already counts as live: root + 3 × one block (+ a shard copy under offload) −
    gathered. None outside FSDP1's full shard."""
    if not runs_fsdp1_full_shard(setup):
        return None
    root, block, copy = pool_bytes(model, setup, profile, groups)
    extra = root + POOL_BLOCKS * block + copy - gathered
    if extra <= 0:
        return None
    return LineItem.assemble(
        "overhead.fsdp1_streams", "FSDP1 all-gather streams' cached blocks (other streams "
        "cannot reuse them)",
        "root unit + 3 × one block, all-gathered (+ the root's shard copy under CPU offload) "
        "− the gathered layers counted",
        {"root": root, "block": block, "blocks": POOL_BLOCKS, "shard_copy": copy,
         "gathered": gathered},
        extra, SOURCE)
