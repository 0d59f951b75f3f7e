"""The weights on each GPU: parameters by group (sharded or offloaded), what ZeRO-3 and FSDP
hold gathered, and the working copies that are not parameters (autocast's 16-bit casts, the
weight bitsandbytes dequantizes for each matmul).
"""

from __future__ import annotations

from enum import Enum

from vram.model.lora_reach import is_bank_parameter
from vram.model.params import STORAGE_BYTES, ParamGroup, Storage
from vram.model.spec import ATTENTION_ROLES, ModelSpec, Role
from vram.result import LineItem, MomentId
from vram.setup import Offload, Sharding, TrainingSetup
from vram.setup.layout import shard_group
from vram.sharding.deepspeed_zero import (
    LiveParameters,
    gathers_copies,
    linear_wrapper,
    live_parameters,
    persistence_threshold,
    runs_deepspeed_zero3,
)
from vram.sharding.shards import Shards
from vram.stacks.profile import StackProfile, runs_grouped_experts

QUANTIZED = (Storage.NF4, Storage.NF4_DQ, Storage.INT8)


def weight_items(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                 groups: list[ParamGroup], shards: Shards, *,
                 unit_groups: list[ParamGroup] | None = None) -> tuple[list[LineItem], int]:
    """The parameters on each GPU (and what offload moves to the host). `unit_groups`: the
    parameters the rank computes with, which ZeRO-3 gathers a layer of (under expert parallel
    its own experts; `groups` then size the shards)."""
    units = groups if unit_groups is None else unit_groups
    offload_params = setup.offload is Offload.PARAMS_OPTIMIZER
    items: list[LineItem] = []
    host = 0
    for group in groups:
        on_gpu = group.bytes // shards.weights
        if offload_params:
            host += on_gpu
            on_gpu = 0
        sharded = f" ÷ {shards.weights} GPUs" if shards.weights > 1 else ""
        items.append(LineItem(
            key=f"weights.{group.key}", label=group.label,
            formula=f"params × {STORAGE_BYTES[group.storage]:g} B ({group.storage.value})"
            + sharded,
            inputs={"params": group.n_params, "storage": group.storage.value,
                    "shards": shards.weights},
            bytes=on_gpu,
            source="bitsandbytes quantize_4bit (QLoRA §2)" if group.storage in QUANTIZED
            else "parameter count × dtype",
        ))
    if model.buffer_bytes:
        items.append(LineItem(
            key="weights.buffers", label="model buffers (not parameters)",
            formula="bytes the model registers as buffers", inputs={},
            bytes=model.buffer_bytes, source="the family's modeling code (nn.Buffer)",
        ))
    if runs_deepspeed_zero3(setup):
        # DeepSpeed's coordinator, not FSDP's units: see `deepspeed_live_items`
        items.extend(_deepspeed_persistent_items(setup, groups, shards))
        return items, host
    gathered = 0 if profile.fsdp2 else _gathered_bytes(model, setup, units)
    if gathered or (offload_params and not profile.fsdp2):
        gathered = max(gathered, 2 * sum(g.bytes for g in units) // max(1, model.n_layers))
        items.append(LineItem(
            key="weights.gathered", label="gathered layers (ZeRO-3/FSDP, with prefetch)",
            formula="2 × one layer's full parameters (or a layer and the head)",
            inputs={"layers": 2}, bytes=gathered, source="PyTorch FSDP forward/backward prefetch",
        ))
    if (profile.fsdp_keeps_frozen_unsharded and setup.sharding is Sharding.ZERO3
            and shard_group(setup) > 1 and setup.trains_adapters and not offload_params):
        frozen = sum(g.bytes for g in groups if not g.trainable)
        # The unsharded flat parameter is its own buffer (FSDP's _full_param_padded), beside
        # the shard that stays allocated: a GPU holds the frozen weights 1 + 1/N times.
        items.append(LineItem(
            key="weights.unsharded_frozen", label="frozen weights left unsharded in backward",
            formula="frozen bytes (the unsharded copy, beside the shard)",
            inputs={"gpus": setup.n_gpus}, bytes=frozen,
            source="FSDP1 before PyTorch 2.2 did not reshard frozen parameters in backward "
                   "(pytorch/pytorch#95805)",
        ))
    return items, host


def _persistent_values_and_bytes(setup: TrainingSetup, groups: list[ParamGroup]
                                 ) -> tuple[int, int]:
    """Tensors under stage3_param_persistence_threshold values (norms, biases, small LoRA
    matrices): DeepSpeed ZeRO-3 never partitions them."""
    threshold = persistence_threshold(setup)
    values = 0
    size = 0.0
    for group in groups:
        for numel, count in group.tensors:
            if numel < threshold:
                values += numel * count
                size += numel * count * STORAGE_BYTES[group.storage]
    return values, int(size)


def _deepspeed_persistent_items(setup: TrainingSetup, groups: list[ParamGroup],
                                shards: Shards) -> list[LineItem]:
    """The persistent parameters' whole copies, beyond the shard counted above (all of them
    when the shards live in host memory)."""
    _, persistent = _persistent_values_and_bytes(setup, groups)
    if setup.offload is Offload.PARAMS_OPTIMIZER:
        extra = persistent
    else:
        extra = persistent - persistent // shards.weights
    if not extra:
        return []
    return [LineItem(
        key="weights.persistent", label="small parameters kept whole (ZeRO-3 persistence)",
        formula="tensors under stage3_param_persistence_threshold values, unpartitioned",
        inputs={"threshold": persistence_threshold(setup)}, bytes=extra,
        source="deepspeed/runtime/zero/config.py@v0.18.4#L220 "
               "stage3_param_persistence_threshold (ds_persist)")]

#: The moments from the end of the forward to the top layer's backward, when DeepSpeed
#: ZeRO-3 still holds the parameters it keeps for reuse (`step_moments` labels them).
_FORWARD_GATHERED = frozenset({MomentId.LAST_LAYER_FORWARD, MomentId.FORWARD_END,
                               MomentId.OUTPUT_CAST, MomentId.LOSS,
                               MomentId.FINAL_NORM_BACKWARD, MomentId.TOP_LAYER_BACKWARD})

#: Later in the backward only the module running and the prefetch are gathered.
_ONE_MODULE_GATHERED = frozenset({MomentId.FIRST_LAYER_BACKWARD, MomentId.EMBEDDING_BACKWARD})


#: 4-bit codes one 16-bit `bnb_4bit_quant_storage` element holds. DeepSpeed ZeRO-3 shards a
#: QLoRA base only with the codes packed in the model's 16-bit dtype (PEFT's DeepSpeed QLoRA
#: guide, peft docs/source/accelerate/deepspeed.md@6008f272a, `bnb_4bit_quant_storage=
#: torch.bfloat16`), and it counts its live window in the stored tensor's elements
#: (`all_gather_numel += param.ds_numel`,
#: deepspeed/runtime/zero/partitioned_param_coordinator.py@v0.18.4#L485-L488).
CODES_PER_ELEMENT = 4
FOUR_BIT = (Storage.NF4, Storage.NF4_DQ)


def deepspeed_elements(group: ParamGroup) -> int:
    """The elements DeepSpeed counts for a group: its values, or for a 4-bit base the 16-bit
    storage elements that pack them (`CODES_PER_ELEMENT` codes each)."""
    if group.storage in FOUR_BIT:
        return -(-group.n_params // CODES_PER_ELEMENT)
    return group.n_params


#: DeepSpeed ZeRO-3's live window (`live_parameters`), its partitioned values, their bytes per
#: value and the largest module's values (`deepspeed_window`).
DeepSpeedWindow = tuple[LiveParameters, int, float, int]


def deepspeed_window(model: ModelSpec, setup: TrainingSetup, groups: list[ParamGroup],
                     profile: StackProfile) -> DeepSpeedWindow | None:
    """DeepSpeed ZeRO-3's live window, read once per setup by the gathered parameters
    (`deepspeed_live_items`) and the all-gather stream's flat buffer
    (`deepspeed_prefetch_buffer_bytes`); None where nothing gathered is a copy."""
    if not runs_deepspeed_zero3(setup) or not gathers_copies(setup):
        return None
    persistent_values, persistent_bytes = _persistent_values_and_bytes(setup, groups)
    values = sum(deepspeed_elements(g) for g in groups) - persistent_values
    if values <= 0:
        return None
    per_value = (sum(g.bytes for g in groups) - persistent_bytes) / values
    packed = any(g.storage in FOUR_BIT for g in groups)
    largest = max(largest_matrix(model, profile) // (CODES_PER_ELEMENT if packed else 1),
                  model.vocab_size * model.hidden_size)
    retained = 0
    if not linear_wrapper(setup):
        # checkpointed layers keep nothing for backward; the head is never checkpointed
        keys = ("head",) if setup.grad_ckpt else ("linears", "head")
        retained = sum(deepspeed_elements(g) for g in groups if g.key in keys)
    return live_parameters(setup, values, largest, retained), values, per_value, largest


def deepspeed_prefetch_buffer_bytes(window: DeepSpeedWindow | None) -> int:
    """A coalesced prefetch's flat all-gather buffer (partition_parameters.py@v0.18.4#L1232):
    the prefetched values whole, beside the parameters `wait` copies out of it (#L761)."""
    if window is None:
        return 0
    live, _, per_value, _ = window
    return int(live.prefetched * per_value)


def deepspeed_live_items(window: DeepSpeedWindow | None) -> dict[MomentId, list[LineItem]]:
    """The whole parameters DeepSpeed ZeRO-3 holds gathered, by moment
    (`vram.sharding.deepspeed_zero.live_parameters`): from the end of the forward to the top layer's
    backward, the last max_reuse_distance / 2 parameters of the forward and the prefetch;
    later, the module running and the prefetch; none at the optimizer step."""
    if window is None:
        return {}
    live, values, per_value, largest = window
    source = ("deepspeed/runtime/zero/partitioned_param_coordinator.py@v0.18.4#L553 "
              "(stage3_max_reuse_distance), #L384 (prefetch, max_live_parameters)")
    inputs: dict[str, int | float | str] = {"kept": live.kept_for_backward,
                                            "prefetched": live.prefetched}

    def item(gathered: int, what: str) -> list[LineItem]:
        return [LineItem(
            key="weights.gathered", label="gathered parameters (DeepSpeed ZeRO-3)",
            formula=f"{what} + the prefetch bucket, whole, × bytes per parameter",
            inputs=inputs, bytes=int(gathered * per_value), source=source)]

    forward = item(live.total, "the forward's last max_reuse_distance/2 parameters (or the "
                               "Linear weights autograd retains, without zero3_linear_wrap)")
    late = item(min(values, largest + live.prefetched), "the module running")
    return {**dict.fromkeys(_FORWARD_GATHERED, forward),
            **dict.fromkeys(_ONE_MODULE_GATHERED, late)}


def _gathered_bytes(model: ModelSpec, setup: TrainingSetup, groups: list[ParamGroup]) -> int:
    """ZeRO-3 / FSDP gather one layer's full parameters while computing it and prefetch the
    next (FSDP forward/backward prefetch); the head, when it is its own unit, is gathered for
    the loss."""
    if setup.sharding is not Sharding.ZERO3 or shard_group(setup) == 1 or not model.n_layers:
        return 0
    per_layer = sum(g.bytes for g in groups
                    if g.key in ("linears", "expert_banks", "norms")) // model.n_layers
    head = sum(g.bytes for g in groups if g.key == "head")
    return max(2 * per_layer, per_layer + head)


class Stage(Enum):
    """Where in the step weight working copies are counted (what is alive differs)."""

    FORWARD = "forward"  # the forward and the loss's forward, inside autocast
    LAYERS_FORWARD = "layers' forward"  # inside the last layer: the head has not run yet
    LOSS = "loss"  # the loss's backward, before the head's
    #: the final norm's backward: the head's backward ran, no layer's has begun (none recomputed)
    FINAL_NORM = "final norm"
    TOP_LAYER = "top layer"  # the layers' backward, once the head's backward ran
    FIRST_LAYER = "first layer"  # the first layer's backward: the others' copies are freed
    #: the first layer's attention backward: its MLP's copies are freed too (the trace)
    FIRST_ATTENTION = "first layer's attention"

    # Members are singletons: hash them by identity, in C (Enum's hashes the name in Python,
    # and every moment looks its stage up).
    __hash__ = object.__hash__


def working_items(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                   groups: list[ParamGroup], shards: Shards, stage: Stage) -> list[LineItem]:
    """Temporary copies of weights that are not parameters: autocast's 16-bit casts and the
    weight bitsandbytes dequantizes for each matmul. They are activation-side memory."""
    items: list[LineItem] = []
    casts = _autocast_copies(model, setup, profile, groups, stage)
    if casts:
        when = "cached for the forward" if stage in (Stage.FORWARD, Stage.LAYERS_FORWARD) \
            else "kept for backward"
        items.append(LineItem(
            key="activations.autocast_weights",
            label=f"16-bit working copies of Linear weights (autocast, {when})",
            formula="2 B × Linear params (one layer's frozen ones with checkpointing)",
            inputs={"bytes_per_param": 2}, bytes=casts // shards.weights,
            source="torch.autocast casts each weight; the Linear keeps it for backward",
        ))
    if any(g.storage in QUANTIZED for g in groups) and stage is not Stage.FINAL_NORM:
        # the head's matrix is dequantized only between its forward and its backward; from the
        # end of the forward through the loss no layer's Linear runs, so only a quantized
        # head's dequantized weight can exist then (the trace: none at the loss's backward)
        head_out = stage in (Stage.LAYERS_FORWARD, Stage.TOP_LAYER, Stage.FIRST_LAYER,
                             Stage.FIRST_ATTENTION)
        around_head = stage in (Stage.FORWARD, Stage.LOSS)
        biggest = (model.vocab_size * model.hidden_size if profile.quantizes_head else 0) \
            if around_head else largest_matrix(model, profile, with_head=not head_out)
        # bitsandbytes dequantizes to the compute dtype (fp32 on an fp32 recipe); Lightning
        # quantized from fp16, so there an fp16 dequantization and its cast coexist.
        compute = profile.precision.dequantized  # bnb's compute dtype
        per_param = 2 + compute if profile.dequantizes_via_fp16 else compute
        items += [] if not biggest else [LineItem(
            key="activations.dequant", label="dequantized weight of the Linear being computed",
            formula=f"{per_param} B × largest quantized matrix", inputs={"params": biggest},
            bytes=per_param * biggest, source="bitsandbytes MatMul4Bit dequantizes per call"
            + (" (fp16, then cast: Lightning's BitsandbytesPrecision)" if per_param == 4
               else ""),
        )]
    return items


def _autocast_copies(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                     groups: list[ParamGroup], stage: Stage) -> int:
    """16-bit casts of fp32 Linear weights under autocast.

    Autocast caches the casts of trainable leaf weights until the autocast region ends (the
    forward and loss), whatever checkpointing does; a Linear also keeps the cast it multiplied
    by for its input gradient, so without checkpointing every cast lives into backward, and
    with it only the recomputed layer's (none while the loss runs its backward: the trace).
    Frozen weights are not cached. A trained vision tower's casts are held the same way, to its
    backward after every layer's (the trace of Qwen2.5-VL: 40 MiB per block in the forward).
    """
    if not profile.precision.casts_weights:
        return 0
    if stage is Stage.LOSS and profile.fused_linear_loss and not profile.fused_loss_is_cce:
        # Liger's fused linear loss peaks in its forward, still inside the autocast region (its
        # backward allocates nothing: liger_kernel/ops/fused_linear_cross_entropy.py@v0.3.0
        # lines 143-189): the forward's cached casts are alive (the trace, checkpointed)
        stage = Stage.FORWARD
    # A tied head multiplies by the embedding matrix: that is the weight autocast casts.
    head_keys = ("head",) if any(g.key == "head" for g in groups) else (
        ("embedding",) if model.lm_head_tied else ())
    if stage in (Stage.FINAL_NORM, Stage.TOP_LAYER, Stage.FIRST_LAYER, Stage.FIRST_ATTENTION):
        head_keys = ()  # the head's backward ran: its cast is gone
    if profile.fused_linear_loss and profile.fused_loss_is_cce:
        head_keys = ()  # Cut Cross-Entropy copies the head itself (`vram.memory.head._cce_head`)
    if stage is Stage.LAYERS_FORWARD:
        head_keys = ()  # the head has not run: no cast of it exists yet (the trace)
        stage = Stage.FORWARD
    # grouped_mm experts multiply by their fp32 banks as they are: no cast
    grouped = runs_grouped_experts(setup, profile)
    banks = sum(st.count * ln.weight_params for st in model.stacks for ln in st.linears
                if is_bank_parameter(ln, profile)) if grouped else 0
    dense = [g for g in groups if (g.key in ("linears", "expert_banks", *head_keys)
                                   or (g.key == "vision" and g.trainable))
             and g.storage is Storage.FP32 and not (grouped and g.key == "expert_banks")]
    layers = max(1, model.n_layers)

    def kept(group: ParamGroup) -> int:
        whole = 2 * (group.n_params - (banks if group.key == "linears" else 0))
        if group.key == "vision":
            # a trained vision tower's casts: cached through the forward, then kept by its
            # Linears to its own backward, after every layer's (none under checkpointing)
            return whole if stage is Stage.FORWARD or not setup.grad_ckpt else 0
        if group.key in head_keys or (stage is Stage.FORWARD and group.trainable):
            return whole
        if stage is Stage.FIRST_ATTENTION and group.key == "expert_banks":
            return 0  # the MLP's backward freed its experts' casts
        if stage is Stage.FIRST_ATTENTION and group.key == "linears":
            return 2 * _attention_params(model) // layers  # the MLP's backward freed its own
        if stage is Stage.FIRST_LAYER and group.key == "linears":
            # the MLP's backward peaks writing its up-projection's gradient, after the down
            # projection's backward freed that cast (the trace, Phi-1.5 under autocast)
            return whole // layers - 2 * _down_params(model) // layers
        if stage in (Stage.FIRST_LAYER, Stage.FIRST_ATTENTION):  # the other layers' are freed
            return whole // layers
        if not setup.grad_ckpt:
            return whole
        return whole // layers if stage is Stage.TOP_LAYER else 0  # the recomputed layer

    return sum(kept(group) for group in dense)


def _attention_params(model: ModelSpec) -> int:
    """Weights of every layer's attention projections."""
    return sum(st.count * ln.weight_params for st in model.stacks for ln in st.linears
               if ln.role in ATTENTION_ROLES)


def _down_params(model: ModelSpec) -> int:
    """Weights of every layer's dense down projection (MoE banks are counted apart)."""
    return sum(st.count * ln.weight_params for st in model.stacks for ln in st.linears
               if ln.role is Role.DOWN and not ln.is_bank)


def largest_matrix(model: ModelSpec, profile: StackProfile, *, with_head: bool = True) -> int:
    """The largest quantized matrix (bitsandbytes dequantizes one at a time)."""
    biggest = max((ln.d_in * ln.d_out for stack in model.stacks for ln in stack.linears
                   if not is_bank_parameter(ln, profile)), default=0)
    if profile.quantizes_head and with_head:
        biggest = max(biggest, model.vocab_size * model.hidden_size)
    return biggest
