"""Levers: changes to a setup that save memory, each paid for in time, GPUs or quality.

A lever is evaluated by estimating the changed setup, never by a rule of thumb: its saved
bytes are the difference of two estimates, its time factor the ratio of two times from the
throughput model. Each carries a quality note with its source.

    quality tier 0: the same math (checkpointing, sharding, offload, chunked loss, kernels)
    quality tier 1: small numeric changes with published parity (8-bit optimizer, NF4 base)
    quality tier 2: trains something else (LoRA instead of full, fewer targets, pure bf16)
    quality tier 3: changes the data or the hardware (shorter sequences, more GPUs)

A lever is a saving only where it saves: on some setups a lever holds more memory than it
frees (pure bf16 on a QLoRA run loses the fused attention kernel and keeps the s x s scores:
+142 GB for 70B). Such a lever is reported apart, as what it would cost (`costs_memory`),
never as a negative saving.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from vram.setup import (
    ALL_LINEAR,
    Attention,
    Loss,
    Method,
    Offload,
    Optimizer,
    Precision,
    Sharding,
    TrainingSetup,
)
from vram.stacks.resolve import resolve

Change = dict[str, Any]


@dataclass(frozen=True, slots=True)
class LeverSpec:
    """One lever: what it changes (`change` returns None where it does not apply)."""

    name: str
    #: Levers on the same knob exclude each other in a path (one optimizer, one offload).
    knob: str
    quality_tier: int
    quality_note: str
    change: Callable[[TrainingSetup], Change | None]


def costs_memory(saved_bytes: int) -> bool:
    """Whether a lever that frees `saved_bytes` (its peak before minus after) frees nothing:
    it holds as much or more; it is not listed among the savings."""
    return saved_bytes <= 0


def applied(setup: TrainingSetup, change: Change) -> TrainingSetup | None:
    """The setup with `change`, validated; None when the combination is not allowed."""
    try:
        return TrainingSetup.model_validate({**setup.model_dump(), **change})
    except ValidationError:
        return None


def describe_change(before: TrainingSetup, after: TrainingSetup) -> str:
    """'grad_ckpt: False -> True; optimizer: adamw -> adamw-8bit' (fields that differ)."""
    old, new = before.model_dump(mode="json"), after.model_dump(mode="json")
    parts = [f"{key}: {_text(old[key])} -> {_text(new[key])}"
             for key in new if old.get(key) != new[key]]
    return "; ".join(parts)


def _text(value: Any) -> str:
    if value is None:
        return "the stack's default"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _checkpointing(s: TrainingSetup) -> Change | None:
    return None if s.grad_ckpt else {"grad_ckpt": True}


def _chunked_loss(s: TrainingSetup) -> Change | None:
    return None if resolve(s).run.loss is Loss.CHUNKED else {"loss": Loss.CHUNKED}


_ADAM_32 = (Optimizer.ADAMW, Optimizer.PAGED_ADAMW)


def _adam_8bit(s: TrainingSetup) -> Change | None:
    return {"optimizer": Optimizer.ADAMW_8BIT} if s.optimizer in _ADAM_32 else None


def _paged_8bit(s: TrainingSetup) -> Change | None:
    if s.optimizer in (*_ADAM_32, Optimizer.ADAMW_8BIT):
        return {"optimizer": Optimizer.PAGED_ADAMW_8BIT}
    return None


def _in_backward(s: TrainingSetup) -> Change | None:
    ok = s.optimizer is Optimizer.ADAMW and s.grad_accum == 1
    return {"optimizer": Optimizer.ADAMW_IN_BACKWARD} if ok else None


def _lora(s: TrainingSetup) -> Change | None:
    if s.method is not Method.FULL:
        return None
    return {"method": Method.LORA, "lora_rank": 16, "lora_targets": ALL_LINEAR}


def _qlora(s: TrainingSetup) -> Change | None:
    if s.method is Method.QLORA:
        return None
    change: Change = {"method": Method.QLORA, "quant": None}
    if s.method is Method.FULL:
        change.update(lora_rank=16, lora_targets=ALL_LINEAR)
    return change


def _lower_rank(s: TrainingSetup) -> Change | None:
    return {"lora_rank": s.lora_rank // 2} if s.trains_adapters and s.lora_rank > 8 else None


def _fewer_targets(s: TrainingSetup) -> Change | None:
    few = ("q_proj", "v_proj")
    if not s.trains_adapters or s.lora_targets == few:
        return None
    return {"lora_targets": few}


def _shorter_sequence(s: TrainingSetup) -> Change | None:
    return {"seq_len": s.seq_len // 2} if s.seq_len >= 512 else None


def _micro_batch_one(s: TrainingSetup) -> Change | None:
    if s.micro_batch == 1:
        return None
    return {"micro_batch": 1, "grad_accum": s.grad_accum * s.micro_batch}


def _zero3(s: TrainingSetup) -> Change | None:
    if s.n_gpus == 1 or s.sharding is Sharding.ZERO3:
        return None
    return {"sharding": Sharding.ZERO3}




def _offload_optimizer(s: TrainingSetup) -> Change | None:
    if s.offload is not Offload.NONE:
        return None
    sharding = s.sharding if s.sharding.shards_optimizer else (
        Sharding.ZERO3 if s.n_gpus == 1 else Sharding.ZERO2)
    return {"offload": Offload.OPTIMIZER, "sharding": sharding}


def _offload_params(s: TrainingSetup) -> Change | None:
    if s.offload in (Offload.PARAMS_OPTIMIZER, Offload.ACTIVATIONS):
        return None
    return {"offload": Offload.PARAMS_OPTIMIZER, "sharding": Sharding.ZERO3}


def _offload_activations(s: TrainingSetup) -> Change | None:
    return {"offload": Offload.ACTIVATIONS} if s.offload is Offload.NONE else None


def _bf16_true(s: TrainingSetup) -> Change | None:
    return None if s.precision is Precision.BF16_TRUE else {"precision": Precision.BF16_TRUE}


def _attention(s: TrainingSetup) -> Change | None:
    return {"attention": Attention.SDPA} if s.attention is Attention.EAGER else None


CHEN_2016 = "Chen et al. 2016, 'Training Deep Nets with Sublinear Memory Cost'"
DETTMERS_2022 = "Dettmers et al. 2022, '8-bit Optimizers via Block-wise Quantization' (ICLR)"
DETTMERS_2023 = "Dettmers et al. 2023, 'QLoRA: Efficient Finetuning of Quantized LLMs'"

#: Every lever the planner knows, in the order they are listed when savings tie.
LEVERS: tuple[LeverSpec, ...] = (
    LeverSpec("activation checkpointing", "grad_ckpt", 0,
              f"Same math: each layer's forward runs again in the backward ({CHEN_2016}).",
              _checkpointing),
    LeverSpec("chunked cross-entropy", "loss", 0,
              "Same loss, computed a chunk of tokens at a time without the full fp32 logits "
              "(torchtune CEWithChunkedOutputLoss; Liger Kernel's fused linear "
              "cross-entropy, Hsu et al. 2024).", _chunked_loss),
    LeverSpec("8-bit AdamW", "optimizer", 1,
              f"Block-wise 8-bit states matched 32-bit Adam on every task tested "
              f"({DETTMERS_2022}).", _adam_8bit),
    LeverSpec("paged 8-bit AdamW", "optimizer", 1,
              f"8-bit parity ({DETTMERS_2022}); paged state moves to host memory under "
              f"pressure, which is slow while it happens ({DETTMERS_2023}, 'Paged "
              f"Optimizers').", _paged_8bit),
    LeverSpec("optimizer step in the backward", "optimizer", 0,
              "Same AdamW update, applied as each gradient is ready; rules out gradient "
              "accumulation and global-norm clipping (torchtune memory_optimizations "
              "tutorial, 'Fusing Optimizer Step into Backward Pass').", _in_backward),
    LeverSpec("LoRA instead of full", "method", 2,
              "LoRA matched full fine-tuning on GLUE and GPT-3 tasks (Hu et al. 2021, "
              "'LoRA') but learns less on code and math (Biderman et al. 2024, 'LoRA Learns "
              "Less and Forgets Less').", _lora),
    LeverSpec("QLoRA (4-bit NF4 base)", "method", 1,
              f"NF4 QLoRA matched 16-bit LoRA and full fine-tuning on the paper's benchmarks "
              f"({DETTMERS_2023}, sections 4-5).", _qlora),
    LeverSpec("lower LoRA rank", "lora_rank", 1,
              f"With adapters on every linear layer the rank barely changed results "
              f"({DETTMERS_2023}, section 4).", _lower_rank),
    LeverSpec("fewer LoRA targets (q, v)", "lora_targets", 2,
              f"Adapting attention only fell short of full fine-tuning; every linear layer "
              f"was needed to match it ({DETTMERS_2023}, section 4).", _fewer_targets),
    LeverSpec("shorter sequence (half)", "seq_len", 3,
              "Changes the data: longer samples are cut or split, so the model sees less "
              "context per sample.", _shorter_sequence),
    LeverSpec("micro-batch 1 + accumulation", "micro_batch", 0,
              "Same global batch and the same update (the mean over the same samples); "
              "small matmuls run at a lower utilization, which the time model does not "
              "price.", _micro_batch_one),
    LeverSpec("ZeRO-3 / FSDP full shard", "sharding", 0,
              "Same math; weights are gathered layer by layer, about 1.5x the "
              "communication of DDP (Rajbhandari et al. 2020, 'ZeRO').", _zero3),
    LeverSpec("CPU offload of the optimizer", "offload", 0,
              "Same math; every step waits on the host link and the CPU's Adam (Ren et "
              "al. 2021, 'ZeRO-Offload').", _offload_optimizer),
    LeverSpec("CPU offload of parameters and optimizer", "offload", 0,
              "Same math; weights cross the host link for every forward and backward "
              "(Rajbhandari et al. 2021, 'ZeRO-Infinity').", _offload_params),
    LeverSpec("activation offload", "offload", 0,
              "Same math; saved activations wait in host memory, copied on a side stream "
              "(torchtune README: -0.1 % tokens/s).", _offload_activations),
    LeverSpec("bf16-true instead of mixed", "precision", 2,
              "Pure bf16 weights lose updates smaller than their rounding step (Zamirai et "
              "al. 2020, 'Revisiting BFloat16 Training'); Kahan summation or stochastic "
              "rounding recovers most of it.", _bf16_true),
    LeverSpec("SDPA attention instead of eager", "attention", 0,
              "Exact attention computed in tiles, without the s x s matrix (Dao et al. "
              "2022, 'FlashAttention').", _attention),
)

#: The lever that changes the hardware rather than the setup (evaluated by the planner).
MORE_GPUS = LeverSpec(
    "twice the GPUs", "hardware", 3,
    "Same math (ZeRO-3 when sharding is needed); the run costs about the same and ends "
    "sooner, less the communication the time model does not price.", lambda s: None)

#: Quality cost per tier, in the same unit as a time cost (0.05 = as bad as 5 % more time),
#: so the path prefers the same math, then published parity, then changes to what trains.
TIER_PENALTY: dict[int, float] = {0: 0.0, 1: 0.05, 2: 0.3, 3: 1.0}
