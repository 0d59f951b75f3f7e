"""TRL / Transformers TrainingArguments config (YAML or JSON, as `trl sft --config` takes it).

One file holds TRL's ModelConfig keys (model, dtype, PEFT, bitsandbytes) and the trainer's
config keys. Defaults at trl@f2cd577 (main after v1.9.0): `trl/trainer/base_config.py` turns
`gradient_checkpointing` ON and `bf16` ON unless fp16 (Transformers' TrainingArguments leaves
both off: `transformers/training_args.py@v5.24.0`); `trl/trainer/sft_config.py` max_length 1024,
loss_type `chunked_nll` unless Liger; `trl/trainer/model_config.py` dtype float32, lora_r 16,
lora_dropout 0.05, nested quantization off. DPO and GRPO configs extend the same base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from vram.errors import TrainingConfigError
from vram.io.readers.common import (
    HF_IRRELEVANT,
    TRAINING_ARGS,
    TRANSFORMERS,
    check_one_of,
    map_hf_optimizer,
    map_reentrant,
    map_torch_compile,
    map_training_args_batch,
    resolve_model,
)
from vram.io.readers.mapper import Mapper, shown
from vram.io.readers.parallel import map_deepspeed, map_fsdp
from vram.io.readers.report import ReadResult
from vram.io.readers.vision import map_trl as map_vision
from vram.io.readers.vocab import attention_from_hf, precision_for
from vram.setup import MAX_LORA_RANK, MAX_SEQ_LEN

Trainer = Literal["sft", "dpo", "grpo", "training-arguments"]
VERSION = "trl@f2cd577 (main after v1.9.0) + transformers@v5.24.0"
BASE = "trl/trainer/base_config.py@f2cd577"
SFT = "trl/trainer/sft_config.py@f2cd577"
MODEL = "trl/trainer/model_config.py@f2cd577"

IRRELEVANT = HF_IRRELEVANT | frozenset({
    "dataset_mixer", "dataset_splits", "model_init_kwargs", "packing_strategy",
    "average_tokens_across_devices", "padding_free", "pad_to_multiple_of", "eval_packing",
    "shuffle_dataset", "max_grad_norm", "reward_funcs", "reward_weights", "system_prompt",
    "log_completions", "num_completions_to_print", "callbacks", "benchmarks", "hub_model_revision",
    "dataset_prompt_column", "wandb_log_unique_prompts", "scale_rewards", "generation_kwargs",
})

_GRPO_KEYS = ("num_generations", "max_completion_length", "use_vllm", "vllm_mode",
              "vllm_gpu_memory_utilization", "reward_funcs", "num_iterations", "epsilon")
_DPO_KEYS = ("max_prompt_length", "rpo_alpha", "ref_model_init_kwargs", "precompute_ref_log_probs")
_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
           "float32": "fp32", "fp32": "fp32", "float": "fp32", "auto": "bf16"}
_PEFT_TARGETS = ("PEFT's per-architecture default q_proj,v_proj for Llama/Mistral/Qwen "
                 "(peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)")


def infer_trainer(data: dict[str, Any]) -> Trainer:
    """Which config class the keys belong to (GRPO and DPO keys win; SFT otherwise)."""
    if any(k in data for k in _GRPO_KEYS):
        return "grpo"
    if any(k in data for k in _DPO_KEYS) or ("beta" in data and "loss_type" in data):
        return "dpo"
    if "beta" in data:
        return "dpo"
    return "sft"


def read(data: dict[str, Any], *, base_dir: Path | None = None,
         trainer: Trainer | None = None) -> ReadResult:
    kind: Trainer = trainer or infer_trainer(data)
    trl_defaults = kind != "training-arguments"
    m = Mapper("trl", VERSION, data, IRRELEVANT)
    m.set("framework", "hf-trainer", "(format)", f"trl {kind}")
    m.note(f"read as {kind} config" + ("" if trainer else " (inferred from its keys)"))
    model_ref, slug = resolve_model(m, "model_name_or_path")
    method = _method(m)
    _batch(m, kind)
    _checkpointing(m, trl_defaults)
    map_hf_optimizer(m, "optim", "adamw_torch_fused", TRAINING_ARGS + " (torch >= 2.8)")
    _precision(m, method, trl_defaults)
    attention = m.str_key("attn_implementation")
    if attention is None:
        m.default("attention", "sdpa", f"attn_implementation None: sdpa ({TRANSFORMERS})")
    else:
        mapped = attention_from_hf(attention)
        m.set("attention", mapped or attention, "attn_implementation", attention,
              "" if mapped else "not modelled")
    _loss(m, kind)
    map_torch_compile(m)
    if m.bool_key("activation_offloading"):
        m.set("offload", "activations", "activation_offloading", True)
    uses_deepspeed = map_deepspeed(m, "deepspeed", base_dir)
    if map_fsdp(m) and uses_deepspeed:
        raise TrainingConfigError("fsdp", "contradicts deepspeed: use one of them")
    if (kind in ("dpo", "grpo") and uses_deepspeed and method != "full"
            and m.fields.get("sharding") == "zero3" and m.fields.get("grad_ckpt")):
        m.redefault("ckpt_reentrant", True, f"trl/trainer/{kind}_trainer.py@f2cd577 forces "
                    "use_reentrant=True for PEFT under DeepSpeed ZeRO-3")
    _rl(m, kind)
    map_vision(m)
    return m.finish(model_ref, slug)


def _method(m: Mapper) -> str:
    check_one_of(m, "load_in_4bit", "load_in_8bit")
    peft = m.bool_key("use_peft") is True
    four = m.bool_key("load_in_4bit") is True
    eight = m.bool_key("load_in_8bit") is True
    if not peft:
        if four or eight:
            raise TrainingConfigError("load_in_4bit" if four else "load_in_8bit",
                                      f"works only with LoRA: set use_peft: true ({MODEL})")
        m.set("method", "full", "use_peft", m.get("use_peft", False), "no PEFT: full fine-tuning")
        m.seen("lora_r", "lora_dropout", "lora_target_modules", "bnb_4bit_quant_type",
               "use_bnb_nested_quant")
        return "full"
    if four:
        qtype = (m.str_key("bnb_4bit_quant_type") or "nf4").lower()
        if qtype != "nf4":
            m.set("quant", qtype, "bnb_4bit_quant_type", qtype, "not modelled")
        else:
            nested = m.bool_key("use_bnb_nested_quant") is True
            m.set("quant", "nf4-dq" if nested else "nf4", "load_in_4bit", True,
                  "nested quantization" if nested else f"use_bnb_nested_quant False ({MODEL})")
        m.set("method", "qlora", "use_peft", True, "LoRA on a 4-bit base")
    elif eight:
        m.set("quant", "int8", "load_in_8bit", True)
        m.set("method", "qlora", "use_peft", True, "LoRA on an 8-bit base")
    else:
        m.set("method", "lora", "use_peft", True)
    m.int_or_default("lora_rank", "lora_r", 16, f"lora_r 16 ({MODEL})", high=MAX_LORA_RANK)
    if m.has("lora_dropout"):
        m.set("lora_dropout", m.float_key("lora_dropout", high=0.99), "lora_dropout")
    else:
        m.default("lora_dropout", 0.05, f"lora_dropout 0.05 ({MODEL})")
    targets = m.get("lora_target_modules")
    if targets is None:
        m.default("lora_targets", ("q_proj", "v_proj"), _PEFT_TARGETS)
    elif targets == "all-linear" or targets == ["all-linear"]:
        m.set("lora_targets", "all-linear", "lora_target_modules", targets)
    else:
        m.lora_targets("lora_target_modules", [targets] if isinstance(targets, str) else targets,
                       targets)
    return m.fields["method"]  # type: ignore[no-any-return]


def _batch(m: Mapper, kind: Trainer) -> None:
    map_training_args_batch(m)
    high = MAX_SEQ_LEN
    if kind == "grpo":
        prompt = m.int_key("max_prompt_length", high=high)
        completion = m.int_key("max_completion_length", high=high) or 512
        if prompt is None:
            m.default("seq_len", 512 + completion, "max_prompt_length unset: 512 assumed + "
                      "max_completion_length (trl/trainer/grpo_config.py@f2cd577: 512)")
        else:
            m.set("seq_len", prompt + completion, "max_prompt_length + max_completion_length",
                  f"{prompt}+{completion}", "the policy's training step sees prompt+completion")
        return
    for key in ("max_length", "max_seq_length"):
        if m.has(key):
            m.set("seq_len", m.int_key(key, high=high), key,
                  why="" if key == "max_length" else "older TRL name of max_length")
            m.seen("max_length", "max_seq_length")
            break
    else:
        if kind == "training-arguments":
            m.default("seq_len", 2048,
                      "vram's default: TrainingArguments has no length; pass --seq")
        else:
            m.default("seq_len", 1024, f"max_length 1024 ({SFT}; DPO the same)")
    if m.has("packing"):
        m.record("packing", m.bool_key("packing"), "packing: sequences fill max_length")


def _checkpointing(m: Mapper, trl_defaults: bool) -> None:
    value = m.bool_key("gradient_checkpointing")
    if value is None:
        value = m.bool_key("activation_checkpointing")
        key = "activation_checkpointing"
    else:
        key = "gradient_checkpointing"
    if value is None:
        if trl_defaults:
            m.default("grad_ckpt", True, f"gradient_checkpointing True ({BASE}): TRL turns it "
                      "on, TrainingArguments does not")
        else:
            m.default("grad_ckpt", False, f"gradient_checkpointing False ({TRAINING_ARGS})")
    else:
        m.set("grad_ckpt", value, key)
    if m.fields["grad_ckpt"]:
        map_reentrant(m, "gradient_checkpointing_kwargs", False, "use_reentrant False when no "
                      "kwargs (transformers/modeling_utils.py@v5.24.0); TRL forces True for "
                      "PEFT under ZeRO-3")
    else:
        m.seen("gradient_checkpointing_kwargs")


def _precision(m: Mapper, method: str, trl_defaults: bool) -> None:
    fp16 = m.bool_key("fp16") is True
    bf16_value = m.bool_key("bf16")
    if bf16_value and fp16:
        raise TrainingConfigError("fp16", "contradicts bf16: set only one")
    if bf16_value is None:
        bf16 = trl_defaults and not fp16
        m.note(f"bf16 unset: {'on' if bf16 else 'off'} "
               f"({BASE if trl_defaults else TRAINING_ARGS})")
    else:
        bf16 = bf16_value
    tf32 = m.bool_key("tf32")
    if tf32 is not None:
        m.record("tf32", tf32, "TF32 matmuls: speed only, no memory change")
    dtype_key = "dtype" if m.has("dtype") else "torch_dtype"
    raw = m.str_key(dtype_key)
    m.seen("dtype", "torch_dtype")
    if raw is None:
        weights = "fp32"
        m.note(f"dtype unset: float32 ({MODEL})")
    else:
        weights = _DTYPES.get(raw.lower(), "")
        if not weights:
            raise TrainingConfigError(dtype_key,
                                      f"{shown(raw)}: bfloat16, float16, float32 or auto")
        m.record(dtype_key, raw, f"weights loaded in {weights}"
                 + (" (auto: the checkpoint's dtype, bf16 for recent models)" if raw == "auto"
                    else ""))
    precision = precision_for(bf16=bf16, fp16=fp16, weights=weights, method=method)
    why = ("weights loaded in bf16 and trained without an fp32 copy"
           if precision == "bf16-true" else "")
    m.set("precision", precision, "fp16" if fp16 else "bf16", fp16 or bf16, why)


def _loss(m: Mapper, kind: Trainer) -> None:
    liger = m.bool_key("use_liger_kernel") is True
    loss_type = m.str_key("loss_type")
    if liger:
        m.set("loss", "fused-linear", "use_liger_kernel", True, "Liger fused linear cross-entropy")
        return
    if kind == "sft":
        if loss_type is None:
            m.default("loss", "chunked", f"loss_type chunked_nll ({SFT})")
        elif loss_type == "chunked_nll":
            m.set("loss", "chunked", "loss_type", loss_type)
        else:
            m.set("loss", "standard", "loss_type", loss_type)
        return
    if loss_type is not None:
        m.record("loss_type", loss_type, f"{kind} loss (recorded)")
    m.default("loss", "standard", f"full logits ({TRANSFORMERS})")


def _rl(m: Mapper, kind: Trainer) -> None:
    if kind == "grpo":
        m.record("(trainer)", "grpo", "GRPO: recorded; generation, the reference model and "
                 "vLLM are not modelled; the policy step is estimated")
        for key in ("num_generations", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization",
                    "beta", "num_iterations", "epsilon", "temperature"):
            if m.has(key):
                m.record(key, m.get(key), "RL generation/algorithm setting (recorded)")
    elif kind == "dpo":
        m.record("(trainer)", "dpo", "DPO: recorded; chosen and rejected run together "
                 "(twice the sequences per step) and a reference model is loaded unless PEFT: "
                 "not modelled yet")
        for key in ("beta", "max_prompt_length", "rpo_alpha", "precompute_ref_log_probs"):
            if m.has(key):
                m.record(key, m.get(key), "DPO setting (recorded)")
