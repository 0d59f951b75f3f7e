"""An RL post-training run: the algorithm, its models, the rollout engine and the batch shape.

`RLSetup` is frozen and validated; a bad combination raises `ValueError` naming the field.
The policy's own training knobs (method, optimizer, precision, sharding, ...) are a
`TrainingSetup` (`policy`); `vram.rl` sets its batch and sequence length from the rollout.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vram.setup import MAX_MICRO_BATCH, Method, Sharding, TrainingSetup


class Algo(StrEnum):
    DPO = "dpo"
    KTO = "kto"
    ORPO = "orpo"
    SIMPO = "simpo"
    PPO = "ppo"
    GRPO = "grpo"
    RLOO = "rloo"


class Rollout(StrEnum):
    """Where generation runs. NONE: offline preference pairs (DPO-style), no engine."""

    COLOCATE = "colocate"
    SERVER = "server"
    SHARED = "shared"
    HF_GENERATE = "hf-generate"
    NONE = "none"


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


class Reference(StrEnum):
    """How the reference log-probs are had. AUTO: the algorithm's and the stack's default."""

    AUTO = "auto"
    MODEL = "model"
    ADAPTER_OFF = "adapter-off"
    PRECOMPUTED = "precomputed"
    NONE = "none"


#: Preference algorithms: offline pairs, no generation.
OFFLINE: frozenset[Algo] = frozenset({Algo.DPO, Algo.KTO, Algo.ORPO, Algo.SIMPO})
#: Algorithms that never use a reference model (ORPO, SimPO are reference-free).
REFERENCE_FREE: frozenset[Algo] = frozenset({Algo.ORPO, Algo.SIMPO})
#: Algorithms whose reference exists only when the KL weight is above 0 (TRL GRPO/RLOO).
KL_GATED: frozenset[Algo] = frozenset({Algo.GRPO, Algo.RLOO})

MAX_GENERATIONS = 1024
MAX_TOKENS = 1024 * 1024
#: Sequences one GPU trains on per step: they are the policy step's micro-batch, so the
#: policy's own bound (`TrainingSetup.micro_batch`) is theirs.
MAX_SEQUENCES = MAX_MICRO_BATCH
MAX_BATCH = 4096
#: Pair algorithms train on the chosen and the rejected completion of each prompt.
PAIRED: frozenset[Algo] = frozenset({Algo.DPO, Algo.ORPO, Algo.SIMPO})


def sequences_per_prompt(algo: Algo, num_generations: int) -> int:
    """Sequences the policy trains on per prompt: 2 for pairs, 1 for KTO, G otherwise."""
    if algo in PAIRED:
        return 2
    return 1 if algo in OFFLINE else num_generations


def max_batch(algo: Algo | str, num_generations: int) -> int:
    """The most prompts per GPU whose sequences stay within `MAX_SEQUENCES` (at least 1)."""
    per_prompt = sequences_per_prompt(Algo(algo), max(1, num_generations))
    return max(1, min(MAX_BATCH, MAX_SEQUENCES // per_prompt))



class RLSetup(BaseModel):
    """One RL step's shape and placement. `batch` is prompts (preference pairs) per GPU."""

    # Numbers are strict (no "3" -> 3); enums accept their text values.
    model_config = ConfigDict(frozen=True, extra="forbid")

    algo: Algo = Algo.GRPO
    policy: TrainingSetup = Field(default_factory=lambda: TrainingSetup(method=Method.LORA))
    num_generations: Annotated[int, Field(strict=True, ge=1, le=MAX_GENERATIONS)] = 8
    prompt_len: Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS)] = 512
    completion_len: Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS)] = 256
    batch: Annotated[int, Field(strict=True, ge=1, le=MAX_BATCH)] = 1
    beta: Annotated[float, Field(ge=0.0, le=100.0)] = 0.0
    reference: Reference = Reference.AUTO
    reward_model: Annotated[bool, Field(strict=True)] = False
    rollout: Rollout = Rollout.COLOCATE
    engine: Engine = Engine.VLLM
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] = 0.3
    sleep: Annotated[int, Field(strict=True, ge=0, le=2)] = 0
    #: GPUs of the generation server (rollout=server); the training GPUs are `policy.n_gpus`.
    rollout_gpus: Annotated[int, Field(strict=True, ge=1, le=4096)] = 1
    #: The logits of the loss computed in chunks (Liger's chunked GRPO/DPO loss).
    chunked_loss: Annotated[bool, Field(strict=True)] = False

    @model_validator(mode="after")
    def _consistent(self) -> RLSetup:
        if self.sequences_per_gpu > MAX_SEQUENCES:
            per = sequences_per_prompt(self.algo, self.num_generations)
            raise ValueError(
                f"batch x num_generations: {self.batch} prompts x {per} sequences = "
                f"{self.sequences_per_gpu:,} sequences per GPU; at most {MAX_SEQUENCES:,} "
                f"(batch at most {max_batch(self.algo, self.num_generations):,} here)")
        if self.sleep and self.rollout not in (Rollout.COLOCATE, Rollout.SHARED):
            raise ValueError(
                f"sleep: sleep mode frees the engine's memory for a colocated trainer; with "
                f"rollout {self.rollout.value} use sleep 0 (or rollout colocate)")
        if self.algo in OFFLINE and self.rollout not in (Rollout.NONE, Rollout.COLOCATE):
            raise ValueError(
                f"rollout: {self.algo.value} trains on offline pairs and generates nothing; "
                "use rollout none")
        if self.algo in KL_GATED and self.beta == 0.0 and self.reference in (
                Reference.MODEL, Reference.ADAPTER_OFF, Reference.PRECOMPUTED):
            raise ValueError(
                f"reference: {self.algo.value} with beta=0 loads no reference (TRL "
                "GRPOConfig.beta: 'If 0.0, the reference model is not loaded'); set beta > 0 "
                "or reference auto/none")
        if self.algo in REFERENCE_FREE and self.reference not in (Reference.AUTO, Reference.NONE):
            raise ValueError(f"reference: {self.algo.value} is reference-free; use auto or none")
        if self.reference is Reference.ADAPTER_OFF and not self.policy.trains_adapters:
            raise ValueError(
                "reference: adapter-off needs a LoRA/QLoRA policy (method is full)")
        if self.reference is Reference.PRECOMPUTED and self.algo not in (Algo.DPO, Algo.KTO):
            raise ValueError("reference: precomputed log-probs exist for offline DPO/KTO only")
        if self.rollout is Rollout.SHARED and not self.policy.trains_adapters:
            raise ValueError(
                "rollout: shared weights (Unsloth fast_inference) need a LoRA/QLoRA policy")
        if self.rollout is Rollout.SHARED and self.engine is not Engine.VLLM:
            raise ValueError("engine: shared weights (Unsloth) run vLLM only")
        return self

    @property
    def generates(self) -> bool:
        return self.algo not in OFFLINE and self.rollout is not Rollout.NONE

    @property
    def uses_engine(self) -> bool:
        return self.generates and self.rollout is not Rollout.HF_GENERATE

    @property
    def effective_generations(self) -> int:
        return 1 if self.algo in OFFLINE else self.num_generations

    @property
    def effective_reference(self) -> Reference:
        """AUTO resolved: none for reference-free algorithms and GRPO/RLOO with beta 0; the
        adapter-disabled base under PEFT (TRL, verl); else a frozen copy."""
        if self.reference is not Reference.AUTO:
            return self.reference
        if self.algo in REFERENCE_FREE or (self.algo in KL_GATED and self.beta == 0.0):
            return Reference.NONE
        return Reference.ADAPTER_OFF if self.policy.trains_adapters else Reference.MODEL

    @property
    def sequences_per_gpu(self) -> int:
        """Sequences the policy trains on per step: pairs count twice (chosen + rejected)."""
        return self.batch * sequences_per_prompt(self.algo, self.num_generations)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len

    @property
    def sharded_weights(self) -> bool:
        return self.policy.sharding is Sharding.ZERO3
