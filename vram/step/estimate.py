"""The estimate: per-GPU bytes of one training step, by bucket, at the peak moment.

The step is followed through the moments that can hold the peak:
- forward end: weights + optimizer state + every saved activation + the logits;
- the loss: the same, with the loss's forward and backward buffers (logits, log-softmax and
  their gradients) at their largest;
- the top layer's backward: the head's gradient exists while every layer's activations are
  still held (under checkpointing, the top layer is recomputed);
- late backward: almost every gradient exists, one layer's activations remain;
- the optimizer step: weights + gradients + states + the step's temporaries.
The largest is the allocated peak (`torch.cuda.max_memory_allocated()`); the buckets are what
is alive at that moment, and `phase` names it.

    >>> from vram import load_model, TrainingSetup, estimate
    >>> estimate(load_model("llama-3.1-8b"), TrainingSetup(method="qlora")).device_peak_bytes
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter

from vram.memo import TOKEN_FIELDS, memoized, setup_key
from vram.memory import activations as act
from vram.memory.inference import inference_estimate
from vram.memory.optimizer import (
    OptimizerState,
    optimizer_state,
    projection_rank,
    steps_in_backward,
)
from vram.memory.overhead import allocator_slack_bytes, cuda_context_bytes, nccl_bytes
from vram.memory.params import (
    STORAGE_BYTES,
    ParamGroup,
    Storage,
    leaves_bank_unquantized,
    param_groups,
    trainable_params,
)
from vram.model.architecture import ModelSpec, Role
from vram.result import (
    Bucket,
    BucketName,
    Estimate,
    LineItem,
    MomentBytes,
    ParamCounts,
    PeakBytes,
    Phase,
)
from vram.setup import Offload, Sharding, TrainingSetup
from vram.sharding import fsdp2
from vram.sharding.deepspeed_zero import (
    gathers_copies,
    ipg_bucket_bytes,
    ipg_buckets,
    linear_wrapper,
    live_parameters,
    persistence_threshold,
    reduce_bucket_values,
    runs_deepspeed_zero,
    runs_deepspeed_zero3,
    step_copies_bytes,
)
from vram.stacks.profile import StackProfile, profile_for
from vram.step.draft import Alive, ItemDraft, ItemGroup, line_items
from vram.units import FP32_BYTES as FP32

QUANTIZED = (Storage.NF4, Storage.NF4_DQ, Storage.INT8)


@dataclass(frozen=True, slots=True)
class Shards:
    """How many ways weights, gradients and optimizer state are split (ZeRO paper, §5)."""

    weights: int
    gradients: int
    optimizer: int


def shards_of(setup: TrainingSetup) -> Shards:
    n = setup.n_gpus
    if setup.sharding is Sharding.ZERO3:
        return Shards(n, n, n)
    if setup.sharding is Sharding.ZERO2:
        return Shards(1, n, n)
    if setup.sharding is Sharding.ZERO1:
        return Shards(1, 1, n)
    return Shards(1, 1, 1)


def _grad_bytes(group: ParamGroup) -> int:
    """Gradients take the parameter's dtype (PyTorch accumulates .grad like the param)."""
    if group.storage in (Storage.FP32, Storage.BF16):
        return int(group.n_params * STORAGE_BYTES[group.storage])
    return group.n_params * FP32


_bytes_of: Callable[[Alive], int] = attrgetter("bytes")


@dataclass(slots=True)
class Moment:
    """What is alive at one point of the step, beyond weights and optimizer state."""

    phase: Phase
    label: str
    gradient_bytes: int
    activation_items: list[Alive] = field(default_factory=list)
    #: Gradients that exist only in this moment (a unit's whole gradients before reduction).
    extra_gradient_items: list[Alive] = field(default_factory=list)
    #: Parameters that exist only in this moment (DeepSpeed ZeRO-3's gathered ones).
    weight_items: list[LineItem] = field(default_factory=list)
    #: What FSDP2 holds unsharded at this moment (`vram.sharding.fsdp2`): gathered parameters
    #: (`weights.*`) and unsharded gradients and reduce buffers (`gradients.*`).
    in_flight_items: list[LineItem] = field(default_factory=list)

    # (sums over `map(_bytes_of, ...)`: no generator frame; estimate() is on the hot path)
    @property
    def weight_bytes(self) -> int:
        return sum(map(_bytes_of, self.weight_items))

    @property
    def in_flight_bytes(self) -> int:
        return sum(map(_bytes_of, self.in_flight_items))

    @property
    def gradients_total(self) -> int:
        return self.gradient_bytes + sum(map(_bytes_of, self.extra_gradient_items))

    @property
    def activation_bytes(self) -> int:
        return sum(map(_bytes_of, self.activation_items))

    def figures(self) -> tuple[int, int, int, int]:
        """(gradients_total, activation_bytes, in_flight_bytes, weight_bytes): the four
        properties above in one call (`_step_peak` reads all four of every moment)."""
        return (self.gradient_bytes + sum(map(_bytes_of, self.extra_gradient_items)),
                sum(map(_bytes_of, self.activation_items)),
                sum(map(_bytes_of, self.in_flight_items)),
                sum(map(_bytes_of, self.weight_items)))


# ------------------------------------------------------------------------------------------
# Weights
# ------------------------------------------------------------------------------------------


def _weight_items(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                  groups: list[ParamGroup], shards: Shards) -> tuple[list[LineItem], int]:
    """The parameters on each GPU (and what offload moves to the host)."""
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
        # DeepSpeed's coordinator, not FSDP's units: see `_deepspeed_live_items`
        items.extend(_deepspeed_persistent_items(setup, groups, shards))
        return items, host
    gathered = 0 if profile.fsdp2 else _gathered_bytes(model, setup, groups)
    if gathered or (offload_params and not profile.fsdp2):
        gathered = max(gathered, 2 * sum(g.bytes for g in groups) // max(1, model.n_layers))
        items.append(LineItem(
            key="weights.gathered", label="gathered layers (ZeRO-3/FSDP, with prefetch)",
            formula="2 × one layer's full parameters (or a layer and the head)",
            inputs={"layers": 2}, bytes=gathered, source="PyTorch FSDP forward/backward prefetch",
        ))
    if (profile.fsdp_keeps_frozen_unsharded and setup.sharding is Sharding.ZERO3
            and setup.n_gpus > 1 and setup.trains_adapters and not offload_params):
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
#: ZeRO-3 still holds the parameters it keeps for reuse (`_moments` labels them).
_FORWARD_GATHERED = frozenset({"the last layer's forward", "end of forward",
                               "the output cast to fp32", "the loss",
                               "the top layer's backward"})
#: Later in the backward only the module running and the prefetch are gathered.
_ONE_MODULE_GATHERED = frozenset({"the first layer's backward", "the embedding's backward"})


def _deepspeed_live_items(model: ModelSpec, setup: TrainingSetup, groups: list[ParamGroup]
                          ) -> dict[str, list[LineItem]]:
    """The whole parameters DeepSpeed ZeRO-3 holds gathered, by moment label
    (`vram.sharding.deepspeed_zero.live_parameters`): from the end of the forward to the top layer's
    backward, the last max_reuse_distance / 2 parameters of the forward and the prefetch;
    later, the module running and the prefetch; none at the optimizer step."""
    if not runs_deepspeed_zero3(setup) or not gathers_copies(setup):
        return {}
    persistent_values, persistent_bytes = _persistent_values_and_bytes(setup, groups)
    values = sum(g.n_params for g in groups) - persistent_values
    if values <= 0:
        return {}
    per_value = (sum(g.bytes for g in groups) - persistent_bytes) / values
    largest = max(_largest_matrix(model, profile_for(setup)), model.vocab_size * model.hidden_size)
    retained = 0
    if not linear_wrapper(setup):
        # checkpointed layers keep nothing for backward; the head is never checkpointed
        keys = ("head",) if setup.grad_ckpt else ("linears", "head")
        retained = sum(g.n_params for g in groups if g.key in keys)
    live = live_parameters(setup, values, largest, retained)
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
    if setup.sharding is not Sharding.ZERO3 or setup.n_gpus == 1 or not model.n_layers:
        return 0
    per_layer = sum(g.bytes for g in groups
                    if g.key in ("linears", "expert_banks", "norms")) // model.n_layers
    head = sum(g.bytes for g in groups if g.key == "head")
    return max(2 * per_layer, per_layer + head)


_ATTENTION_ROLES = (Role.Q, Role.K, Role.V, Role.QKV, Role.O)


class Stage(Enum):
    """Where in the step weight working copies are counted (what is alive differs)."""

    FORWARD = "forward"  # the forward and the loss's forward, inside autocast
    LAYERS_FORWARD = "layers' forward"  # inside the last layer: the head has not run yet
    LOSS = "loss"  # the loss's backward, before the head's
    TOP_LAYER = "top layer"  # the layers' backward, once the head's backward ran
    FIRST_LAYER = "first layer"  # the first layer's backward: the others' copies are freed
    #: the first layer's attention backward: its MLP's copies are freed too (the trace)
    FIRST_ATTENTION = "first layer's attention"

    # Members are singletons: hash them by identity, in C (Enum's hashes the name in Python,
    # and every moment looks its stage up).
    __hash__ = object.__hash__


def _working_items(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
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
    if any(g.storage in QUANTIZED for g in groups):
        # the head's matrix is dequantized only between its forward and its backward
        head_out = stage in (Stage.LAYERS_FORWARD, Stage.TOP_LAYER, Stage.FIRST_LAYER,
                             Stage.FIRST_ATTENTION)
        biggest = _largest_matrix(model, profile, with_head=not head_out)
        # bitsandbytes dequantizes to the compute dtype (fp32 on an fp32 recipe); Lightning
        # quantized from fp16, so there an fp16 dequantization and its cast coexist.
        compute = profile.precision.dequantized  # bnb's compute dtype
        per_param = 2 + compute if profile.dequantizes_via_fp16 else compute
        items.append(LineItem(
            key="activations.dequant", label="dequantized weight of the Linear being computed",
            formula=f"{per_param} B × largest quantized matrix", inputs={"params": biggest},
            bytes=per_param * biggest, source="bitsandbytes MatMul4Bit dequantizes per call"
            + (" (fp16, then cast: Lightning's BitsandbytesPrecision)" if per_param == 4
               else ""),
        ))
    return items


def _autocast_copies(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                     groups: list[ParamGroup], stage: Stage) -> int:
    """16-bit casts of fp32 Linear weights under autocast.

    Autocast caches the casts of trainable leaf weights until the autocast region ends (the
    forward and loss), whatever checkpointing does; a Linear also keeps the cast it multiplied
    by for its input gradient, so without checkpointing every cast lives into backward, and
    with it only the recomputed layer's (none while the loss runs its backward: the trace).
    Frozen weights are not cached.
    """
    if not profile.precision.casts_weights:
        return 0
    # A tied head multiplies by the embedding matrix: that is the weight autocast casts.
    head_keys = ("head",) if any(g.key == "head" for g in groups) else (
        ("embedding",) if model.tied_embeddings and model.head_kind.value == "lm" else ())
    if stage in (Stage.TOP_LAYER, Stage.FIRST_LAYER, Stage.FIRST_ATTENTION):
        head_keys = ()  # the head's backward ran: its cast is gone
    if stage is Stage.LAYERS_FORWARD:
        head_keys = ()  # the head has not run: no cast of it exists yet (the trace)
        stage = Stage.FORWARD
    dense = [g for g in groups if g.key in ("linears", "expert_banks", *head_keys)
             and g.storage is Storage.FP32]
    layers = max(1, model.n_layers)

    def kept(group: ParamGroup) -> int:
        whole = 2 * group.n_params
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
               if ln.role in _ATTENTION_ROLES)


def _down_params(model: ModelSpec) -> int:
    """Weights of every layer's dense down projection (MoE banks are counted apart)."""
    return sum(st.count * ln.weight_params for st in model.stacks for ln in st.linears
               if ln.role is Role.DOWN and ln.copies == 1)


def _largest_trainable(model: ModelSpec, setup: TrainingSetup,
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


def _largest_matrix(model: ModelSpec, profile: StackProfile, *, with_head: bool = True) -> int:
    """The largest quantized matrix (bitsandbytes dequantizes one at a time)."""
    biggest = max((ln.d_in * ln.d_out for stack in model.stacks for ln in stack.linears
                   if not leaves_bank_unquantized(ln, profile)), default=0)
    if profile.quantizes_head and with_head:
        biggest = max(biggest, model.vocab_size * model.hidden_size)
    return biggest


# ------------------------------------------------------------------------------------------
# Optimizer state
# ------------------------------------------------------------------------------------------


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


def _optimizer_part(model: ModelSpec, groups: list[ParamGroup], setup: TrainingSetup,
                    profile: StackProfile, shards: Shards) -> OptimizerPart:
    master_full = _master_bytes(groups, profile)
    state = optimizer_state(groups, setup, fused=profile.fused_optimizer,
                            state_dtype_bytes=profile.precision.states,
                            largest_param=_largest_trainable(model, setup, groups),
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
            label=f"{'fp32' if per_param == FP32 else '16-bit'} master weights (the optimizer's "
                  "own copy)",
            formula=f"{per_param} B × trainable params" + divided, inputs={}, bytes=master,
            source="DeepSpeed bf16/fp16 optimizer; DeepSpeed ZeRO clones its master partition "
                   "(deepspeed/runtime/zero/stage3.py@v0.18.4#L988-L990)",
        ))
    return OptimizerPart(items, state, paged, 0, state.step_temp_bytes // shards.optimizer)


# ------------------------------------------------------------------------------------------
# Gradients and the moments of the step
# ------------------------------------------------------------------------------------------


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


def _fsdp2_gradient_part(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                         groups: list[ParamGroup], total: int, per_layer: int,
                         unit: int) -> GradientPart:
    """FSDP2: the root's sharded gradients (embedding, head) exist only after its
    post-backward, at the end; the head's gradient waits unsharded until then (an in-flight
    item) and a tied embedding's in autograd's buffer; the embedding's is built unsharded."""
    units = fsdp2.units(model, setup, profile, groups)
    # A head unit of its own reduces its gradient before the blocks' backward.
    own_head = units.separate
    root = sum(_grad_bytes(g) for g in groups if g.trainable and g.key in fsdp2.ROOT_KEYS
               and not (own_head and g.key == "head"))
    head = sum(_grad_bytes(g) for g in groups if g.trainable and g.key == "head") \
        if own_head else 0
    embedding = next((g for g in groups if g.key == "embedding" and g.trainable), None)
    built = embedding.n_params * fsdp2.gather_bytes(embedding, profile) if embedding else 0
    return GradientPart(total, head // setup.n_gpus, 0, built, per_layer, 0, 0, 0, unit,
                        tied=fsdp2.tied_pending_bytes(model, groups, profile),
                        pending=root // setup.n_gpus, fsdp2=units)


def _gradient_part(model: ModelSpec, setup: TrainingSetup, groups: list[ParamGroup],
                   shards: Shards, profile: StackProfile) -> GradientPart:
    trainable = [g for g in groups if g.trainable]
    full = sum(_grad_bytes(g) for g in trainable)
    by_key = {g.key: _grad_bytes(g) for g in trainable}
    # Only an LM head multiplies by a tied embedding; a classifier's embedding is used once.
    tied_lm = model.tied_embeddings and model.head_kind.value == "lm"
    head = by_key.get("head", by_key.get("embedding", 0) if tied_lm else 0)
    untied_embedding = by_key.get("embedding", 0) if not tied_lm else 0
    layer_grads = by_key.get("linears", 0) + by_key.get("norms", 0) + by_key.get("lora", 0)
    per_layer = layer_grads // max(1, model.n_layers)
    linears = next((g for g in trainable if g.key == "linears"), None)
    largest = 0
    largest_attention = 0
    banks = {Role.GATE_UP: 0, Role.DOWN: 0}
    experts = 0
    if linears is not None:
        grad_bytes = _grad_bytes(linears) // max(1, linears.n_params)
        largest = grad_bytes * max(ln.weight_params for st in model.stacks for ln in st.linears)
        largest_attention = grad_bytes * max(
            (ln.weight_params for st in model.stacks for ln in st.linears
             if ln.role in _ATTENTION_ROLES), default=0)
        for ln in (ln for st in model.stacks for ln in st.linears if ln.copies > 1):
            if ln.role in banks:
                banks[ln.role] = grad_bytes * ln.weight_params
                experts = ln.copies
    n = shards.gradients
    ddp = full if setup.sharding is Sharding.DDP else 0
    offloaded = setup.offload in (Offload.OPTIMIZER, Offload.PARAMS_OPTIMIZER)
    in_backward = steps_in_backward(setup)
    # Stepping in backward frees each gradient as it is made: nothing waits for a reduction.
    unit = per_layer if (n > 1 or offloaded) and not in_backward else 0
    embedding = by_key.get("embedding", 0)
    if offloaded:
        # ZeRO-Offload and FSDP CPU offload move the sharded gradients to host memory (FSDP2
        # still gathers and reduces on the GPU).
        return GradientPart(0, 0, 0, 0, 0, ddp, full // n, 0, unit, fsdp2=(
            fsdp2.units(model, setup, profile, groups) if profile.fsdp2 else None))
    tied = embedding if tied_lm and "head" not in by_key and not in_backward \
        else 0
    if profile.fsdp2 and not in_backward:
        return _fsdp2_gradient_part(model, setup, profile, groups, full // n, per_layer // n,
                                    unit)
    return GradientPart(full // n, (head - tied) // n, untied_embedding // n, embedding // n,
                        per_layer // n, ddp, 0, largest, unit, tied=tied // n,
                        pending=untied_embedding // n + tied // n,
                        largest_in_attention=largest_attention,
                        # a unit's gradients are whole until reduce-scattered
                        bank_gate_up=banks[Role.GATE_UP] // (1 if unit else n),
                        bank_down=banks[Role.DOWN] // (1 if unit else n), bank_experts=experts)


# Built on every estimate: not `frozen` (a frozen dataclass sets each field through
# `object.__setattr__`, four times slower to build); nothing assigns to it once built.
@dataclass(slots=True)
class StepContext:
    """What every candidate moment of the step reads (built once by `_moments`)."""

    model: ModelSpec
    setup: TrainingSetup
    plan: act.ActivationPlan
    grads: GradientPart
    #: The weight working copies alive at each stage (see `_working_items`).
    working: dict[Stage, list[LineItem]]
    step_temp_bytes: int
    #: The optimizer steps inside backward (one parameter's gradient at a time).
    in_backward: bool
    #: Gradients accumulated over earlier micro-batches, alive through the whole step.
    accumulated_bytes: int
    #: What the layers keep for backward, as the loss and the backward see it.
    layers: list[Alive]
    #: The causal mask as the backward sees it (none unless checkpointing recomputes with it).
    mask: list[Alive]
    #: The same during the forward (with the causal mask, which backward may have freed).
    forward_layers: list[Alive]
    #: The previous step's bitsandbytes inputs, still held in the forward (LitGPT's loop).
    previous: list[Alive]
    #: An MoE layer's bank gradient write, a candidate for a layer's backward peak.
    bank: BankWrite | None
    #: The inputs of the head's items (one dict: `ItemDraft.line_item` copies it).
    head_inputs: dict[str, int]
    #: A tied embedding's gradient waiting in autograd's buffer through the backward.
    tied_pending: list[Alive]
    #: The unit in backward holding its gradients whole (sharded gradients).
    reducing: list[Alive]


_HEAD_SOURCE = "see vram.memory.head.head_activations"


def _step_context(model: ModelSpec, setup: TrainingSetup, plan: act.ActivationPlan,
                  grads: GradientPart, working: dict[Stage, list[LineItem]],
                  step_temp: int) -> StepContext:
    in_backward = steps_in_backward(setup)
    previous: list[Alive] = [ItemDraft(
        key="activations.previous_step", label="previous step's bitsandbytes inputs",
        formula="tokens × Σ layers × MatMul4Bit inputs (ctx attributes outlive backward)",
        inputs={"tokens": plan.tokens}, bytes=plan.previous_step_bytes,
        source="litgpt/finetune/lora.py fit() keeps `loss` and `logits` until reassigned",
    )] if plan.previous_step_bytes else []
    saved = _saved_layer_items(model, setup, plan)  # the same in the forward and the backward
    mask = _mask_items(setup, plan, forward=False)
    return StepContext(
        model=model, setup=setup, plan=plan, grads=grads, working=working,
        step_temp_bytes=step_temp, in_backward=in_backward,
        accumulated_bytes=grads.total if setup.grad_accum > 1 and not in_backward else 0,
        layers=mask + saved, mask=mask,
        forward_layers=_mask_items(setup, plan, forward=True) + saved, previous=previous,
        bank=_bank_write(model, setup, plan, grads) if not in_backward else None,
        head_inputs={"tokens": plan.tokens, "vocab": model.vocab_size},
        tied_pending=_tied_pending(grads, model.vocab_size),
        reducing=_reducing(grads, setup),
    )


def _moments(model: ModelSpec, setup: TrainingSetup, plan: act.ActivationPlan,
             grads: GradientPart,
             working: dict[Stage, list[LineItem]], step_temp: int) -> list[Moment]:
    """The candidate peaks of one step (see the module docstring), in step order. `working`
    holds the weight copies alive at each stage."""
    c = _step_context(model, setup, plan, grads, working, step_temp)
    # Order matters for ties: the allocator reaches a peak at its first moment.
    return _with_fsdp2(c, [
        *_last_layer_forward(c), _forward_end(c), *_output_cast(c), _loss(c),
        _top_layer_backward(c), _first_layer_backward(c), _embedding_backward(c),
        _optimizer_step(c)])


#: What FSDP2 holds unsharded at each moment of the step (`vram.sharding.fsdp2`).
_FSDP2_IN_FLIGHT = {
    "the last layer's forward": fsdp2.forward_block,
    "end of forward": fsdp2.forward_end,
    "the output cast to fp32": fsdp2.after_forward,
    "the loss": fsdp2.loss_backward,
    "the top layer's backward": fsdp2.top_block_backward,
    "the first layer's backward": fsdp2.first_block_backward,
    "the embedding's backward": fsdp2.embedding_backward,
}


def _with_fsdp2(c: StepContext, moments: list[Moment]) -> list[Moment]:
    """Under FSDP2, each moment with what is unsharded then, and one moment more: the last
    block's all-gather, with the blocks before it saved (three blocks' parameters alive)."""
    units = c.grads.fsdp2
    if units is None:
        return moments
    for moment in moments:
        in_flight = _FSDP2_IN_FLIGHT.get(moment.label)
        moment.in_flight_items = in_flight(units) if in_flight else []
    layers = max(1, c.model.n_layers)
    mask: list[Alive] = [i for i in c.forward_layers
                         if not isinstance(i, ItemGroup) and i.key == "activations.mask"]
    saved = sum(i.bytes for i in c.forward_layers if i not in mask) * (layers - 1) // layers
    gather = _gather_moment(c, units, mask, saved)
    return [gather, *_with_inner_blocks(c, units, moments)]


def _gather_moment(c: StepContext, units: fsdp2.Fsdp2Units, mask: list[Alive],
                   saved: int) -> Moment:
    """While the last block is all-gathered, with the blocks before it saved."""
    layers = max(1, c.model.n_layers)
    return Moment(Phase.FORWARD, "the last block's all-gather", c.accumulated_bytes, [
        *mask,
        *c.working[Stage.LAYERS_FORWARD],
        LineItem(key="activations.blocks_before_last", label="what the blocks before the last "
                 "keep for backward", formula="(layers − 1) / layers × the layers' saved tensors",
                 inputs={"layers": layers}, bytes=saved, source="see vram.memory.activations"),
        *c.previous], in_flight_items=fsdp2.forward_gather(units))


def _one_layer_kept(c: StepContext) -> LineItem:
    """What one layer keeps for its backward: its checkpointed input, or its saved tensors."""
    plan, layers = c.plan, max(1, c.model.n_layers)
    kept = plan.checkpointed_bytes // layers if c.setup.grad_ckpt else plan.layer_bytes_max
    return LineItem(key="activations.one_layer_kept", label="one more layer's kept tensors",
                    formula="checkpointed inputs / layers, or the largest layer's saved tensors",
                    inputs={"layers": layers}, bytes=kept, source="see vram.memory.activations")


def _with_inner_blocks(c: StepContext, units: fsdp2.Fsdp2Units,
                       moments: list[Moment]) -> list[Moment]:
    """Under FSDP2 the blocks between the top and the first differ from both: each has the next
    block down all-gathered beside it (the first has none left to prefetch) and the previous
    block's reduce-scatter buffer (the top has none). Live bytes in block k are linear in k, so
    the two ends of that run stand for it: the block below the top (one layer's kept tensors
    fewer than the top's backward, the top's gradients done) and the second block (one more
    than the first's, the second's gradients not yet done)."""
    layers = c.model.n_layers
    by_label = {m.label: m for m in moments}
    top = by_label.get("the top layer's backward")
    first = by_label.get("the first layer's backward")
    if layers < 3 or top is None or first is None or c.bank is not None or units.separate:
        return moments  # the embedding and head units' layout is traced from two blocks
    kept = _one_layer_kept(c)
    done = 0 if c.in_backward else c.grads.per_layer
    inner = []
    if layers >= 4:
        layer_items = {id(i) for i in c.layers}
        mask = {id(i) for i in c.mask}
        rest = [i for i in top.activation_items if id(i) not in layer_items]
        below = sum(i.bytes for i in c.layers if id(i) not in mask) - kept.bytes
        inner.append(Moment(
            Phase.BACKWARD, "the block below the top's backward", top.gradient_bytes + done, [
                *c.mask,
                LineItem(key="activations.layers_below_top", label="what the layers below "
                         "the top keep", formula="every layer's kept tensors − one layer's",
                         inputs={"layers": layers}, bytes=max(0, below),
                         source="see vram.memory.activations"), *rest],
            top.extra_gradient_items,
            in_flight_items=fsdp2.below_top_block_backward(units)))
    inner.append(Moment(
        Phase.BACKWARD, "the second layer's backward", max(c.accumulated_bytes,
                                                           first.gradient_bytes - done),
        [*first.activation_items, kept], first.extra_gradient_items,
        in_flight_items=fsdp2.second_block_backward(units)))
    index = moments.index(first)
    return [*moments[:index], *inner, *moments[index:]]


def _last_layer_forward(c: StepContext) -> list[Moment]:
    """Inside the last layer's forward: every layer's saved tensors, and the running layer's
    attention scores (eager/math attention materializes s × s scores). None without scores."""
    plan = c.plan
    if not plan.forward_transient_bytes:
        return []
    return [Moment(Phase.FORWARD, "the last layer's forward", c.accumulated_bytes, [
        *c.forward_layers, *c.working[Stage.LAYERS_FORWARD],
        ItemDraft(key="activations.layer_forward", label="attention scores of the layer running",
                  formula="heads × s × (q·kᵀ + masked scores [+ probabilities, checkpointed])",
                  inputs={"tokens": plan.tokens}, bytes=plan.forward_transient_bytes,
                  source="eager/math attention materializes s × s scores"),
        *c.previous])]


def _forward_end(c: StepContext) -> Moment:
    """The end of the forward: every saved activation, the head's output and what it keeps."""
    plan = c.plan
    return Moment(Phase.FORWARD, "end of forward", c.accumulated_bytes, [
        *c.forward_layers, *c.working[Stage.FORWARD],
        ItemDraft(key="activations.head", label=plan.head.label, formula=plan.head.formula,
                  inputs=c.head_inputs, bytes=plan.head_saved_bytes, source=_HEAD_SOURCE),
        *c.previous])


def _output_cast(c: StepContext) -> list[Moment]:
    """Right after a stack casts the model's output to fp32 (Lightning Fabric); none else."""
    plan = c.plan
    if not plan.head_cast_bytes:
        return []
    return [Moment(Phase.FORWARD, "the output cast to fp32", c.accumulated_bytes, [
        *c.forward_layers,
        ItemDraft(key="activations.head", label=plan.head.label, formula=plan.head.formula,
                  inputs=c.head_inputs, bytes=plan.head_cast_bytes,
                  source="lightning/fabric/wrappers.py _FabricModule.forward convert_output"),
        *c.previous])]


def _loss(c: StepContext) -> Moment:
    """The loss's forward and backward: logits, log-softmax and their gradients at their
    largest, with every layer's saved tensors still alive."""
    plan = c.plan
    return Moment(Phase.BACKWARD, "the loss", c.accumulated_bytes, [
        *c.layers, *c.working[Stage.LOSS],
        ItemDraft(key="activations.loss", label="logits, loss and their gradients",
                  formula=plan.head.formula, inputs=c.head_inputs, bytes=plan.head_peak_bytes,
                  source=_HEAD_SOURCE)])


def _reducing(grads: GradientPart, setup: TrainingSetup) -> list[Alive]:
    """With sharded gradients, the unit in backward holds its gradients whole until they are
    reduce-scattered."""
    if not grads.unsharded_unit or grads.fsdp2 is not None:
        return []
    return [ItemDraft(
        key="gradients.unsharded_unit", label="whole gradients of the unit being reduced",
        formula="one layer's gradients before reduce-scatter",
        inputs={"gpus": setup.n_gpus}, bytes=grads.unsharded_unit,
        source="FSDP / ZeRO-2,3 reduce-scatter after each unit's backward",
    )]


def _top_layer_backward(c: StepContext) -> Moment:
    """The top layer's backward: the head's gradient exists while every layer's activations
    are still held (under checkpointing, the top layer is recomputed). An MoE layer with
    trained banks peaks at its bank's gradient write, not at its MLP's start; its attention's
    backward can still be larger."""
    grads, plan, setup = c.grads, c.plan, c.setup
    # The layer in backward holds its gradients whole (the reduce item) when they are sharded.
    layer_grads = 0 if grads.unsharded_unit else grads.per_layer
    # Optimizer-in-backward keeps one parameter's gradient at a time (the head's is largest).
    top_grads = grads.head if c.in_backward else max(c.accumulated_bytes,
                                                     grads.head + layer_grads)
    head_left = ItemDraft(key="activations.head_left", label="logits kept into backward",
                          formula="what the loss leaves for the layers' backward",
                          inputs=c.head_inputs, bytes=plan.head_kept_bytes, source=_HEAD_SOURCE)
    top = Moment(Phase.BACKWARD, "the top layer's backward", top_grads, [
        *c.layers, *c.working[Stage.TOP_LAYER], head_left,
        _backward_item(setup, plan), *c.tied_pending], c.reducing)
    if c.bank is None:
        return top
    return _with_bank_write(top, plan, Moment(
        Phase.BACKWARD, "the top layer's backward",
        max(c.accumulated_bytes, grads.head + c.bank.done_in_layer), [
            *c.layers, *c.working[Stage.TOP_LAYER], head_left,
            c.bank.item(plan.recompute_bytes if setup.grad_ckpt else 0, plan),
            *c.tied_pending]))


def _first_layer_backward(c: StepContext) -> Moment:
    """Late backward: every gradient exists but the embedding's and the one being written
    (the layer's largest, whole until it becomes .grad); one layer's activations remain."""
    grads, plan, setup = c.grads, c.plan, c.setup
    building = 0 if grads.unsharded_unit or c.in_backward else (
        grads.largest_in_attention if plan.backward_peak_in_attention
        else grads.largest_in_layer)
    late_grads = grads.head if c.in_backward else max(
        c.accumulated_bytes, grads.total - grads.pending - building
        - (grads.per_layer if grads.unsharded_unit else 0))
    first_layer = plan.recompute_bytes if setup.grad_ckpt else plan.layer_bytes_max
    late_stage = Stage.FIRST_ATTENTION if plan.backward_peak_in_attention else Stage.FIRST_LAYER
    mask = c.mask
    late = Moment(Phase.BACKWARD, "the first layer's backward", late_grads, [
        *c.working[late_stage], *mask,
        ItemDraft(key="activations.backward", label="first layer's activations and gradients",
                  formula="one layer's saved tensors + its backward buffers + the gradient "
                         "being written", inputs={"tokens": plan.tokens},
                  bytes=first_layer + plan.backward_transient_bytes + building,
                  source="per-layer backward"), *c.tied_pending], c.reducing)
    if c.bank is None:
        return late
    return _with_bank_write(late, plan, Moment(
        Phase.BACKWARD, "the first layer's backward",
        max(c.accumulated_bytes, grads.total - grads.pending
            - grads.per_layer + c.bank.done_in_layer), [
            *c.working[Stage.FIRST_LAYER], *mask, c.bank.item(first_layer, plan),
            *c.tied_pending]))


def _embedding_backward(c: StepContext) -> Moment:
    """The embedding's gradient is built last (embedding_dense_backward), as a new tensor that
    becomes an untied embedding's .grad or is added (in place) into a tied one's."""
    grads = c.grads
    embedding_grads = grads.total - grads.pending
    vocab = c.model.vocab_size
    return Moment(Phase.BACKWARD, "the embedding's backward", 0 if c.in_backward else max(
        c.accumulated_bytes, embedding_grads), [
        ItemDraft(key="activations.embedding_grad", label="embedding gradient being built",
                  formula="vocab × hidden × grad bytes", inputs={"vocab": vocab},
                  bytes=grads.embedding, source="aten embedding_dense_backward"),
        *c.tied_pending])


def _optimizer_step(c: StepContext) -> Moment:
    """The optimizer step: every gradient, and the step's temporaries."""
    items: list[Alive] = []
    if c.step_temp_bytes:
        items.append(ItemDraft(
            key="activations.optimizer_temp", label="optimizer step temporaries",
            formula="one state-sized list (foreach AdamW's sqrt(v))", inputs={},
            bytes=c.step_temp_bytes, source="torch/optim/adamw.py _multi_tensor_adamw"))
    return Moment(Phase.OPTIMIZER_STEP, "the optimizer step",
                  0 if c.in_backward else c.grads.total, items)


def _with_bank_write(dense: Moment, plan: act.ActivationPlan, bank: Moment) -> Moment:
    """A layer's backward with trained MoE banks: the bank's gradient write replaces the MLP's
    start as a candidate; the attention's backward (when it is larger) stays one."""
    if not plan.backward_peak_in_attention:
        return bank
    return max(dense, bank, key=lambda m: m.gradients_total + m.activation_bytes)


@dataclass(frozen=True, slots=True)
class BankWrite:
    """An MoE layer's backward when its gate/up expert bank's gradient is written (see
    `activations.MoeBackward`): bank-sized gradient buffers, and the layer's gradients made
    already. With sharded gradients both are whole: the layer is not reduced yet."""

    buffers: int  # bank-sized gradient tensors alive (not .grad yet)
    done_in_layer: int  # the layer's gradients already made (down_proj's bank, grouped_mm)
    casts_released: int  # autocast's bf16 copies of the experts already through backward
    loop: bool

    def item(self, saved: int, plan: act.ActivationPlan) -> ItemDraft:
        freed = plan.moe_freed_minus_inflight_bytes or 0
        if self.loop:
            formula = ("saved − 2/E of the experts' + gradient of the layer's input + "
                       "gate/up bank buffer + the next expert's bank-sized select_backward + "
                       "its weight gradient + down bank buffer")
            source = "transformers eager experts loop: autograd sums select_backward per expert"
        else:
            formula = ("saved − the experts' (but gathered inputs and outputs) + gradient of "
                       "the gate/up output + the gate/up bank gradient")
            source = "transformers grouped_mm experts: the bank's gradient in one tensor"
        return ItemDraft(
            key="activations.backward", label="an MoE layer's backward, at its bank gradient",
            formula=formula, inputs={"tokens": plan.tokens},
            bytes=max(0, saved - freed + self.buffers - self.casts_released), source=source)


def _bank_write(model: ModelSpec, setup: TrainingSetup, plan: act.ActivationPlan,
                grads: GradientPart) -> BankWrite | None:
    """The MoE candidate for a layer's backward peak, when expert banks train in HF code."""
    if plan.moe_freed_minus_inflight_bytes is None or not grads.bank_gate_up:
        return None
    if not plan.moe_loop:  # grouped_mm: down_proj's bank gradient is .grad already
        return BankWrite(grads.bank_gate_up, grads.bank_down, 0, loop=False)
    experts = max(1, grads.bank_experts)
    buffers = 2 * grads.bank_gate_up + grads.bank_gate_up // experts + grads.bank_down
    casts = 0
    if profile_for(setup).precision.casts_weights:
        # autocast casts each expert's slice (not a leaf: never cached) and the Linear keeps
        # the cast; the two experts through backward have dropped theirs
        bank_params = max(sum(ln.weight_params for ln in st.linears if ln.copies > 1)
                          for st in model.stacks)  # one layer's banks
        casts = 2 * bank_params * 2 // experts
    return BankWrite(buffers, 0, casts, loop=True)


def _tied_pending(grads: GradientPart, vocab: int) -> list[Alive]:
    if not grads.tied:
        return []
    return [ItemDraft(
        key="activations.tied_grad_pending", label="the head's gradient of the tied embedding",
        formula="vocab × hidden × grad bytes (in autograd's input buffer, not yet a .grad)",
        inputs={"vocab": vocab}, bytes=grads.tied,
        source="autograd InputBuffer: a leaf used twice gets one .grad when both arrive")]


def _backward_item(setup: TrainingSetup, plan: act.ActivationPlan) -> ItemDraft:
    return ItemDraft(
        key="activations.backward", label="backward of the top layer"
        + (" (recomputed)" if setup.grad_ckpt else ""),
        formula="one layer's activations (checkpointing) + its gradient buffers",
        inputs={"tokens": plan.tokens},
        bytes=plan.recompute_bytes + plan.backward_transient_bytes,
        source="per-layer backward; checkpointing recomputes one layer",
    )


def _mask_items(setup: TrainingSetup, plan: act.ActivationPlan, *,
                forward: bool) -> list[Alive]:
    """The causal mask the layers share, beside what they keep (`_saved_layer_items`)."""
    return [ItemDraft(
        key="activations.mask", label="causal attention mask (eager/math attention)",
        formula="batch × s × s × e (one per window kind)", inputs={"seq": setup.seq_len},
        bytes=plan.mask_bytes, source="transformers masking_utils: a 4-D additive mask",
    )] if plan.mask_bytes and (forward or setup.grad_ckpt) else []


def _saved_layer_items(model: ModelSpec, setup: TrainingSetup, plan: act.ActivationPlan,
                       ) -> list[Alive]:
    tokens = plan.tokens
    if setup.grad_ckpt:
        if not plan.checkpointed_bytes:
            return []
        return [ItemDraft(
            key="activations.checkpoints", label="checkpointed layer inputs",
            formula="layers × tokens × h × residual bytes",
            inputs={"layers": model.n_layers, "tokens": tokens, "h": model.hidden_size},
            bytes=plan.checkpointed_bytes,
            source="torch.utils.checkpoint keeps each layer's input",
        )]
    if setup.offload is Offload.ACTIVATIONS:
        return [ItemDraft(key="activations.kept", label="one layer kept on the GPU",
                          formula="largest layer", inputs={}, bytes=plan.stored_layers_bytes,
                          source="activation offloading")]
    layers = plan.layers
    # One group: the per-term items (and their f-strings) are built for the peak only.
    return [ItemGroup(
        plan.stored_layers_bytes,  # tokens × Σ layers × Σ terms, as the items below
        lambda: [
            LineItem.assemble(
                key, label, formula,
                {"tokens": tokens, "layers": layer.count,
                 "per_token_bytes": term.bytes_per_token},
                term.bytes_per_token * tokens * layer.count,
                "autograd saved tensors; see vram.memory.activations",
            )
            for layer in layers
            for term, (key, label, formula) in zip(layer.terms, layer.item_texts, strict=True)
        ])]


# ------------------------------------------------------------------------------------------
# The estimate
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ZeroBuffers:
    """DeepSpeed ZeRO's own device buffers (`vram.sharding.deepspeed_zero`)."""

    preallocated_gradients: bool = False
    bucket_bytes: int = 0
    step_copies_bytes: int = 0


def _deepspeed_zero(setup: TrainingSetup, groups: list[ParamGroup], shards: Shards,
                    grads: GradientPart) -> ZeroBuffers:
    """DeepSpeed's engine: the IPG reduce bucket(s) on the GPU (ZeRO-1/2/3, offloaded or
    not); under ZeRO-3 with the gradients on the GPU, the flat gradient partition (allocated at
    init) and the step's flattened and master-dtype gradient copies."""
    trainable = trainable_params(groups)
    if not runs_deepspeed_zero(setup) or not trainable:
        return ZeroBuffers()
    policy = profile_for(setup).precision
    grad_dtype = policy.gradients
    bucket = ipg_bucket_bytes(setup, grad_dtype)
    if setup.sharding is not Sharding.ZERO3 or grads.host or not grads.total:
        return ZeroBuffers(False, bucket)
    master_dtype = policy.master or grad_dtype
    partition = trainable // shards.gradients
    return ZeroBuffers(True, bucket, step_copies_bytes(partition, grad_dtype, master_dtype))


def _slack_item(slack: int) -> LineItem:
    return LineItem.assemble("overhead.allocator", "caching-allocator slack (fragmentation)",
                             "reserved − allocated", {}, slack,
                             "PyTorch CUDA caching allocator; see vram.memory.overhead")


def _fixed_overhead_items(setup: TrainingSetup, paged: int,
                          state: OptimizerState) -> tuple[LineItem, ...]:
    """The overhead beside the allocator's slack (which follows the peak): the CUDA context,
    NCCL's buffers and paged optimizer state."""
    items = [
        LineItem(key="overhead.context", label="CUDA context, kernels and cuBLAS workspace",
                 formula="constant", inputs={}, bytes=cuda_context_bytes(setup),
                 source="nvidia-smi after a 1-element tensor (HF perf docs: 0.3–1.3 GiB)"),
    ]
    nccl = nccl_bytes(setup)
    if nccl:
        items.append(LineItem(
            key="overhead.nccl", label="NCCL communication buffers", formula="constant",
            inputs={"gpus": setup.n_gpus}, bytes=nccl, source="NCCL default buffers"))
    if paged:
        items.append(LineItem(
            key="overhead.paged", label="paged optimizer state (unified memory, on the GPU)",
            formula=state.formula, inputs={}, bytes=paged,
            source="bitsandbytes paged optimizers (cudaMallocManaged)"))
    return tuple(items)


def _bucket_gradient_items(setup: TrainingSetup, grads: GradientPart,
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


def _fixed_notes(model: ModelSpec, optimizer: OptimizerPart) -> tuple[str, ...]:
    """The notes that do not depend on the peak moment."""
    notes: list[str] = []
    if optimizer.paged_bytes:
        notes.append(
            f"Paged optimizer state ({optimizer.paged_bytes:,} B) lives in unified memory: "
            "nvidia-smi can show it, torch.cuda.max_memory_allocated() does not.")
    if model.approximate:
        notes.append("The architecture was derived from a parameter count: figures are "
                     "approximate.")
    return tuple(notes)


@dataclass(frozen=True, slots=True)
class StatePart:
    """What does not depend on the batch or the sequence: the stack's behaviours, the
    parameter groups, and the weights, gradients and optimizer parts built from them, with
    the result's pieces made of them alone (validated once per setup structure)."""

    profile: StackProfile
    groups: list[ParamGroup]
    shards: Shards
    host_bytes: int  # weights, gradients and optimizer state offloaded to the host
    optimizer: OptimizerPart
    grads: GradientPart
    working: dict[Stage, list[LineItem]]
    zero: ZeroBuffers
    #: Weights, optimizer state and the DDP and ZeRO-3 buckets: alive at every moment.
    static_bytes: int
    #: Weights + every gradient + every optimizer state (`Estimate.state_bytes`).
    state_bytes: int
    params: ParamCounts
    weights: Bucket
    optimizer_bucket: Bucket
    bucket_gradient_items: tuple[LineItem, ...]
    fixed_overhead: tuple[LineItem, ...]
    fixed_overhead_bytes: int
    fixed_notes: tuple[str, ...]
    #: DeepSpeed ZeRO-3's gathered parameters by moment label (`_deepspeed_live_items`).
    live_weight_items: dict[str, list[LineItem]]




def _state_part(model: ModelSpec, setup: TrainingSetup) -> StatePart:
    profile = profile_for(setup)
    groups = param_groups(model, setup, profile)
    shards = shards_of(setup)
    weight_items, host = _weight_items(model, setup, profile, groups, shards)
    weights = sum(item.bytes for item in weight_items)
    optimizer = _optimizer_part(model, groups, setup, profile, shards)
    opt_bytes = sum(item.bytes for item in optimizer.items)
    grads = _gradient_part(model, setup, groups, shards, profile)
    zero = _deepspeed_zero(setup, groups, shards, grads)
    fixed_overhead = _fixed_overhead_items(setup, optimizer.paged_bytes, optimizer.state)
    return StatePart(
        profile=profile, groups=groups, shards=shards,
        host_bytes=host + grads.host + optimizer.host_bytes, optimizer=optimizer, grads=grads,
        working={stage: _working_items(model, setup, profile, groups, shards, stage)
                 for stage in Stage},
        zero=zero, static_bytes=weights + opt_bytes + grads.ddp_buckets + zero.bucket_bytes,
        state_bytes=weights + grads.total + grads.ddp_buckets + opt_bytes + optimizer.paged_bytes,
        params=ParamCounts(
            total=model.n_params, trainable=trainable_params(groups),
            quantized=sum(g.n_params for g in groups if g.storage in QUANTIZED)),
        weights=Bucket(name=BucketName.WEIGHTS, items=tuple(weight_items)),
        optimizer_bucket=Bucket(name=BucketName.OPTIMIZER, items=tuple(optimizer.items)),
        bucket_gradient_items=_bucket_gradient_items(setup, grads, zero),
        fixed_overhead=fixed_overhead,
        fixed_overhead_bytes=sum(item.bytes for item in fixed_overhead),
        fixed_notes=_fixed_notes(model, optimizer),
        live_weight_items=_deepspeed_live_items(model, setup, groups))


def state_part(model: ModelSpec, setup: TrainingSetup) -> StatePart:
    """`_state_part`, remembered per model for setups equal but for batch and sequence
    (`TOKEN_FIELDS`: no part of `StatePart` reads them)."""
    return memoized(model, ("state", setup_key(setup, TOKEN_FIELDS)),
                    lambda: _state_part(model, setup))


@dataclass(slots=True)
class StepPeak:
    """The candidate peaks of one step compared (`_step_peak`)."""

    part: StatePart
    plan: act.ActivationPlan
    #: The moment of the allocated peak (the first of equal ones).
    peak: Moment
    allocated: int
    reserved: int


def _step_peak(model: ModelSpec, setup: TrainingSetup,
               figures: list[MomentBytes] | None) -> StepPeak:
    """The step's moments and their peaks; each moment's figures go to `figures` (`estimate`
    writes them out; `estimate_peaks` passes None)."""
    part = state_part(model, setup)
    plan = act.plan(model, setup, part.profile)
    grads, zero = part.grads, part.zero
    moments = _moments(model, setup, plan, grads, part.working,
                       part.optimizer.step_temp_bytes + zero.step_copies_bytes)
    if zero.preallocated_gradients:
        for moment in moments:  # the flat partition exists, zero-filled, from the start
            moment.gradient_bytes = grads.total
    live = part.live_weight_items  # the state part is remembered per setup structure
    if live:
        for moment in moments:
            moment.weight_items = live.get(moment.label, [])

    static = part.static_bytes
    peak, allocated, reserved = moments[0], -1, 0
    for moment in moments:
        gradient_bytes, activation_bytes, in_flight_bytes, weight_bytes = moment.figures()
        total = static + gradient_bytes + activation_bytes + weight_bytes + in_flight_bytes
        # The first of equal moments wins: the allocator reaches a peak at its first moment.
        if total > allocated:
            peak, allocated = moment, total
        # The caching allocator keeps what it reserved in backward through the optimizer step,
        # so the reserved peak is the largest (allocated + slack) over the moments.
        reserved = max(reserved, total + allocator_slack_bytes(total, activation_bytes))
        if figures is not None:
            figures.append(MomentBytes.assemble(moment.phase, moment.label, total,
                                                gradient_bytes, activation_bytes,
                                                in_flight_bytes))
    return StepPeak(part, plan, peak, allocated, reserved)


def estimate(model: ModelSpec, setup: TrainingSetup) -> Estimate:
    """Per-GPU memory of one training step of `model` under `setup`."""
    figures: list[MomentBytes] = []
    step = _step_peak(model, setup, figures)
    part, peak, allocated, reserved = step.part, step.peak, step.allocated, step.reserved
    overhead = (_slack_item(max(0, reserved - allocated)), *part.fixed_overhead)
    extra_weights = [*peak.weight_items,
                     *(i for i in peak.in_flight_items if i.key.startswith("weights."))]
    weights = part.weights if not extra_weights else Bucket.assemble(
        BucketName.WEIGHTS, (*part.weights.items, *extra_weights))
    buckets = (
        weights,
        Bucket.assemble(BucketName.GRADIENTS, _gradient_items(part, peak)),
        part.optimizer_bucket,
        Bucket.assemble(BucketName.ACTIVATIONS, line_items(peak.activation_items)),
        Bucket.assemble(BucketName.OVERHEAD, overhead),
    )
    return Estimate.assemble(
        model_name=model.name, setup=setup, params=part.params,
        buckets=buckets, phase=peak.phase, allocated_peak_bytes=allocated,
        reserved_peak_bytes=reserved,
        device_peak_bytes=allocated + sum(i.bytes for i in overhead),
        host_bytes=part.host_bytes + step.plan.offloaded_bytes,
        paged_bytes=part.optimizer.paged_bytes, inference=inference_estimate(model, setup),
        state_bytes=part.state_bytes, approximate=model.approximate,
        notes=_notes(part, peak),
        moments=tuple(figures),
    )


def estimate_peaks(model: ModelSpec, setup: TrainingSetup) -> PeakBytes:
    """The peaks `estimate(model, setup)` reports, computed the same way, without the
    breakdown (line items, buckets, moments, inference): for sweeps and searches that compare
    peaks only, in about half the time.

        >>> from vram import load_model, TrainingSetup, estimate_peaks
        >>> estimate_peaks(load_model("llama-3.1-8b"), TrainingSetup()).device_peak_bytes
    """
    step = _step_peak(model, setup, None)
    slack = max(0, step.reserved - step.allocated)
    return PeakBytes.assemble(
        phase=step.peak.phase, allocated_peak_bytes=step.allocated,
        reserved_peak_bytes=step.reserved,
        device_peak_bytes=step.allocated + slack + step.part.fixed_overhead_bytes)


def _gradient_items(part: StatePart, peak: Moment) -> tuple[LineItem, ...]:
    """The gradients alive at the peak: the parameters' (as many as exist then), the buckets,
    and what exists only in that moment."""
    grads, shards = part.grads, part.shards
    params = LineItem.assemble(
        "gradients.params", "gradients of trainable parameters",
        "trainable params × grad dtype bytes"
        + (f" ÷ {shards.gradients}" if shards.gradients > 1 else ""),
        {"trainable_params": part.params.trainable, "shards": shards.gradients,
         "alive_at_peak": f"{peak.gradient_bytes:,} of {grads.total:,} bytes"},
        peak.gradient_bytes, "PyTorch .grad takes the parameter's dtype",
    )
    in_flight = (i for i in peak.in_flight_items if i.key.startswith("gradients."))
    return (params, *part.bucket_gradient_items, *line_items(peak.extra_gradient_items),
            *in_flight)


def _notes(part: StatePart, peak: Moment) -> tuple[str, ...]:
    if peak.gradient_bytes < part.grads.total:
        return (f"The peak is at {peak.label}: only part of the gradients exist then.",
                *part.fixed_notes)
    return part.fixed_notes
