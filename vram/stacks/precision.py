"""The dtype policy of a run, in one place: how many bytes each kind of tensor takes.

A precision recipe (fp32, fp16/bf16 autocast over fp32 weights, pure bf16) meets the stack's
choices (PEFT upcasts adapters to fp32, `prepare_model_for_kbit_training` upcasts a QLoRA base's
non-quantized parameters) and the sharding engine's (DeepSpeed ZeRO with a mixed recipe casts
the model to 16 bits and keeps an fp32 master copy in the optimizer). `precision_policy` turns
them into one frozen record that the weights, gradients, optimizer and activations all read.

    >>> from vram.setup import TrainingSetup
    >>> policy = precision_policy(TrainingSetup(method="full", precision="bf16-mixed"),
    ...                           fp32_adapters=True, upcasts_frozen=False)
    >>> policy.weights, policy.compute, policy.residual, policy.autocast
    (4, 2, 4, True)

Sources: torch.autocast (16-bit matmuls over fp32 weights); DeepSpeed's bf16/fp16 optimizers
(deepspeed/runtime/bf16_optimizer.py: a 16-bit model, fp32 master partitions); peft
`get_peft_model(autocast_adapter_dtype=True)`; peft/utils/other.py
`prepare_model_for_kbit_training`.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.setup import Method, Precision, TrainingSetup
from vram.units import BF16_BYTES, FP32_BYTES, Dtype

MIXED = (Precision.BF16_MIXED, Precision.FP16_MIXED)


@dataclass(frozen=True, slots=True)
class PrecisionPolicy:
    """Bytes per value of each kind of tensor in one run."""

    #: A trained dense parameter (full fine-tuning).
    weights: int
    #: A frozen dense parameter: LoRA's base, a QLoRA base's embedding, norms and head.
    frozen_weights: int
    #: A LoRA adapter parameter as stored.
    adapters: int
    #: The LoRA branch's input as it computes: PEFT casts it to the adapter's dtype
    #: (`x.to(lora_A.weight.dtype)`); a 16-bit engine (ZeRO) feeds 16 bits.
    adapter_inputs: int
    #: A gradient: PyTorch makes `.grad` like its parameter.
    gradients: int
    #: An optimizer state value: `zeros_like(param)`, or fp32 beside an fp32 master copy.
    states: int
    #: fp32 master copy per trainable parameter (0: the parameters are the master).
    master: int
    #: An activation as the layers compute it.
    compute: int
    #: The residual stream (fp32 while the weights it adds are fp32).
    residual: int
    #: q, k, v and the attention output as the attention kernel sees them.
    attention: int
    #: torch.autocast runs the matmuls in 16 bits over fp32 weights.
    autocast: bool
    #: Each 4-bit Linear casts its (fp32) input to the compute dtype and keeps that copy.
    input_copy_per_linear: bool
    #: The engine runs a 16-bit model (ZeRO with a mixed recipe), not autocast.
    half_model: bool
    #: The recipe's 16-bit dtype (fp16 for fp16-mixed, bf16 otherwise).
    sixteen_bit: Dtype
    #: The dtype bitsandbytes dequantizes a 4-bit weight into (its compute dtype: fp32 on an
    #: fp32 recipe, 16 bits otherwise).
    dequantized: int
    #: FSDP2's mixed-precision policy all-gathers parameters in 16 bits and reduce-scatters
    #: gradients in fp32 (`vram.sharding.fsdp2`).
    gathers_16bit: bool = False

    @property
    def casts_weights(self) -> bool:
        """torch.autocast casts fp32 weights to 16 bits for each matmul (a mixed recipe that
        does not run a 16-bit model; 16-bit weights need no cast)."""
        return self.autocast and not self.half_model and self.weights == FP32_BYTES

    @property
    def bf16_without_autocast(self) -> bool:
        """bf16 weights and no autocast (bf16-true, or a ZeRO bf16-mixed model): what
        transformers' grouped_mm experts need (transformers/integrations/moe.py)."""
        return self.weights == BF16_BYTES and self.sixteen_bit is Dtype.BF16


def is_mixed(setup: TrainingSetup) -> bool:
    """fp16/bf16 mixed precision: a 16-bit compute dtype over fp32 weights (or master)."""
    return setup.precision in MIXED


def runs_half_model(setup: TrainingSetup) -> bool:
    """DeepSpeed-style ZeRO with a mixed recipe runs a 16-bit model, the fp32 master copy living
    with the optimizer, rather than autocast over fp32 weights (DeepSpeed bf16_optimizer.py,
    fp16/fused_optimizer.py; FSDP's MixedPrecision(param_dtype=bf16) likewise)."""
    return is_mixed(setup) and setup.sharding.shards_optimizer


def _trained_weight_bytes(setup: TrainingSetup) -> int:
    """fp32 and autocast recipes keep fp32 weights; bf16-true and a ZeRO 16-bit model keep
    16 bits."""
    if setup.precision is Precision.FP32:
        return FP32_BYTES
    if setup.precision is Precision.BF16_TRUE or runs_half_model(setup):
        return BF16_BYTES
    return FP32_BYTES


def _frozen_weight_bytes(setup: TrainingSetup, upcasts_frozen: bool,
                         base_16bit: bool) -> int:
    """A QLoRA base's frozen 16-bit parameters follow the stack (prepare_model_for_kbit_training
    upcasts them to fp32); a LoRA base under a mixed recipe stays in the 16 bits it was loaded
    in on a stack that loads it so (`lora_base_16bit`); otherwise frozen parameters are stored
    like trained ones."""
    if setup.precision is Precision.FP32:
        return FP32_BYTES
    if setup.method is Method.QLORA:
        return FP32_BYTES if upcasts_frozen else BF16_BYTES
    if lora_base_16bit(setup, base_16bit):
        return BF16_BYTES
    return _trained_weight_bytes(setup)


def lora_base_16bit(setup: TrainingSetup, stack_loads_16bit: bool = False) -> bool:
    """LoRA under autocast over a base loaded in 16 bits (the `lora_base_16bit` knob, else the
    stack's default, e.g. Transformers 5's `from_pretrained(dtype="auto")`: the checkpoint's
    bf16): the frozen Linears are 16-bit, so autocast casts nothing but the adapters and the
    residual stream is 16-bit too."""
    loads = setup.lora_base_16bit if setup.lora_base_16bit is not None else stack_loads_16bit
    return (loads and setup.method is Method.LORA and is_mixed(setup)
            and not runs_half_model(setup))


def qlora_base_16bit(setup: TrainingSetup, upcasts_frozen: bool) -> bool:
    """QLoRA under autocast on a stack that leaves the base's non-quantized parameters in the
    16 bits it loads them in (no `prepare_model_for_kbit_training` upcast, or one undone): the
    16-bit embedding starts a 16-bit residual stream, as `lora_base_16bit` does for LoRA
    (RMSNorm returns its input's dtype; the trace agrees within 0.6 %). A LayerNorm family's
    stream turns partly fp32 (autocast's fp32 LayerNorm into Linear4bit, which returns its
    input's dtype): not modelled, benchmarks/ACCURACY.md says by how much."""
    return (setup.method is Method.QLORA and is_mixed(setup) and not upcasts_frozen
            and not runs_half_model(setup))


def _adapter_input_bytes(setup: TrainingSetup, fp32_adapters: bool) -> int:
    """PEFT upcasts adapters to fp32 (autocast_adapter_dtype=True); stacks that keep the model
    dtype have 16-bit adapters only in a pure-bf16 recipe; a ZeRO engine casts the whole model,
    adapters included; an fp32 recipe is fp32 throughout."""
    if setup.precision is Precision.FP32:
        return FP32_BYTES
    if runs_half_model(setup):
        return BF16_BYTES
    if fp32_adapters or setup.precision is not Precision.BF16_TRUE:
        return FP32_BYTES
    return BF16_BYTES


def _master_bytes(setup: TrainingSetup, trained: int, deepspeed_engine: bool) -> int:
    """A mixed recipe whose trained parameters are 16-bit keeps an fp32 master copy of them.
    DeepSpeed's ZeRO engine keeps its own master partition in every recipe: it clones the
    model's partition into the master dtype (the trained dtype under bf16-true's
    bf16_master_weights_and_grads, fp32 under fp32). Its ZeRO-3 would alias a partition
    already in that dtype, but compares the tensor's `torch.device` with the string
    `current_device_name()`, which is never equal, so it clones:
    deepspeed/runtime/zero/stage3.py@v0.18.4#L981-L990 (_create_fp32_partitions),
    deepspeed/runtime/zero/stage_1_and_2.py@v0.18.4#L449 (`detach().clone().to(dtype)`)."""
    if is_mixed(setup) and trained == BF16_BYTES:
        return FP32_BYTES
    return trained if deepspeed_engine else 0


def _autocast_16bit(setup: TrainingSetup, torch_autocast: bool) -> bool:
    """torch.autocast over 16-bit weights (pure bf16, or ZeRO's 16-bit model)."""
    return torch_autocast and (setup.precision is Precision.BF16_TRUE or runs_half_model(setup))


def fsdp2_mixed_policy(setup: TrainingSetup, *, fp32_adapters: bool,
                       base_16bit: bool = False) -> PrecisionPolicy:
    """FSDP2's `MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32)`: the sharded
    parameters stay as loaded (fp32) and are the optimizer's master, so gradients and states are
    fp32 and no extra master copy exists; every all-gather casts to 16 bits, so the layers
    (adapters too) compute in 16 bits without autocast
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py@v2.13.0 init_dtype_attrs,
    _fsdp_collectives.py foreach_reduce: `reduce_dtype` to the shard's `orig_dtype`)."""
    sixteen = Dtype.FP16 if setup.precision is Precision.FP16_MIXED else Dtype.BF16
    adapters = FP32_BYTES if fp32_adapters else BF16_BYTES
    return PrecisionPolicy(
        weights=FP32_BYTES, frozen_weights=BF16_BYTES if base_16bit else FP32_BYTES,
        adapters=adapters,
        adapter_inputs=BF16_BYTES, gradients=adapters if setup.trains_adapters else FP32_BYTES,
        states=adapters if setup.trains_adapters else FP32_BYTES, master=0,
        compute=BF16_BYTES, residual=BF16_BYTES, attention=BF16_BYTES, autocast=False,
        input_copy_per_linear=False, half_model=True, sixteen_bit=sixteen,
        dequantized=BF16_BYTES, gathers_16bit=True,
    )


def precision_policy(setup: TrainingSetup, *, fp32_adapters: bool, upcasts_frozen: bool,
                     base_16bit: bool = False, deepspeed_engine: bool = False,
                     torch_autocast: bool = False, fsdp2: bool = False) -> PrecisionPolicy:
    """The dtype policy of `setup` on a stack that does (`fp32_adapters`) or does not upcast
    LoRA adapters, does (`upcasts_frozen`) or does not upcast a QLoRA base's frozen 16-bit
    parameters to fp32, and does (`base_16bit`) or does not load a LoRA base in 16 bits;
    `deepspeed_engine`: DeepSpeed's ZeRO engine shards it; `torch_autocast`: torch.autocast
    runs over a 16-bit model (`vram.stacks.resolve`); `fsdp2`: the run shards with FSDP2
    (`fully_shard`) and the traced wrapping."""
    mixed = is_mixed(setup)
    if fsdp2 and mixed and setup.method is not Method.QLORA:
        return fsdp2_mixed_policy(setup, fp32_adapters=fp32_adapters,
                                  base_16bit=lora_base_16bit(setup, base_16bit))
    half_model = runs_half_model(setup)
    weights = _trained_weight_bytes(setup)
    frozen = _frozen_weight_bytes(setup, upcasts_frozen, base_16bit)
    adapter_inputs = _adapter_input_bytes(setup, fp32_adapters)
    # Under a mixed recipe the adapters are 16-bit when ZeRO casts the model, or beside a
    # 16-bit base on a stack that builds them in the base's dtype (LitGPT, torchtune).
    base_dtype = frozen == BF16_BYTES and not fp32_adapters
    adapters = BF16_BYTES if mixed and (half_model or base_dtype) else adapter_inputs
    trained = adapters if setup.trains_adapters else weights
    master = _master_bytes(setup, trained, deepspeed_engine)
    if upcasts_frozen:
        # HF QLoRA after prepare_model_for_kbit_training: fp32 embeddings and norms, and
        # Linear4bit returns `out.to(input dtype)`, so activations stay fp32; each 4-bit Linear
        # casts its input to bf16 and MatMul4Bit keeps that copy. Only autocast brings the
        # attention back to 16 bits; an fp32 recipe computes the 4-bit matmuls in fp32.
        compute, residual, autocast = FP32_BYTES, FP32_BYTES, mixed
        attention = BF16_BYTES if mixed else FP32_BYTES
        input_copy = setup.precision is not Precision.FP32
    elif setup.precision is Precision.FP32:
        compute, residual, autocast, attention, input_copy = (
            FP32_BYTES, FP32_BYTES, False, FP32_BYTES, False)
    elif _autocast_16bit(setup, torch_autocast):
        # autocast's fp32 list (layer_norm, softmax, cross_entropy) returns fp32: a LayerNorm's
        # output, so the stream it feeds, is fp32 as over fp32 weights; the 16-bit weights
        # need no casts (`casts_weights`)
        compute, residual, autocast, attention, input_copy = (
            BF16_BYTES, FP32_BYTES, True, BF16_BYTES, False)
    elif setup.precision is Precision.BF16_TRUE or half_model:
        compute, residual, autocast, attention, input_copy = (
            BF16_BYTES, BF16_BYTES, False, BF16_BYTES, False)
    elif lora_base_16bit(setup, base_16bit) or qlora_base_16bit(setup, upcasts_frozen):
        # the 16-bit embedding starts a 16-bit residual stream; autocast runs the adapters
        compute, residual, autocast, attention, input_copy = (
            BF16_BYTES, BF16_BYTES, True, BF16_BYTES, False)
    else:
        compute, residual, autocast, attention, input_copy = (
            BF16_BYTES, FP32_BYTES, True, BF16_BYTES, False)
    return PrecisionPolicy(
        weights=weights, frozen_weights=frozen, adapters=adapters, adapter_inputs=adapter_inputs,
        gradients=trained, states=max(master, trained), master=master,
        compute=compute, residual=residual, attention=attention, autocast=autocast,
        input_copy_per_linear=input_copy, half_model=half_model,
        sixteen_bit=Dtype.FP16 if setup.precision is Precision.FP16_MIXED else Dtype.BF16,
        dequantized=FP32_BYTES if setup.precision is Precision.FP32 else BF16_BYTES,
    )
