"""The training setup: every knob that changes how much memory one training step needs.

A `TrainingSetup` is frozen and validated; cross-field rules raise `ValueError` with a message
that names the field and says what is allowed. Defaults describe a sensible single-GPU QLoRA run.

    >>> TrainingSetup(method="full", optimizer="adamw", precision="bf16-mixed", micro_batch=4)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Method(StrEnum):
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"


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
    """`standard`: full logits, upcast to fp32 for cross-entropy. `chunked`: chunked or fused."""

    STANDARD = "standard"
    CHUNKED = "chunked"


class Sharding(StrEnum):
    NONE = "none"
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"


class Offload(StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    PARAMS_OPTIMIZER = "params+optimizer"
    ACTIVATIONS = "activations"


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
    OTHER = "other"


#: Names other tools use for the same sharding, accepted on input.
SHARDING_ALIASES: dict[str, Sharding] = {
    "fsdp-full": Sharding.ZERO3,
    "fsdp": Sharding.ZERO3,
    "fsdp-grad-op": Sharding.ZERO2,
    "fsdp-no-shard": Sharding.DDP,
}

#: LoRA target names (PEFT / Hugging Face naming) that `vram` understands.
LORA_TARGET_NAMES: frozenset[str] = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
)
ALL_LINEAR: Literal["all-linear"] = "all-linear"

MAX_MICRO_BATCH = 4096
MAX_SEQ_LEN = 4 * 1024 * 1024
MAX_GPUS = 4096
MAX_LORA_RANK = 4096

class TrainingSetup(BaseModel):
    """How the model is trained: method, numerics, batch shape, parallelism and stack."""

    # Numbers and switches are strict (no "3" -> 3); enums accept their text values.
    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Method = Method.QLORA
    lora_rank: Annotated[int, Field(strict=True, ge=1, le=MAX_LORA_RANK)] = 16
    lora_targets: tuple[str, ...] | Literal["all-linear"] = ALL_LINEAR
    lora_dropout: Annotated[float, Field(strict=False, ge=0.0, lt=1.0)] = 0.05
    quant: Quant | None = None
    optimizer: Optimizer = Optimizer.ADAMW
    precision: Precision = Precision.BF16_MIXED
    micro_batch: Annotated[int, Field(strict=True, ge=1, le=MAX_MICRO_BATCH)] = 1
    seq_len: Annotated[int, Field(strict=True, ge=1, le=MAX_SEQ_LEN)] = 2048
    grad_accum: Annotated[int, Field(strict=True, ge=1, le=1_000_000)] = 1
    grad_ckpt: Annotated[bool, Field(strict=True)] = False
    #: Whether a step as long as the longest can follow another (packed or fixed-length data,
    #: any long run: yes). A stack that keeps the previous step's graph into the next forward
    #: (LitGPT) then holds two long steps at once; with a single longest batch (LitGPT's 2023
    #: scripts put it in the first step only) it does not.
    longest_batch_repeats: Annotated[bool, Field(strict=True)] = True
    #: torch.compile of model and loss; None = the stack's published default.
    compile: Annotated[bool, Field(strict=True)] | None = None
    attention: Attention = Attention.SDPA
    loss: Loss | None = None
    n_gpus: Annotated[int, Field(strict=True, ge=1, le=MAX_GPUS)] = 1
    sharding: Sharding = Sharding.NONE
    offload: Offload = Offload.NONE
    framework: Framework = Framework.HF_TRAINER

    @field_validator(
        "method", "quant", "optimizer", "precision", "attention", "loss", "offload", "framework",
        mode="before",
    )
    @classmethod
    def _enum_from_text(cls, value: object) -> object:
        # Strict mode would refuse the plain strings that come from flags, URLs and CSV rows.
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("sharding", mode="before")
    @classmethod
    def _sharding_alias(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip().lower()
            return SHARDING_ALIASES.get(text, text)
        return value

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _targets_from_text(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.lower() == ALL_LINEAR:
                return ALL_LINEAR
            parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
            return tuple(parts)
        if isinstance(value, list):
            return tuple(value)
        return value

    @field_validator("lora_targets")
    @classmethod
    def _known_targets(cls, value: tuple[str, ...] | str) -> tuple[str, ...] | str:
        if value == ALL_LINEAR:
            return value
        assert isinstance(value, tuple)
        if not value:
            raise ValueError("give at least one LoRA target module, or 'all-linear'")
        unknown = sorted(set(value) - LORA_TARGET_NAMES)
        if unknown:
            allowed = ", ".join(sorted(LORA_TARGET_NAMES))
            raise ValueError(f"unknown module {unknown[0]!r}; allowed: {allowed}, or all-linear")
        # One canonical order, so equal setups compare equal and URLs are stable.
        order = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                 "lm_head"]
        return tuple(name for name in order if name in value)

    @model_validator(mode="after")
    def _consistent(self) -> TrainingSetup:
        quant = self.effective_quant
        if self.method is Method.QLORA and quant is Quant.NONE:
            raise ValueError("quant: QLoRA needs a quantized base (nf4, nf4-dq or int8)")
        if self.method is not Method.QLORA and quant is not Quant.NONE:
            raise ValueError(
                f"quant: {quant.value} is for QLoRA; with method {self.method.value} use none"
            )
        if self.n_gpus == 1 and self.sharding not in (Sharding.NONE, Sharding.ZERO3):
            raise ValueError(
                f"sharding: {self.sharding.value} needs more than one GPU (gpus is 1)"
            )
        if self.n_gpus > 1 and self.sharding is Sharding.NONE:
            raise ValueError(
                f"sharding: {self.n_gpus} GPUs need a strategy (ddp, zero1, zero2 or zero3)"
            )
        sharded = self.sharding in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3)
        if self.offload is Offload.OPTIMIZER and not sharded:
            raise ValueError("offload: optimizer offload needs ZeRO/FSDP sharding (zero1-3)")
        if self.offload is Offload.PARAMS_OPTIMIZER and self.sharding is not Sharding.ZERO3:
            raise ValueError("offload: params+optimizer offload needs zero3 (FSDP full shard)")
        return self

    @property
    def effective_quant(self) -> Quant:
        """The base quantization: NF4 for QLoRA unless another was chosen."""
        if self.quant is not None:
            return self.quant
        return Quant.NF4 if self.method is Method.QLORA else Quant.NONE

    @property
    def effective_loss(self) -> Loss:
        """The loss: this setup's, else the stack's default (`vram.stack.STACKS`)."""
        from vram.stack import effective_loss  # the stack table imports this module

        return effective_loss(self)

    @property
    def effective_compile(self) -> bool:
        """torch.compile: this setup's, else the stack's default (`vram.stack.STACKS`)."""
        from vram.stack import effective_compile  # the stack table imports this module

        return effective_compile(self)

    @property
    def trains_adapters(self) -> bool:
        return self.method is not Method.FULL
