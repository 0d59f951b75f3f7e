"""The choices of each enumerated knob: method, quantization, optimizer, precision, attention
kernel, loss, sharding, offload and training stack.

    >>> Method("qlora") is Method.QLORA
    True
"""

from __future__ import annotations

from enum import StrEnum


class Method(StrEnum):
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"


class ExpertBanks(StrEnum):
    """Which MoE expert banks LoRA adapts through PEFT's `target_parameters` (the banks are 3-D
    parameters, not the nn.Linear modules `target_modules` names): gate/up (or the up bank of
    a non-gated expert), down, both, or none beyond what the LoRA targets reach."""

    NONE = "none"
    GATE_UP = "gate_up"
    DOWN = "down"
    ALL = "all"


class Experts(StrEnum):
    """How Transformers 5 runs an MoE layer's experts (`experts_implementation`)."""

    GROUPED_MM = "grouped_mm"  # its default: one grouped matmul per bank, any dtype
    EAGER = "eager"  # a loop over the experts, each indexing the banks


class Quant(StrEnum):
    NONE = "none"
    NF4 = "nf4"
    NF4_DQ = "nf4-dq"
    INT8 = "int8"


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw-8bit"
    PAGED_ADAMW = "paged-adamw"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAFACTOR = "adafactor"
    LION = "lion"
    ADAMW_IN_BACKWARD = "adamw-in-backward"
    ADAMW_4BIT = "adamw-4bit"
    GALORE_ADAMW8BIT_PER_LAYER = "galore-adamw8bit-per-layer"


class Precision(StrEnum):
    FP32 = "fp32"
    FP16_MIXED = "fp16-mixed"
    BF16_MIXED = "bf16-mixed"
    BF16_TRUE = "bf16-true"


class Attention(StrEnum):
    EAGER = "eager"
    SDPA = "sdpa"
    FLASH = "flash"


class Loss(StrEnum):
    """`standard`: full logits, upcast to fp32 for cross-entropy. `chunked`: the stack's
    chunked loss (torchtune, LitGPT: all 16-bit logits exist, the loss runs per chunk; HF
    Trainer: Liger's, fused). `fused-linear`: head and cross-entropy fused, so the logits never
    exist whole: Liger's per chunk of tokens, or Cut Cross-Entropy where the stack runs it
    (`fused_loss_is_cce`: unsloth)."""

    STANDARD = "standard"
    CHUNKED = "chunked"
    FUSED_LINEAR = "fused-linear"


class Sharding(StrEnum):
    """How data parallelism shares the model state (the ZeRO paper's stages; FSDP's full and
    grad-op shards are ZeRO-3 and ZeRO-2)."""

    NONE = "none"
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"

    @property
    def shards_optimizer(self) -> bool:
        """ZeRO-1, 2 and 3 partition the optimizer state (a "ZeRO stage")."""
        return self in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3)

    @property
    def shards_gradients(self) -> bool:
        """ZeRO-2 and 3 (FSDP's grad-op and full shard) partition the gradients too."""
        return self in (Sharding.ZERO2, Sharding.ZERO3)

    @property
    def shards_weights(self) -> bool:
        """ZeRO-3 (FSDP's full shard) partitions the weights too."""
        return self is Sharding.ZERO3


class Offload(StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    PARAMS_OPTIMIZER = "params+optimizer"
    ACTIVATIONS = "activations"

    def runs_with(self, sharding: Sharding) -> bool:
        """Offloading the optimizer state needs it sharded (a ZeRO stage); offloading the
        parameters too needs them sharded (ZeRO-3 / FSDP full shard)."""
        if self is Offload.OPTIMIZER:
            return sharding.shards_optimizer
        if self is Offload.PARAMS_OPTIMIZER:
            return sharding.shards_weights
        return True


class PipelineSchedule(StrEnum):
    """Which micro-batches a pipeline stage holds (`vram.sharding.parallel`): GPipe all of
    them, 1F1B `pp - rank`, interleaved 1F1B `pp_virtual` chunks per rank."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class ContextParallel(StrEnum):
    """How context parallel lets a rank's tokens attend to all tokens: ring passes (or
    all-gathers) key/value blocks; Ulysses exchanges heads for the sequence by all-to-all."""

    RING = "ring"
    ULYSSES = "ulysses"


class Fp8Recipe(StrEnum):
    """What runs the linear layers' matmuls in float8 (`vram.memory.fp8`)."""

    NONE = "none"
    TENSORWISE = "tensorwise"  # torchao, one scale per tensor
    ROWWISE = "rowwise"  # torchao, one scale per row
    BLOCKWISE = "blockwise"  # torchao prototype, 1x128 / 128x128 blocks
    TE = "te"  # Transformer Engine


class Framework(StrEnum):
    HF_TRAINER = "hf-trainer"
    LITGPT = "litgpt"
    TORCHTUNE = "torchtune"
    PEFT_ACCELERATE = "peft-accelerate"
    FSDP_QLORA = "fsdp-qlora"
    UNSLOTH = "unsloth"
    TORCHTITAN = "torchtitan"
    DEEPSPEED = "deepspeed"
    AXOLOTL = "axolotl"
    LLAMA_FACTORY = "llama-factory"
    MS_SWIFT = "ms-swift"
    OTHER = "other"
