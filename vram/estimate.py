"""The estimate: per-GPU bytes of one training step, by bucket, at the peak moment.

The step is followed through the moments that can be the peak:
- the loss (end of forward, start of backward): weights + optimizer state + every saved
  activation + the logits and loss buffers;
- the backward of the top layer: the head's gradient arrives while the layers' activations are
  still held (under checkpointing, one layer is recomputed);
- the optimizer step: weights + gradients + states + the step's temporaries.
The largest is the allocated peak that `torch.cuda.max_memory_allocated()` reports.

    >>> from vram import load_model, TrainingSetup, estimate
    >>> estimate(load_model("llama-3.1-8b"), TrainingSetup(method="qlora")).device_peak_bytes
"""

from __future__ import annotations

from vram import activations as act
from vram.architecture import ModelSpec
from vram.inference import inference_estimate
from vram.optimizer import optimizer_state
from vram.overhead import allocator_slack_bytes, cuda_context_bytes, nccl_bytes
from vram.params import STORAGE_BYTES, ParamGroup, Storage, param_groups, trainable_params
from vram.result import (
    Bucket,
    BucketName,
    Estimate,
    LineItem,
    ParamCounts,
    Phase,
)
from vram.setup import (
    Method,
    Offload,
    Optimizer,
    Precision,
    Sharding,
    TrainingSetup,
)
from vram.stack import StackProfile, profile_for

FP32 = 4


def _shards(setup: TrainingSetup) -> tuple[int, int, int]:
    """How many ways weights, gradients and optimizer state are split (ZeRO paper, §5)."""
    n = setup.n_gpus
    if setup.sharding is Sharding.ZERO3:
        return n, n, n
    if setup.sharding is Sharding.ZERO2:
        return 1, n, n
    if setup.sharding is Sharding.ZERO1:
        return 1, 1, n
    return 1, 1, 1


def _grad_bytes(group: ParamGroup, setup: TrainingSetup) -> int:
    """Gradients take the parameter's dtype (PyTorch accumulates .grad like the param)."""
    if group.storage in (Storage.FP32, Storage.BF16):
        return int(group.n_params * STORAGE_BYTES[group.storage])
    return group.n_params * FP32


def _master_bytes(groups: list[ParamGroup], setup: TrainingSetup) -> int:
    """DeepSpeed-style mixed precision keeps an fp32 master copy of 16-bit trainable weights."""
    if setup.precision in (Precision.FP32, Precision.BF16_TRUE):
        return 0
    return sum(FP32 * g.n_params for g in groups if g.trainable and g.storage is Storage.BF16)


def _autocast_copies(model: ModelSpec, setup: TrainingSetup, groups: list[ParamGroup]) -> int:
    """Under autocast with fp32 weights, every Linear's 16-bit copy is kept for backward.

    Autocast caches casts of trainable leaf weights for the whole forward; a frozen Linear keeps
    the cast weight it multiplied by, to compute the input gradient. With checkpointing only
    the layer being recomputed holds its copies.
    """
    if setup.precision not in (Precision.FP16_MIXED, Precision.BF16_MIXED):
        return 0
    dense_linears = [g for g in groups if g.key in ("linears", "head")
                     and g.storage is Storage.FP32]
    total = sum(2 * g.n_params for g in dense_linears)
    if setup.grad_ckpt and model.n_layers:
        layers = next((g for g in dense_linears if g.key == "linears"), None)
        if layers is not None:
            total -= 2 * layers.n_params - 2 * layers.n_params // model.n_layers
    return total


def _gathered_bytes(model: ModelSpec, setup: TrainingSetup, groups: list[ParamGroup]) -> int:
    """ZeRO-3 / FSDP gather one layer's full parameters while computing it and prefetch the
    next (FSDP forward/backward prefetch); the head, when it is its own unit, is gathered for
    the loss."""
    if setup.sharding is not Sharding.ZERO3 or setup.n_gpus == 1 or not model.n_layers:
        return 0
    per_layer = sum(g.bytes for g in groups if g.key in ("linears", "norms")) // model.n_layers
    head = sum(g.bytes for g in groups if g.key == "head")
    # The output head is its own FSDP unit; it is gathered while the loss runs.
    return max(2 * per_layer, per_layer + head)


def estimate(model: ModelSpec, setup: TrainingSetup) -> Estimate:
    """Per-GPU memory of one training step of `model` under `setup`."""
    profile = profile_for(setup)
    groups = param_groups(model, setup, profile)
    w_shards, g_shards, o_shards = _shards(setup)
    plan = act.plan(model, setup, profile)
    notes: list[str] = []

    # Weights ---------------------------------------------------------------------------------
    offload_params = setup.offload is Offload.PARAMS_OPTIMIZER
    weight_items: list[LineItem] = []
    host = 0
    for group in groups:
        on_gpu = group.bytes // w_shards
        if offload_params:
            host += on_gpu
            on_gpu = 0
        weight_items.append(LineItem(
            key=f"weights.{group.key}", label=group.label,
            formula=f"params × {STORAGE_BYTES[group.storage]:g} B ({group.storage.value})"
            + (f" ÷ {w_shards} GPUs" if w_shards > 1 else ""),
            inputs={"params": group.n_params, "storage": group.storage.value,
                    "shards": w_shards},
            bytes=on_gpu,
            source="bitsandbytes quantize_4bit (QLoRA §2)" if group.storage in (
                Storage.NF4, Storage.NF4_DQ, Storage.INT8) else "parameter count × dtype",
        ))
    gathered = _gathered_bytes(model, setup, groups)
    if gathered or offload_params:
        gathered = max(gathered, 2 * sum(g.bytes for g in groups) // max(1, model.n_layers))
        weight_items.append(LineItem(
            key="weights.gathered", label="gathered layers (ZeRO-3/FSDP, with prefetch)",
            formula="2 × one layer's full parameters", inputs={"layers": 2}, bytes=gathered,
            source="PyTorch FSDP forward/backward prefetch",
        ))
    if (profile.fsdp_keeps_frozen_unsharded and setup.sharding is Sharding.ZERO3
            and setup.n_gpus > 1 and setup.trains_adapters and not offload_params):
        frozen = sum(g.bytes for g in groups if not g.trainable)
        weight_items.append(LineItem(
            key="weights.unsharded_frozen", label="frozen weights left unsharded in backward",
            formula="frozen bytes × (1 − 1/GPUs)", inputs={"gpus": setup.n_gpus},
            bytes=frozen - frozen // setup.n_gpus,
            source="FSDP1 before PyTorch 2.2 did not reshard frozen parameters in backward "
                   "(pytorch/pytorch#95805)",
        ))
    casts = _autocast_copies(model, setup, groups)
    if casts:
        weight_items.append(LineItem(
            key="weights.autocast", label="16-bit working copies of Linear weights (autocast)",
            formula="2 B × Linear params" + (" (one layer with checkpointing)"
                                             if setup.grad_ckpt else ""),
            inputs={"bytes_per_param": 2}, bytes=casts // w_shards,
            source="torch.autocast weight-cast cache; Linear keeps its weight for backward",
        ))
    quant_groups = [g for g in groups if g.storage in (Storage.NF4, Storage.NF4_DQ, Storage.INT8)]
    if quant_groups:
        biggest = max(_largest_matrix(model, setup, profile), 0)
        weight_items.append(LineItem(
            key="weights.dequant", label="dequantized weight of the Linear being computed",
            formula="2 B × largest quantized matrix", inputs={"params": biggest},
            bytes=2 * biggest, source="bitsandbytes MatMul4Bit dequantizes per call",
        ))
    weights_bytes = sum(item.bytes for item in weight_items)

    # Gradients -------------------------------------------------------------------------------
    trainable = [g for g in groups if g.trainable]
    grads_full = sum(_grad_bytes(g, setup) for g in trainable)
    grads = grads_full // g_shards
    offload_opt = setup.offload in (Offload.OPTIMIZER, Offload.PARAMS_OPTIMIZER)
    if offload_opt:
        # ZeRO-Offload and FSDP CPU offload move the sharded gradients to host memory.
        host += grads
        grads = 0
    in_backward = setup.optimizer is Optimizer.ADAMW_IN_BACKWARD
    grad_items = [LineItem(
        key="gradients.params", label="gradients of trainable parameters",
        formula="trainable params × grad dtype bytes" + (f" ÷ {g_shards}" if g_shards > 1
                                                        else ""),
        inputs={"trainable_params": trainable_params(groups), "shards": g_shards},
        bytes=grads, source="PyTorch .grad takes the parameter's dtype",
    )]
    if setup.sharding is Sharding.DDP:
        grad_items.append(LineItem(
            key="gradients.ddp_buckets", label="DDP gradient buckets",
            formula="one more copy of the gradients (gradient_as_bucket_view=False)",
            inputs={}, bytes=grads_full, source="torch.nn.parallel.DistributedDataParallel",
        ))

    # Optimizer -------------------------------------------------------------------------------
    master_full = _master_bytes(groups, setup)
    state = optimizer_state(groups, setup, fused=profile.fused_optimizer,
                            master_fp32=master_full > 0)
    master = master_full // o_shards
    state_bytes = state.state_bytes // o_shards
    paged = state_bytes if state.paged else 0
    if offload_opt:
        host += state_bytes + master
    opt_items: list[LineItem] = []
    if not offload_opt:
        opt_items.append(LineItem(
            key="optimizer.states", label=f"{setup.optimizer.value} state",
            formula=state.formula + (f" ÷ {o_shards}" if o_shards > 1 else ""),
            inputs={"trainable_params": trainable_params(groups), "shards": o_shards},
            bytes=0 if state.paged else state_bytes,
            source="see vram.optimizer",
            note="paged: kept in CUDA unified memory, invisible to PyTorch's counters"
            if state.paged else "",
        ))
        if master:
            opt_items.append(LineItem(
                key="optimizer.master", label="fp32 master weights (mixed precision + ZeRO)",
                formula="4 B × trainable params" + (f" ÷ {o_shards}" if o_shards > 1 else ""),
                inputs={}, bytes=master, source="DeepSpeed bf16/fp16 optimizer",
            ))
    opt_bytes = sum(item.bytes for item in opt_items)
    step_temp = 0 if offload_opt else state.step_temp_bytes // o_shards

    # Activations and the peak ----------------------------------------------------------------
    head_grad = _head_grad_bytes(groups, setup) // g_shards
    grads_during_forward = grads if (setup.grad_accum > 1 and not in_backward) else 0
    base = weights_bytes + opt_bytes + grads_during_forward
    layers_kept = plan.checkpointed_bytes + plan.stored_layers_bytes
    loss_moment = base + layers_kept + plan.head_peak_bytes
    top_layer_moment = (base + layers_kept + plan.head_saved_bytes // 2 + head_grad
                        + plan.recompute_bytes + plan.backward_transient_bytes)
    opt_moment = weights_bytes + opt_bytes + (0 if in_backward else grads) + step_temp
    moments = {
        Phase.FORWARD: base + layers_kept + plan.head_saved_bytes,
        Phase.BACKWARD: max(loss_moment, top_layer_moment),
        Phase.OPTIMIZER_STEP: opt_moment,
    }
    phase = max(moments, key=lambda p: moments[p])
    allocated = moments[phase]
    # The caching allocator keeps what it reserved in backward through the optimizer step, so
    # the reserved peak is the largest (allocated + slack) over the moments, not the slack at
    # the allocated peak.
    activations_at = {
        Phase.FORWARD: layers_kept + plan.head_saved_bytes,
        Phase.BACKWARD: max(loss_moment, top_layer_moment) - base,
        Phase.OPTIMIZER_STEP: step_temp,
    }
    reserved_peak = max(
        moments[p] + allocator_slack_bytes(moments[p], activations_at[p]) for p in moments)

    act_items: list[LineItem] = []
    grads_at_peak = grads if phase is Phase.OPTIMIZER_STEP and not in_backward else (
        grads_during_forward if phase is not Phase.BACKWARD else max(
            grads_during_forward, head_grad if top_layer_moment >= loss_moment else 0))
    if phase is Phase.OPTIMIZER_STEP:
        if step_temp:
            act_items.append(LineItem(
                key="activations.optimizer_temp", label="optimizer step temporaries",
                formula="one state-sized list (foreach AdamW's sqrt(v))", inputs={},
                bytes=step_temp, source="torch/optim/adamw.py _multi_tensor_adamw",
            ))
    else:
        act_items.extend(_activation_items(model, setup, plan))
        if phase is Phase.BACKWARD:
            if top_layer_moment >= loss_moment:
                extra = (plan.recompute_bytes + plan.backward_transient_bytes
                         + plan.head_saved_bytes // 2)
                act_items.append(LineItem(
                    key="activations.backward", label="backward of the top layer"
                    + (" (recomputed)" if setup.grad_ckpt else ""),
                    formula="one layer's activations (checkpointing) + its gradient buffers",
                    inputs={"tokens": plan.tokens}, bytes=extra,
                    source="per-layer backward; checkpointing recomputes one layer",
                ))
            else:
                act_items.append(LineItem(
                    key="activations.loss", label="logits, loss and their gradients",
                    formula=plan.head.formula, inputs={"tokens": plan.tokens,
                                                       "vocab": model.vocab_size},
                    bytes=plan.head_peak_bytes, source="see vram.activations.head_activations",
                ))
        else:
            act_items.append(LineItem(
                key="activations.head", label=plan.head.label, formula=plan.head.formula,
                inputs={"tokens": plan.tokens, "vocab": model.vocab_size},
                bytes=plan.head_saved_bytes, source="see vram.activations.head_activations",
            ))
    if grads_at_peak != grads:
        grad_items = [item.model_copy(update={"bytes": grads_at_peak}) if item.key ==
                      "gradients.params" else item for item in grad_items]
        if grads_at_peak < grads:
            notes.append("At the peak only part of the gradients exist; the table shows those.")
    if setup.sharding is not Sharding.DDP or phase is not Phase.OPTIMIZER_STEP:
        grad_items = [item for item in grad_items if item.key != "gradients.ddp_buckets"] + (
            [next(i for i in grad_items if i.key == "gradients.ddp_buckets")]
            if setup.sharding is Sharding.DDP else [])
    grad_bytes_at_peak = sum(item.bytes for item in grad_items)
    act_bytes = sum(item.bytes for item in act_items)
    allocated = weights_bytes + opt_bytes + grad_bytes_at_peak + act_bytes
    if state.paged:
        notes.append(
            f"Paged optimizer state ({paged:,} B) lives in unified memory: nvidia-smi can show "
            "it, torch.cuda.max_memory_allocated() does not."
        )

    # Overhead --------------------------------------------------------------------------------
    slack = max(0, reserved_peak - allocated)
    context = cuda_context_bytes()
    nccl = nccl_bytes(setup)
    overhead_items = [
        LineItem(key="overhead.allocator", label="caching-allocator slack (fragmentation)",
                 formula="reserved − allocated", inputs={}, bytes=slack,
                 source="PyTorch CUDA caching allocator; calibrated on published reserved peaks"),
        LineItem(key="overhead.context", label="CUDA context, kernels and cuBLAS workspace",
                 formula="constant", inputs={}, bytes=context,
                 source="nvidia-smi after a 1-element tensor (HF perf docs: 0.3–1.3 GiB)"),
    ]
    if nccl:
        overhead_items.append(LineItem(
            key="overhead.nccl", label="NCCL communication buffers", formula="constant",
            inputs={"gpus": setup.n_gpus}, bytes=nccl, source="NCCL default buffers"))
    if paged:
        overhead_items.append(LineItem(
            key="overhead.paged", label="paged optimizer state (unified memory, on the GPU)",
            formula=state.formula, inputs={}, bytes=paged,
            source="bitsandbytes paged optimizers (cudaMallocManaged)"))

    buckets = (
        Bucket(name=BucketName.WEIGHTS, items=tuple(weight_items)),
        Bucket(name=BucketName.GRADIENTS, items=tuple(grad_items)),
        Bucket(name=BucketName.OPTIMIZER, items=tuple(opt_items)),
        Bucket(name=BucketName.ACTIVATIONS, items=tuple(act_items)),
        Bucket(name=BucketName.OVERHEAD, items=tuple(overhead_items)),
    )
    reserved = allocated + slack
    device = reserved + context + nccl + paged
    if model.approximate:
        notes.append("The architecture was derived from a parameter count: figures are "
                     "approximate.")
    if plan.offloaded_bytes:
        host += plan.offloaded_bytes
    return Estimate(
        model_name=model.name, setup=setup,
        params=ParamCounts(
            total=model.n_params, trainable=trainable_params(groups),
            quantized=sum(g.n_params for g in quant_groups),
        ),
        buckets=buckets, phase=phase, allocated_peak_bytes=allocated,
        reserved_peak_bytes=reserved, device_peak_bytes=device, host_bytes=host,
        paged_bytes=paged, inference=inference_estimate(model, setup),
        state_bytes=weights_bytes + grads + opt_bytes + paged,
        approximate=model.approximate, notes=tuple(notes),
    )


def _head_grad_bytes(groups: list[ParamGroup], setup: TrainingSetup) -> int:
    """The first gradients to exist in backward: the output head's (and a tied embedding's)."""
    for group in groups:
        if group.key in ("head", "embedding") and group.trainable:
            return _grad_bytes(group, setup)
    return 0


def _largest_matrix(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> int:
    biggest = max(
        (ln.d_in * ln.d_out for stack in model.stacks for ln in stack.linears), default=0)
    if profile.quantizes_head:
        biggest = max(biggest, model.vocab_size * model.hidden_size)
    return biggest


def _activation_items(model: ModelSpec, setup: TrainingSetup, plan: act.ActivationPlan,
                      ) -> list[LineItem]:
    tokens = plan.tokens
    items: list[LineItem] = []
    if setup.grad_ckpt:
        if plan.checkpointed_bytes:
            items.append(LineItem(
                key="activations.checkpoints", label="checkpointed layer inputs",
                formula="layers × tokens × h × residual bytes",
                inputs={"layers": model.n_layers, "tokens": tokens, "h": model.hidden_size},
                bytes=plan.checkpointed_bytes,
                source="torch.utils.checkpoint keeps each layer's input",
            ))
        return items
    for layer in plan.layers:
        for term in layer.terms:
            items.append(LineItem(
                key=f"activations.{layer.stack}.{term.key}",
                label=f"{term.label} × {layer.count} {layer.stack} layers",
                formula=f"tokens × layers × ({term.formula})",
                inputs={"tokens": tokens, "layers": layer.count, "per_token_bytes": term.bytes},
                bytes=term.bytes * tokens * layer.count if setup.offload is not Offload.ACTIVATIONS
                else 0,
                source="autograd saved tensors; see vram.activations",
            ))
    if setup.offload is Offload.ACTIVATIONS:
        items.append(LineItem(key="activations.kept", label="one layer kept on the GPU",
                              formula="largest layer", inputs={}, bytes=plan.stored_layers_bytes,
                              source="activation offloading"))
    return items


__all__ = ["Method", "estimate"]
