"""The training setup: every knob a person sets, each declared once with how people meet it
(`Knob`), validated and frozen (`TrainingSetup`); the choices of the enumerated knobs.

    >>> from vram.setup import TrainingSetup, Method
    >>> TrainingSetup(method=Method.LORA, seq_len=4096).trains_adapters
    True
"""

from vram.setup.enums import (
    Attention,
    ContextParallel,
    ExpertBanks,
    Experts,
    Fp8Recipe,
    Framework,
    Loss,
    Method,
    Offload,
    Optimizer,
    PipelineSchedule,
    Precision,
    Quant,
    Sharding,
)
from vram.setup.knob import Knob
from vram.setup.lora_targets import ALL_LINEAR, LORA_TARGET_NAMES, LORA_TARGETS, parse_lora_targets
from vram.setup.training import (
    ADAPTERS,
    BNB_VERSION,
    CASE_FILE_DEEPSPEED_NAMES,
    FSDP_SHARDING_NAMES,
    MAX_CONTEXT_MIB,
    MAX_GPUS,
    MAX_LORA_RANK,
    MAX_MICRO_BATCH,
    MAX_SEQ_LEN,
    SHARDING_ALIASES,
    TORCH_VERSION,
    TrainingSetup,
)

__all__ = [
    "ADAPTERS",
    "ALL_LINEAR",
    "BNB_VERSION",
    "CASE_FILE_DEEPSPEED_NAMES",
    "FSDP_SHARDING_NAMES",
    "LORA_TARGETS",
    "LORA_TARGET_NAMES",
    "MAX_CONTEXT_MIB",
    "MAX_GPUS",
    "MAX_LORA_RANK",
    "MAX_MICRO_BATCH",
    "MAX_SEQ_LEN",
    "SHARDING_ALIASES",
    "TORCH_VERSION",
    "Attention",
    "ContextParallel",
    "ExpertBanks",
    "Experts",
    "Fp8Recipe",
    "Framework",
    "Knob",
    "Loss",
    "Method",
    "Offload",
    "Optimizer",
    "PipelineSchedule",
    "Precision",
    "Quant",
    "Sharding",
    "TrainingSetup",
    "parse_lora_targets",
]
