"""The gradients on each GPU, and when in the backward each exists: the head's first, each
layer's as its backward runs (whole until reduce-scattered when sharded), the embedding's
last; DDP's and DeepSpeed ZeRO's buckets beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.memory.optimizer import steps_in_backward
from vram.model.params import STORAGE_BYTES, ParamGroup, Storage
from vram.model.spec import ATTENTION_ROLES, ModelSpec, Role
from vram.result import LineItem
from vram.setup import Offload, Sharding, TrainingSetup
from vram.setup.layout import shard_group
from vram.sharding import fsdp2
from vram.sharding.deepspeed_zero import ZeroBuffers, ipg_buckets, reduce_bucket_values
from vram.sharding.shards import Shards
from vram.stacks.profile import StackProfile
from vram.units import FP32_BYTES as FP32

#: The parameter groups of a vision tower and projector (`vram.model.params`).
VISION_KEYS = ("vision", "vision_linears", "vision_lora")


def grad_bytes(group: ParamGroup) -> int:
    """Gradients take the parameter's dtype (PyTorch accumulates .grad like the param)."""
    if group.storage in (Storage.FP32, Storage.BF16):
        return int(group.n_params * STORAGE_BYTES[group.storage])
    return group.n_params * FP32


def whole_embedding_factor(setup: TrainingSetup) -> int:
    """Under tensor parallel the vocabulary-parallel embedding's gradient is whole on every
    rank: DTensor has no backward strategy that leaves it split by rows (`Shard(0)`); with the
    sequence split (or replicated) its `embedding_dense_backward` makes a `Partial` full-vocab
    gradient that is reduced to `Replicate` (torch/distributed/tensor/_ops/_embedding_ops.py
    @v2.13.0 #L66-L97 `embedding_dense_backward_strategy`; the trace: a 2-rank Llama's
    embedding `.grad` is Replicate, V x h). It stays so until the optimizer step."""
    return setup.tp


@dataclass(frozen=True, slots=True)
class GradientPart:
    total: int  # every gradient on this GPU
    head: int  # the first to exist in backward: the head's (or the tied embedding's)
    untied_embedding: int  # the last to exist: an untied embedding's
    embedding: int  # the embedding's gradient, tied or not (built last, by embedding_backward)
    per_layer: int
    ddp_buckets: int
    host: int
    #: The largest single gradient of a layer (a whole expert bank for MoE), being written.
    largest_in_layer: int
    #: With sharded (ZeRO-2/3, FSDP) or offloaded gradients, a unit's gradients are first
    #: computed whole on the GPU, then reduce-scattered (and copied out): the largest unit.
    unsharded_unit: int = 0
    #: A tied embedding's gradient: the head's contribution waits in autograd's input buffer
    #: from the top of backward (it is not a .grad yet), then the embedding's is built and
    #: added into it in place (autograd's `InputBuffer::accumulate` runs `old.add_(new)` when
    #: it holds the last reference; an out-of-place sum seen under a dispatch mode is not what a
    #: GPU runs).
    tied: int = 0
    #: Gradients made only at the end of backward, after every block's: an untied embedding's
    #: and a tied one's (whose .grad waits for the embedding's backward); under FSDP2 every
    #: gradient of the root unit (embedding, head), reduced at the root's post-backward.
    pending: int = 0
    #: FSDP2's unsharded sizes (`vram.sharding.fsdp2`); None for any other sharding.
    fsdp2: fsdp2.Fsdp2Units | None = None
    #: The largest attention projection's gradient (being written when a layer's backward
    #: peaks in its attention, after the MLP's gradients became .grad).
    largest_in_attention: int = 0
    #: MoE: one layer's gate/up and down expert banks' gradients, and the experts per bank.
    bank_gate_up: int = 0
    bank_down: int = 0
    bank_experts: int = 0
    #: A vision-language model's vision tower, projector and their adapters: made in the
    #: tower's backward, after every language-model layer's (`vram.memory.vision`).
    vision: int = 0
    #: The largest single gradient of the first layer (being written in its backward).
    largest_in_first_layer: int = 0


def _layer_grads(groups: list[ParamGroup]) -> int:
    """The layers' gradients: their Linear weights, norms and adapters."""
    return sum(grad_bytes(g) for g in groups
               if g.trainable and g.key in ("linears", "norms", "lora"))


def _fsdp2_gradient_part(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                         groups: list[ParamGroup], total: int, per_layer: int,
                         unit: int, unit_groups: list[ParamGroup]) -> GradientPart:
    """FSDP2: the root's sharded gradients (embedding, head) exist only after its
    post-backward, at the end; the head's gradient waits unsharded until then (an in-flight
    item) and a tied embedding's in autograd's buffer; the embedding's is built unsharded."""
    units = fsdp2.units(model, setup, profile, unit_groups)
    # A head unit of its own reduces its gradient before the blocks' backward.
    own_head = units.separate
    root = sum(grad_bytes(g) for g in groups if g.trainable and g.key in fsdp2.ROOT_KEYS
               and not (own_head and g.key == "head"))
    head = sum(grad_bytes(g) for g in groups if g.trainable and g.key == "head") \
        if own_head else 0
    embedding = next((g for g in groups if g.key == "embedding" and g.trainable), None)
    built = embedding.n_params * fsdp2.gather_bytes(embedding, profile) if embedding else 0
    group = shard_group(setup)
    return GradientPart(total, head // group, 0, built, per_layer, 0, 0, 0, unit,
                        tied=fsdp2.tied_pending_bytes(model, groups, profile),
                        pending=root // group, fsdp2=units)


def gradient_part(model: ModelSpec, setup: TrainingSetup, groups: list[ParamGroup],
                  shards: Shards, profile: StackProfile, *,
                  unit_groups: list[ParamGroup] | None = None) -> GradientPart:
    """The gradients on each GPU; `groups` size the shards, `unit_groups` (default `groups`)
    what the rank computes with: under expert parallel its own experts, a layer of which is
    whole until reduce-scattered (`vram.sharding.expert_parallel`)."""
    units = groups if unit_groups is None else unit_groups
    trainable = [g for g in groups if g.trainable]
    by_key = {g.key: grad_bytes(g) for g in trainable}
    if setup.tp > 1 and "embedding" in by_key and not profile.fsdp2:
        by_key["embedding"] *= whole_embedding_factor(setup)
    full = sum(by_key.values())
    # Only an LM head multiplies by a tied embedding; a classifier's embedding is used once.
    tied_lm = model.lm_head_tied
    head = by_key.get("head", by_key.get("embedding", 0) if tied_lm else 0)
    untied_embedding = by_key.get("embedding", 0) if not tied_lm else 0
    per_layer = _layer_grads(groups) // max(1, model.n_layers)
    linears = next((g for g in trainable if g.key == "linears"), None)
    largest = largest_first = 0
    largest_attention = 0
    banks = {Role.GATE_UP: 0, Role.DOWN: 0}
    experts = 0
    if linears is not None:
        per_param = grad_bytes(linears) // max(1, linears.n_params)
        largest = per_param * max(ln.weight_params for st in model.stacks for ln in st.linears)
        largest_first = per_param * max(ln.weight_params for ln in model.first_stack.linears)
        largest_attention = per_param * max(
            (ln.weight_params for st in model.stacks for ln in st.linears
             if ln.role in ATTENTION_ROLES), default=0)
        for ln in (ln for st in model.stacks for ln in st.linears if ln.is_bank):
            if ln.role in banks:
                banks[ln.role] = per_param * ln.weight_params
                experts = ln.copies
    n = shards.gradients
    ddp = full if setup.sharding is Sharding.DDP else 0
    offloaded = setup.offload in (Offload.OPTIMIZER, Offload.PARAMS_OPTIMIZER)
    in_backward = steps_in_backward(setup)
    # Stepping in backward frees each gradient as it is made: nothing waits for a reduction.
    unit_layer = per_layer if units is groups else _layer_grads(units) // max(1, model.n_layers)
    unit = unit_layer if (n > 1 or offloaded) and not in_backward else 0
    embedding = by_key.get("embedding", 0)
    if offloaded:
        # ZeRO-Offload and FSDP CPU offload move the sharded gradients to host memory (FSDP2
        # still gathers and reduces on the GPU).
        return GradientPart(0, 0, 0, 0, 0, ddp, full // n, 0, unit, fsdp2=(
            fsdp2.units(model, setup, profile, units) if profile.fsdp2 else None))
    tied = embedding if tied_lm and "head" not in by_key and not in_backward \
        else 0
    if profile.fsdp2 and not in_backward:
        return _fsdp2_gradient_part(model, setup, profile, groups, full // n, per_layer // n,
                                    unit, units)
    vision = sum(by_key.get(key, 0) for key in VISION_KEYS)
    return GradientPart(full // n, (head - tied) // n, untied_embedding // n, embedding // n,
                        per_layer // n, ddp, 0, largest, unit, tied=tied // n, vision=vision // n,
                        pending=untied_embedding // n + tied // n,
                        largest_in_attention=largest_attention,
                        # a unit's gradients are whole until reduce-scattered
                        bank_gate_up=banks[Role.GATE_UP] // (1 if unit else n),
                        bank_down=banks[Role.DOWN] // (1 if unit else n), bank_experts=experts,
                        largest_in_first_layer=largest_first)


def bucket_gradient_items(setup: TrainingSetup, grads: GradientPart,
                           zero: ZeroBuffers) -> tuple[LineItem, ...]:
    """The gradient buffers beside the parameters' own gradients: DDP's and ZeRO-3's buckets."""
    items = []
    if grads.ddp_buckets:
        items.append(LineItem(
            key="gradients.ddp_buckets", label="DDP gradient buckets",
            formula="one more copy of the gradients (gradient_as_bucket_view=False)",
            inputs={}, bytes=grads.ddp_buckets,
            source="torch.nn.parallel.DistributedDataParallel"))
    if zero.bucket_bytes:
        items.append(LineItem(
            key="gradients.zero_buckets", label="DeepSpeed ZeRO reduce bucket"
            + ("s (overlap_comm)" if ipg_buckets(setup) > 1 else ""),
            formula="buckets × reduce_bucket_size × gradient dtype bytes",
            inputs={"reduce_bucket_values": reduce_bucket_values(setup),
                    "buckets": ipg_buckets(setup)},
            bytes=zero.bucket_bytes,
            source="deepspeed/runtime/zero/stage3.py@v0.18.4#L611 ipg_buckets[dtype].buffer; "
                   "stage_1_and_2.py@v0.18.4#L2239-L2251 (a second with overlap_comm)"))
    return tuple(items)
