"""The estimate: per-GPU bytes of one training step, by bucket, at the peak moment.

The step is followed through the moments that can hold the peak (`vram.step.moments`):
- forward end: weights + optimizer state + every saved activation + the logits;
- the loss: the same, with the loss's forward and backward buffers (logits, log-softmax and
  their gradients) at their largest;
- the final norm's backward: the loss's tensors gone, the RMSNorm's fp32 temporaries at their
  largest (a fused linear loss, or a long context, can peak there);
- the top layer's backward: the head's gradient exists while every layer's activations are
  still held (under checkpointing, the top layer is recomputed);
- late backward: almost every gradient exists, one layer's activations remain;
- the optimizer step: weights + gradients + states + the step's temporaries.
The largest is the allocated peak (`torch.cuda.max_memory_allocated()`); the buckets are what
is alive at that moment, and `phase` names it.

    >>> from vram import load_model, TrainingSetup, estimate
    >>> peak = estimate(load_model("llama-3.1-8b"), TrainingSetup(method="qlora"))
    >>> peak.device_peak_bytes > peak.allocated_peak_bytes
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.errors import VramError
from vram.memo import TOKEN_FIELDS, memoized, setup_key
from vram.memory import activations as act
from vram.memory.gradients import GradientPart, bucket_gradient_items, gradient_part
from vram.memory.inference import inference_estimate
from vram.memory.optimizer import OptimizerPart, largest_trainable, optimizer_part
from vram.memory.overhead import (
    allocator_slack_bytes,
    cuda_context_bytes,
    fixed_overhead_items,
    idle_loss_bytes,
    idle_loss_item,
    slack_item,
)
from vram.memory.vision import VisionPlan, vision_plan, vision_tokens
from vram.memory.weights import (
    QUANTIZED,
    Stage,
    deepspeed_live_items,
    deepspeed_prefetch_buffer_bytes,
    deepspeed_window,
    weight_items,
    working_items,
)
from vram.model.lora_reach import expert_lora_notes
from vram.model.params import ParamGroup, param_groups, trainable_params
from vram.model.spec import ModelSpec
from vram.result import (
    Bucket,
    BucketName,
    Estimate,
    LineItem,
    MomentBytes,
    MomentId,
    ParamCounts,
    PeakBytes,
)
from vram.setup import TrainingSetup
from vram.sharding import fsdp1
from vram.sharding.deepspeed_streams import allgather_pool_item, runs_allgather_stream
from vram.sharding.deepspeed_zero import ZeroBuffers, zero_buffers
from vram.sharding.expert_parallel import ep_local, state_model
from vram.sharding.pipeline import StagePlan, peak_stages, stage_model, stage_plans
from vram.sharding.shards import Shards, shards_of
from vram.sharding.tensor_parallel import tp_local
from vram.stacks.profile import StackProfile, profile_for
from vram.stacks.resolve import resolve
from vram.step.bounds import Peaks, Shares, bounds_from, shares_for
from vram.step.context import Moment
from vram.step.draft import line_items
from vram.step.moments import step_moments
from vram.step.pipeline_moments import with_pipeline


def _fixed_notes(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                 optimizer: OptimizerPart) -> tuple[str, ...]:
    """The notes that do not depend on the peak moment."""
    notes: list[str] = list(expert_lora_notes(model, setup, profile))
    if optimizer.paged_bytes:
        notes.append(
            f"Paged optimizer state ({optimizer.paged_bytes:,} B) lives in unified memory: "
            "nvidia-smi can show it, torch.cuda.max_memory_allocated() does not.")
    if model.approximate:
        notes.append(model.approximate_why or "The architecture was derived from a parameter "
                     "count: figures are approximate.")
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
    #: FSDP1's all-gather streams' cached blocks, in the reserved figure
    #: (`vram.sharding.fsdp1`); empty elsewhere.
    stream_pools: tuple[LineItem, ...]
    #: DeepSpeed ZeRO-3's coalesced prefetch buffer on its all-gather stream, None where the
    #: all-gathers do not run on a stream of their own (`vram.sharding.deepspeed_streams`).
    allgather_flat_bytes: int | None
    #: The CUDA context the device figure counts, and the bounds' terms that are on.
    context_bytes: int
    bounds_shares: Shares
    fixed_notes: tuple[str, ...]
    #: DeepSpeed ZeRO-3's gathered parameters by moment label (`deepspeed_live_items`).
    live_weight_items: dict[MomentId, list[LineItem]]


def _state_groups(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                  ways: int, groups: list[ParamGroup]) -> list[ParamGroup]:
    """The parameter groups that size a state split `ways` ways: under expert parallel the
    whole banks where it is sharded (`vram.sharding.expert_parallel.state_model`)."""
    whole = state_model(model, ways > 1)
    return groups if whole is model else param_groups(whole, setup, profile)


def _state_part(model: ModelSpec, setup: TrainingSetup) -> StatePart:
    profile = profile_for(setup)
    groups = param_groups(model, setup, profile)  # what the rank computes with
    shards = shards_of(setup)
    w_groups, g_groups, o_groups = (_state_groups(model, setup, profile, ways, groups) for ways
                                    in (shards.weights, shards.gradients, shards.optimizer))
    weights_on_gpu, host = weight_items(model, setup, profile, w_groups, shards,
                                        unit_groups=groups)
    weights = sum(item.bytes for item in weights_on_gpu)
    optimizer = optimizer_part(model, o_groups, setup, profile, shards)
    opt_bytes = sum(item.bytes for item in optimizer.items)
    grads = gradient_part(model, setup, g_groups, shards, profile, unit_groups=groups)
    zero = zero_buffers(setup, g_groups, shards,
                        gradients_on_device=not grads.host and grads.total > 0)
    fixed_overhead = fixed_overhead_items(setup, optimizer.paged_bytes, optimizer.state)
    # what the estimate already counts unsharded: the gathered layers and, on PyTorch <= 2.1,
    # the frozen weights FSDP1 left unsharded in backward (both blocks of the unshard pool)
    gathered = sum(i.bytes for i in weights_on_gpu
                   if i.key in ("weights.gathered", "weights.unsharded_frozen"))
    pools = fsdp1.unshard_pool_item(model, setup, profile, groups, gathered)
    window = deepspeed_window(model, setup, groups, profile)
    return StatePart(
        profile=profile, groups=groups, shards=shards,
        host_bytes=host + grads.host + optimizer.host_bytes, optimizer=optimizer, grads=grads,
        working={stage: working_items(model, setup, profile, w_groups, shards, stage)
                 for stage in Stage},
        zero=zero, static_bytes=weights + opt_bytes + grads.ddp_buckets + zero.bucket_bytes,
        state_bytes=weights + grads.total + grads.ddp_buckets + opt_bytes + optimizer.paged_bytes,
        params=ParamCounts(
            total=model.n_params, trainable=trainable_params(groups),
            quantized=sum(g.n_params for g in groups if g.storage in QUANTIZED)),
        weights=Bucket(name=BucketName.WEIGHTS, items=tuple(weights_on_gpu)),
        optimizer_bucket=Bucket(name=BucketName.OPTIMIZER, items=tuple(optimizer.items)),
        bucket_gradient_items=bucket_gradient_items(setup, grads, zero),
        fixed_overhead=fixed_overhead,
        fixed_overhead_bytes=sum(item.bytes for item in fixed_overhead),
        stream_pools=() if pools is None else (pools,),
        allgather_flat_bytes=(deepspeed_prefetch_buffer_bytes(window)
                              if runs_allgather_stream(setup) else None),
        context_bytes=cuda_context_bytes(setup), bounds_shares=shares_for(model, setup),
        fixed_notes=_fixed_notes(model, setup, profile, optimizer),
        live_weight_items=deepspeed_live_items(window))


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
    vision: VisionPlan | None
    #: The moment of the allocated peak (the first of equal ones).
    peak: Moment
    allocated: int
    reserved: int
    #: The activations at the peak moment, and the most they hold at any moment.
    activations: int
    activations_max: int
    #: Under pipeline parallel, the rank whose step this is (the one with the peak).
    stage: StagePlan | None = None
    #: What the loss's idle blocks add to `reserved` beyond the fitted slack, and one block.
    idle_loss: int = 0
    loss_block: int = 0
    #: The streams' pools in `reserved` (`StatePart.stream_pools`, DeepSpeed's all-gather
    #: stream's).
    stream_pools: tuple[LineItem, ...] = ()

    def peaks(self, device: int) -> Peaks:
        """What the bounds are built from, with the device figure."""
        return Peaks(allocated=self.allocated, reserved=self.reserved, device=device,
                     activations=self.activations, activations_max=self.activations_max,
                     paged=self.part.optimizer.paged_bytes, context=self.part.context_bytes)


def _step_peak(model: ModelSpec, setup: TrainingSetup,
               figures: list[MomentBytes] | None) -> StepPeak:
    """The step's moments and their peaks; each moment's figures go to `figures` (`estimate`
    writes them out; `estimate_peaks` passes None). A layout or float8 recipe the stack does
    not run is an error naming the knob (`vram.stacks.support`). Under pipeline parallel the
    step of each rank that can hold the peak (`vram.sharding.pipeline.peak_stages`), the
    largest kept."""
    problem = resolve(setup).unsupported
    if problem is not None:
        raise VramError(problem)
    # one tensor-parallel rank's slice, holding one expert-parallel rank's experts
    model = ep_local(tp_local(model, setup.tp), setup.ep)
    if setup.pp == 1:
        return _rank_peak(model, setup, figures, None)
    best: StepPeak | None = None
    best_figures: list[MomentBytes] = []
    for stage in peak_stages(stage_plans(setup, model.n_layers)):
        stage_figures: list[MomentBytes] = []
        step = _rank_peak(stage_model(model, stage), setup, stage_figures, stage)
        if best is None or step.allocated > best.allocated:
            best, best_figures = step, stage_figures
    assert best is not None
    if figures is not None:
        figures.extend(best_figures)
    return best


def _rank_peak(model: ModelSpec, setup: TrainingSetup, figures: list[MomentBytes] | None,
               stage: StagePlan | None) -> StepPeak:
    """`_step_peak` on one rank: `model` is what the rank holds."""
    part = state_part(model, setup)
    plan = act.plan(model, setup, part.profile)
    grads, zero = part.grads, part.zero
    vision = vision_plan(model, setup, part.profile)
    moments = step_moments(model, setup, part.profile, plan, grads, part.working,
                       part.optimizer.step_temp_bytes + zero.step_copies_bytes, vision)
    if stage is not None:
        with_pipeline(moments, stage, model, setup, plan, part.profile, part.groups)
    if zero.preallocated_gradients:
        for moment in moments:  # the flat partition exists, zero-filled, from the start
            moment.gradient_bytes = grads.total
    live = part.live_weight_items  # the state part is remembered per setup structure
    if live:
        for moment in moments:
            moment.weight_items = live.get(moment.label, [])

    static = part.static_bytes
    peak, allocated, reserved = moments[0], -1, 0
    window = counted = 0  # the most gathered parameters, and those at the reserved peak
    activations = activations_max = 0
    for moment in moments:
        gradient_bytes, activation_bytes, in_flight_bytes, weight_bytes = moment.figures()
        total = static + gradient_bytes + activation_bytes + weight_bytes + in_flight_bytes
        # The first of equal moments wins: the allocator reaches a peak at its first moment.
        if total > allocated:
            peak, allocated, activations = moment, total, activation_bytes
        activations_max = max(activations_max, activation_bytes)
        # The caching allocator keeps what it reserved in backward through the optimizer step,
        # so the reserved peak is the largest (allocated + slack) over the moments.
        candidate = total + allocator_slack_bytes(total, activation_bytes)
        if candidate > reserved:
            reserved, counted = candidate, weight_bytes
        window = max(window, weight_bytes)
        if figures is not None:
            figures.append(MomentBytes.assemble(moment.phase, moment.label, total,
                                                gradient_bytes, activation_bytes,
                                                in_flight_bytes))
    block = plan.head.loss_block_per_token * plan.tokens
    idle = _idle_loss(model, setup, part, block) if setup.grad_ckpt and block else 0
    idle = max(0, allocated + idle - reserved)
    # FSDP1's and DeepSpeed's all-gather streams hold their blocks the whole step, apart from
    # the compute stream's pool (`vram.sharding.fsdp1`, `vram.sharding.deepspeed_streams`)
    pools = part.stream_pools
    if part.allgather_flat_bytes is not None:
        ds_pool = allgather_pool_item(window, part.allgather_flat_bytes, counted)
        pools = pools if ds_pool is None else (*pools, ds_pool)
    reserved += idle + sum(item.bytes for item in pools)
    return StepPeak(part, plan, vision, peak, allocated, reserved, activations,
                    activations_max, stage, idle, block, pools)


def _idle_loss(model: ModelSpec, setup: TrainingSetup, part: StatePart, block: int) -> int:
    """`idle_loss_bytes` with the rank's largest parameter block and optimizer state."""
    policy = part.profile.precision
    largest = largest_trainable(model, setup, part.groups) * max(
        policy.weights, policy.gradients, policy.states)
    state = part.optimizer_bucket.bytes - part.optimizer.paged_bytes
    return idle_loss_bytes(block, largest, state, setup.grad_ckpt)


def estimate(model: ModelSpec, setup: TrainingSetup) -> Estimate:
    """Per-GPU memory of one training step of `model` under `setup`."""
    figures: list[MomentBytes] = []
    step = _step_peak(model, setup, figures)
    part, peak, allocated, reserved = step.part, step.peak, step.allocated, step.reserved
    pools = sum(item.bytes for item in step.stream_pools)
    idle = (idle_loss_item(step.idle_loss, step.loss_block),) if step.idle_loss else ()
    overhead = (slack_item(max(0, reserved - allocated - pools - step.idle_loss)), *idle,
                *step.stream_pools, *part.fixed_overhead)
    device = allocated + sum(i.bytes for i in overhead)
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
        model_name=model.name, setup=setup, params=_whole_model_params(model, setup, part),
        buckets=buckets, phase=peak.phase, allocated_peak_bytes=allocated,
        reserved_peak_bytes=reserved, device_peak_bytes=device,
        bounds=bounds_from(part.bounds_shares, setup, step.peaks(device)),
        host_bytes=part.host_bytes + step.plan.offloaded_bytes,
        paged_bytes=part.optimizer.paged_bytes, inference=inference_estimate(model, setup),
        state_bytes=part.state_bytes, approximate=model.approximate,
        notes=_notes(part, peak) + _stage_note(setup, step.stage),
        moments=tuple(figures),
        vision=vision_tokens(step.vision, setup, peak.activation_items),
    )


def estimate_peaks(model: ModelSpec, setup: TrainingSetup) -> PeakBytes:
    """The peaks `estimate(model, setup)` reports, computed the same way, without the
    breakdown (line items, buckets, moments, inference): for sweeps and searches that compare
    peaks only, in about half the time.

        >>> from vram import load_model, TrainingSetup, estimate_peaks
        >>> from vram import estimate
        >>> model, setup = load_model("llama-3.1-8b"), TrainingSetup()
        >>> fast, full = estimate_peaks(model, setup), estimate(model, setup)
        >>> fast.device_peak_bytes == full.device_peak_bytes
        True
    """
    step = _step_peak(model, setup, None)
    slack = max(0, step.reserved - step.allocated)
    device = step.allocated + slack + step.part.fixed_overhead_bytes
    return PeakBytes.assemble(
        phase=step.peak.phase, allocated_peak_bytes=step.allocated,
        reserved_peak_bytes=step.reserved, device_peak_bytes=device,
        bounds=bounds_from(step.part.bounds_shares, setup, step.peaks(device)))


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


def _whole_model_params(model: ModelSpec, setup: TrainingSetup, part: StatePart) -> ParamCounts:
    """The whole model's parameter counts (under tensor or pipeline parallel the state part is
    one rank's slice; under expert parallel it holds `E / ep` experts)."""
    if setup.tp == 1 and setup.pp == 1 and setup.ep == 1:
        return part.params
    groups = memoized(model, ("param groups", setup_key(setup, TOKEN_FIELDS)),
                      lambda: param_groups(model, setup, part.profile))
    return ParamCounts(total=model.n_params, trainable=trainable_params(groups),
                       quantized=sum(g.n_params for g in groups if g.storage in QUANTIZED))


def _stage_note(setup: TrainingSetup, stage: StagePlan | None) -> tuple[str, ...]:
    if stage is None:
        return ()
    where = "first" if stage.first else "last" if stage.last else "middle"
    return (f"Pipeline rank {stage.rank} of {setup.pp} (the {where} stage: {stage.blocks} "
            f"blocks, {float(stage.in_flight):g} micro-batches in flight) holds the peak.",)


def _notes(part: StatePart, peak: Moment) -> tuple[str, ...]:
    if peak.gradient_bytes < part.grads.total:
        return (f"The peak is at {peak.label}: only part of the gradients exist then.",
                *part.fixed_notes)
    return part.fixed_notes
