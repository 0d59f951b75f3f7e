"""LLaMA-Factory YAML (`llamafactory-cli train FILE`) -> setup.

Defaults are read at LLaMA-Factory@ff6d4d1 (main after v0.9.5): `src/llamafactory/hparams/`
`finetuning_args.py` (finetuning_type lora, lora_rank 8, lora_target all, lora_dropout 0,
pure_bf16 False), `model_args.py` (disable_gradient_checkpointing False: it CHECKPOINTS unless
told not to; use_reentrant_gc True; double_quantization True; flash_attn auto),
`data_args.py` (cutoff_len 2048), and Transformers' TrainingArguments for the rest
(per_device_train_batch_size 8, gradient_accumulation_steps 1, bf16 False, optim
adamw_torch_fused with torch >= 2.8). Trainable parameters are cast to fp32 unless pure_bf16
(`src/llamafactory/model/adapter.py` cast_trainable_params_to_fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vram.errors import TrainingConfigError
from vram.io.readers.common import (
    HF_IRRELEVANT,
    TRAINING_ARGS,
    TRANSFORMERS,
    check_one_of,
    map_hf_optimizer,
    map_torch_compile,
    map_training_args_batch,
    resolve_model,
)
from vram.io.readers.mapper import Mapper, shown
from vram.io.readers.parallel import map_deepspeed, map_fsdp
from vram.io.readers.report import ReadResult
from vram.io.readers.vision import map_llamafactory as map_vision
from vram.io.readers.vocab import attention_from_hf, precision_for
from vram.setup import MAX_LORA_RANK, MAX_SEQ_LEN

VERSION = "LLaMA-Factory@ff6d4d1 (main after v0.9.5)"
HPARAMS = "LLaMA-Factory src/llamafactory/hparams"
FINETUNING = f"{HPARAMS}/finetuning_args.py@ff6d4d1"
MODEL_ARGS = f"{HPARAMS}/model_args.py@ff6d4d1"
DATA_ARGS = f"{HPARAMS}/data_args.py@ff6d4d1"

IRRELEVANT = HF_IRRELEVANT | frozenset({
    "dataset", "eval_dataset", "dataset_dir", "template", "max_samples", "val_size",
    "trust_remote_code", "tokenized_path", "adapter_name_or_path", "cache_dir",
    "streaming", "buffer_size", "mix_strategy", "media_dir", "enable_thinking", "lora_alpha",
    "additional_target", "create_new_adapter",
    "ddp_timeout", "print_param_status", "infer_backend", "default_system", "export_dir",
})

_FLASH = {"auto": "sdpa", "disabled": "eager", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash"}
_RL_STAGES = {"rm": "reward model", "ppo": "PPO", "dpo": "DPO", "kto": "KTO"}


def read(data: dict[str, Any], *, base_dir: Path | None = None) -> ReadResult:
    m = Mapper("llamafactory", VERSION, data, IRRELEVANT)
    m.set("framework", "llama-factory", "(format)", "llamafactory")
    model_ref, slug = resolve_model(m, "model_name_or_path")
    stage = m.str_key("stage") or "sft"
    if stage in _RL_STAGES:
        m.record("stage", stage, f"{_RL_STAGES[stage]}: recorded; the policy step is "
                 "estimated, reference/reward models are not modelled")
    elif stage not in ("sft", "pt"):
        raise TrainingConfigError("stage", f"{shown(stage)}: one of pt, sft, rm, ppo, dpo, kto")
    method = _method(m)
    _batch(m)
    _checkpointing(m)
    map_hf_optimizer(m, "optim", "adamw_torch_fused", TRAINING_ARGS)
    _precision(m, method)
    _attention(m)
    _loss(m, stage)
    map_torch_compile(m)
    map_vision(m)
    uses_deepspeed = map_deepspeed(m, "deepspeed", base_dir)
    if map_fsdp(m) and uses_deepspeed:
        raise TrainingConfigError("fsdp", "contradicts deepspeed: use one of them")
    for key in ("pref_beta", "pref_loss", "ref_model", "reward_model", "ppo_epochs"):
        if m.has(key):
            m.record(key, m.get(key), "RL setting (recorded, not modelled)")
    return m.finish(model_ref, slug)


def _method(m: Mapper) -> str:
    kind = m.str_key("finetuning_type")
    if kind is None:
        kind = "lora"
        m.note(f"finetuning_type unset: lora ({FINETUNING})")
    if kind in ("freeze", "oft"):
        raise TrainingConfigError("finetuning_type", f"{kind} is not modelled (full or lora)")
    if kind not in ("full", "lora"):
        raise TrainingConfigError("finetuning_type",
                                  f"{shown(kind)}: one of lora, oft, freeze, full")
    bits = m.int_key("quantization_bit", low=2, high=8) if m.has("quantization_bit") else None
    if kind == "full":
        if bits is not None:
            raise TrainingConfigError("quantization_bit", "quantization needs finetuning_type lora")
        m.set("method", "full", "finetuning_type", kind)
        return "full"
    if bits is None:
        m.set("method", "lora", "finetuning_type", kind)
    else:
        quant_method = (m.str_key("quantization_method") or "bnb").lower()
        if quant_method != "bnb":
            m.set("quant", quant_method, "quantization_method", quant_method, "not modelled")
        elif bits == 4:
            double = m.bool_key("double_quantization")
            dq = True if double is None else double
            m.set("quant", "nf4-dq" if dq else "nf4", "quantization_bit", bits,
                  "bitsandbytes nf4" + (", double quantization (default True, "
                                        f"{MODEL_ARGS})" if dq else ""))
        elif bits == 8:
            m.set("quant", "int8", "quantization_bit", bits)
        else:
            raise TrainingConfigError("quantization_bit", f"{bits}: bitsandbytes takes 4 or 8")
        m.set("method", "qlora", "finetuning_type", kind, f"LoRA on a {bits}-bit base")
    m.int_or_default("lora_rank", "lora_rank", 8, f"lora_rank 8 ({FINETUNING})", high=MAX_LORA_RANK)
    if m.has("lora_dropout"):
        m.set("lora_dropout", m.float_key("lora_dropout", high=0.99), "lora_dropout")
    else:
        m.default("lora_dropout", 0.0, f"lora_dropout 0 ({FINETUNING})")
    target = m.get("lora_target")
    names = target if isinstance(target, list) else str(target or "all").split(",")
    names = [str(n).strip() for n in names if str(n).strip()]
    if names == ["all"]:
        if target is None:
            m.default("lora_targets", "all-linear", f"lora_target all ({FINETUNING})")
        else:
            m.set("lora_targets", "all-linear", "lora_target", target)
    else:
        m.lora_targets("lora_target", names, target)
    return "qlora" if bits is not None else "lora"


def _batch(m: Mapper) -> None:
    map_training_args_batch(m)
    m.int_or_default("seq_len", "cutoff_len", 2048,
                     f"cutoff_len 2048 ({DATA_ARGS})", high=MAX_SEQ_LEN)
    for key in ("packing", "neat_packing"):
        if m.has(key):
            m.record(key, m.bool_key(key), "packing: samples fill cutoff_len")


def _checkpointing(m: Mapper) -> None:
    disabled = m.bool_key("disable_gradient_checkpointing")
    if disabled is None:
        m.default("grad_ckpt", True, f"disable_gradient_checkpointing False ({MODEL_ARGS}): "
                  "LLaMA-Factory checkpoints unless told not to")
    else:
        m.set("grad_ckpt", not disabled, "disable_gradient_checkpointing", disabled)
    if m.has("gradient_checkpointing"):
        m.ignore("gradient_checkpointing", "LLaMA-Factory uses disable_gradient_checkpointing")
    if not m.fields["grad_ckpt"]:
        m.seen("use_reentrant_gc", "use_unsloth_gc")
        return
    if m.bool_key("use_unsloth_gc"):
        m.set("offload", "activations", "use_unsloth_gc", True,
              "Unsloth's checkpointing offloads checkpointed inputs to CPU")
    reentrant = m.bool_key("use_reentrant_gc")
    if reentrant is None:
        m.default("ckpt_reentrant", True, f"use_reentrant_gc True ({MODEL_ARGS})")
    else:
        m.set("ckpt_reentrant", reentrant, "use_reentrant_gc", reentrant)


def _precision(m: Mapper, method: str) -> None:
    check_one_of(m, "bf16", "fp16")
    pure = m.bool_key("pure_bf16") is True
    bf16 = m.bool_key("bf16") is True or pure
    fp16 = m.bool_key("fp16") is True
    if pure:
        m.set("precision", "bf16-true", "pure_bf16", True, "no fp32 copy of trained parameters")
        return
    weights = "bf16" if bf16 and method == "lora" else "fp32"
    precision = precision_for(bf16=bf16, fp16=fp16, weights=weights, method=method)
    key = "bf16" if bf16 else "fp16" if fp16 else "(bf16/fp16 unset)"
    why = {"bf16-true": "frozen base in bf16, LoRA adapters cast to fp32",
           "bf16-mixed": "trainable parameters cast to fp32 (cast_trainable_params_to_fp32)",
           "fp32": f"bf16 False ({TRAINING_ARGS})"}.get(precision, "")
    m.set("precision", precision, key, bf16 or fp16, why)


def _attention(m: Mapper) -> None:
    flash = m.get("flash_attn")
    if flash is None:
        m.default("attention", "sdpa", f"flash_attn auto ({MODEL_ARGS}): Transformers' "
                  f"default sdpa ({TRANSFORMERS})")
        return
    mapped = _FLASH.get(str(flash).lower()) or attention_from_hf(str(flash))
    if mapped is None:
        raise TrainingConfigError("flash_attn", f"{shown(flash)}: auto, disabled, sdpa, fa2 or fa3")
    m.set("attention", mapped, "flash_attn", flash)


def _loss(m: Mapper, stage: str) -> None:
    if m.bool_key("enable_liger_kernel"):
        if stage in ("sft", "pt"):
            m.set("loss", "fused-linear", "enable_liger_kernel", True,
                  "Liger's fused linear cross-entropy (LLaMA-Factory "
                  "src/llamafactory/model/model_utils/liger_kernel.py@ff6d4d1)")
        else:
            m.set("loss", "standard", "enable_liger_kernel", True,
                  "stages that need logits keep them (Liger CE only)")
        return
    m.default("loss", "standard", f"full logits, upcast to fp32 ({TRANSFORMERS})")
