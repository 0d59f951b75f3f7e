"""ms-swift (`swift sft|pt|rlhf`) -> setup: its launch script or its config file.

Two forms, one reader. A launch script (`NPROC_PER_NODE=2 MAX_PIXELS=1003520 swift sft
--model ... \\`) is read as text by `swift_command` (never run); ms-swift's own config file,
`swift sft config.yaml` (`swift/cli/main.py@3602360a` `parse_yaml_args`: each key a flag, an
`ENV` mapping for the environment), is YAML/JSON read by `safe_yaml`. Both arrive here as
flags plus `ENV`.

Defaults at ms-swift@3602360a (main, 2026-08-22, after v4.4.3; v4 renamed `train_type` to
`tuner_type`, the name 3.x scripts still use): `swift/arguments/base_args/base_args.py`
tuner_type lora, packing False; `swift/arguments/tuner_args.py` target_modules all-linear,
lora_rank 8, lora_dropout 0.05, freeze_vit True, freeze_aligner True;
`swift/arguments/base_args/model_args.py` torch_dtype and attn_impl None (the checkpoint's
config.json), bf16/fp16 from torch_dtype (`_init_mixed_precision`: bfloat16 -> bf16, float16
and float32 -> fp16); `.../quant_args.py` bnb nf4 with double quantization;
`.../template_args.py` max_length None (the model's max_model_len); `swift/trainers/
arguments.py` per_device_train_batch_size 1, gradient_accumulation_steps ceil(16 / batch /
world size), gradient_checkpointing True (Transformers' own default is off);
`swift/trainers/mixin.py` `_fix_gradient_checkpointing` use_reentrant False under plain DDP,
else True. Training runs in Transformers' Trainer (`swift/trainers/seq2seq_trainer.py`
Seq2SeqTrainer); the stack is `ms-swift`, the HF Trainer's row but for what ms-swift does
itself (no `prepare_model_for_kbit_training` for QLoRA: `data/stacks.toml`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vram.errors import TrainingConfigError
from vram.io.readers.common import (
    HF_IRRELEVANT,
    TRAINING_ARGS,
    TRANSFORMERS,
    map_hf_optimizer,
    map_reentrant,
    map_torch_compile,
    resolve_model,
)
from vram.io.readers.mapper import Mapper, shown
from vram.io.readers.parallel import map_deepspeed
from vram.io.readers.report import ReadResult
from vram.io.readers.swift_command import ShellExpansion, SwiftCommand
from vram.io.readers.swift_env import map_environment
from vram.io.readers.vocab import attention_from_hf, precision_for
from vram.setup import MAX_GPUS, MAX_LORA_RANK, MAX_SEQ_LEN
from vram.setup.vision import MAX_PIXELS

AT = "@3602360a"
VERSION = "ms-swift@3602360a (main after v4.4.3)"
BASE_ARGS = f"swift/arguments/base_args/base_args.py{AT}"
TUNER_ARGS = f"swift/arguments/tuner_args.py{AT}"
MODEL_ARGS = f"swift/arguments/base_args/model_args.py{AT}"
QUANT_ARGS = f"swift/arguments/base_args/quant_args.py{AT}"
TEMPLATE_ARGS = f"swift/arguments/base_args/template_args.py{AT}"
SFT_ARGS = f"swift/arguments/sft_args.py{AT}"
TRAIN_ARGS = f"swift/trainers/arguments.py{AT}"
MIXIN = f"swift/trainers/mixin.py{AT} _fix_gradient_checkpointing"

IRRELEVANT = HF_IRRELEVANT | frozenset({
    "dataset", "val_dataset", "cached_dataset", "split_dataset_ratio", "system", "model_author",
    "model_name", "load_from_cache_file", "template", "loss_scale", "truncation_strategy",
    "streaming", "lazy_tokenize", "dataset_shuffle", "columns", "use_hf", "hub_token",
    "add_version", "save_only_model", "create_checkpoint_symlink", "check_model",
    "lora_alpha", "vit_lr", "aligner_lr", "model_type", "model_revision", "use_chat_template",
    "dataloader_persistent_workers", "dataloader_prefetch_factor", "acc_strategy",
    "eval_limit", "eval_dataset", "max_new_tokens", "temperature", "load_args", "seed",
    "agent_template", "norm_bbox", "response_prefix", "enable_thinking", "external_plugins",
    "custom_register_path", "custom_dataset_info", "strict", "interleave_prob",
    "packing_num_proc", "packing_strategy", "early_stop_interval", "ddp_backend",
    "max_epochs", "group_by_length", "train_dataloader_shuffle", "use_logits_to_keep",
    "lorap_lr_ratio", "init_weights", "lora_bias", "modules_to_save", "max_shard_size",
    "safe_serialization", "split_dataset", "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage",
})

_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16",
           "half": "fp16", "float32": "fp32", "fp32": "fp32", "float": "fp32"}
_FLASH = ("flash_attn", "flash_attention_2", "flash_attention_3", "flash_attention_4")
#: ms-swift's DeepSpeed presets (`swift/config/NAME.json@3602360a`): ZeRO stage and offload.
_DEEPSPEED = {"zero0": ("ddp", "none"), "zero1": ("zero1", "none"), "zero2": ("zero2", "none"),
              "zero3": ("zero3", "none"), "zero2_offload": ("zero2", "optimizer"),
              "zero3_offload": ("zero3", "params+optimizer")}
_QUANT_METHODS = ("bnb", "hqq", "eetq", "quanto", "fp8")
_MAX_JSON_CHARS = 64_000
#: `swift rlhf` keys that are recorded (rlhf_args.py: reference and reward models, generation).
_RL_KEYS = ("max_completion_length", "num_generations", "use_vllm", "vllm_mode",
            "vllm_gpu_memory_utilization", "beta", "rpo_alpha", "ref_model", "reward_funcs",
            "reward_model", "loss_type", "epsilon", "num_iterations", "temperature",
            "teacher_model")


def read_command(command: SwiftCommand, *, base_dir: Path | None = None) -> ReadResult:
    """A parsed launch script."""
    return read(command.data, base_dir=base_dir, notes=command.notes,
                subcommand=command.subcommand, launched=command.distributed_launcher)


def read(data: dict[str, Any], *, base_dir: Path | None = None,
         notes: list[str] | tuple[str, ...] = (), subcommand: str = "sft",
         launched: bool = False) -> ReadResult:
    """ms-swift flags (and `ENV`), as its config file or a parsed launch script holds them."""
    flags = dict(data)
    env = flags.pop("ENV", None) or {}
    if not isinstance(env, dict):
        raise TrainingConfigError("ENV", f"must be a mapping of variable names to values, got "
                                  f"{shown(env)}")
    _refuse_config_argument(flags.pop("(arguments)", None))
    unread = _drop_expansions(flags)
    for key in ("deepspeed", "gradient_checkpointing_kwargs"):
        flags[key] = _json_value(key, flags.get(key))
    m = Mapper("ms-swift", VERSION, flags, IRRELEVANT)
    for key, text in unread:
        m.ignore(key, f"{shown(text)} needs the shell to run; vram runs nothing: give the "
                 "value itself (or the matching flag)")
    m.set("framework", "ms-swift", "(format)", f"ms-swift {subcommand}", "ms-swift trains "
          f"with Transformers' Trainer (swift/trainers/seq2seq_trainer.py{AT})")
    for note in notes:
        m.note(note)
    model_ref, slug = resolve_model(m, "model")
    n_gpus = map_environment(m, env, launched=launched)
    method = _method(m)
    _batch(m, n_gpus)
    if subcommand == "rlhf":
        _rlhf(m)
    _precision(m, method)
    _attention(m)
    _checkpointing(m)
    sharded = _distributed(m, base_dir)
    if m.fields.get("grad_ckpt"):
        reentrant = n_gpus == 1 or sharded
        map_reentrant(m, "gradient_checkpointing_kwargs", reentrant, f"use_reentrant unset: "
                      f"{reentrant} ({MIXIN}: False under plain DDP, else True)")
    else:
        m.seen("gradient_checkpointing_kwargs")
    _optimizer(m)
    if m.bool_key("use_liger_kernel"):
        m.set("loss", "fused-linear", "use_liger_kernel", True, "Liger fused linear cross-entropy")
    else:
        m.default("loss", "standard", f"use_liger_kernel False ({TRAIN_ARGS}): full logits, "
                  f"upcast to fp32 ({TRANSFORMERS})")
    map_torch_compile(m)
    _max_pixels_flag(m)
    return m.finish(model_ref, slug)


def _refuse_config_argument(arguments: Any) -> None:
    """`swift sft config.yaml`: the flags are in that file, which a script does not hold."""
    for word in arguments or ():
        if isinstance(word, str) and word.endswith((".yaml", ".yml", ".json")):
            raise TrainingConfigError("swift", f"{shown(word)} holds this command's flags "
                                      f"(swift/cli/main.py{AT} parse_yaml_args): read that file "
                                      "instead")


def _drop_expansions(flags: dict[str, Any]) -> list[tuple[str, str]]:
    """Flags whose value the shell would compute: removed, to be reported as not read."""
    unread: list[tuple[str, str]] = []
    for key, value in list(flags.items()):
        parts = value if isinstance(value, list) else [value]
        if any(isinstance(p, ShellExpansion) for p in parts):
            unread.append((key, " ".join(p.text if isinstance(p, ShellExpansion) else str(p)
                                         for p in parts)))
            del flags[key]
    return unread


def _json_value(key: str, value: Any) -> Any:
    """ms-swift takes a mapping flag as JSON text (`json_parse_to_dict`)."""
    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        return value
    if len(value) > _MAX_JSON_CHARS:
        raise TrainingConfigError(key, f"JSON longer than {_MAX_JSON_CHARS:,} characters")
    try:
        parsed = json.loads(value, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise TrainingConfigError(key, f"not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(parsed, dict):
        raise TrainingConfigError(key, "must be a JSON object")
    return parsed


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


def _tuner(m: Mapper) -> str:
    """`tuner_type` (v4), or 3.x's `train_type`."""
    m.seen("tuner_type", "train_type")
    key = "tuner_type" if m.has("tuner_type") else "train_type"
    kind = m.str_key(key)
    if m.has("tuner_type") and m.has("train_type"):
        m.note("train_type (ms-swift 3.x) and tuner_type both given: tuner_type is read")
    if kind is None:
        m.note(f"tuner_type unset: lora ({BASE_ARGS})")
        return "lora"
    kind = kind.lower()
    if kind not in ("lora", "full", "lora_llm"):
        raise TrainingConfigError(key, f"{shown(kind)}: vram models full, lora and lora_llm "
                                  "(ms-swift's other tuners are not modelled)")
    return kind


def _method(m: Mapper) -> str:
    kind = _tuner(m)
    key = "tuner_type" if m.has("tuner_type") else "train_type"
    quant = _quant(m, kind)
    if kind == "full":
        m.set("method", "full", key, kind)
        m.seen("lora_rank", "lora_dropout", "target_modules", "use_dora", "target_regex")
        _freezing(m, kind)
        return "full"
    method = "qlora" if quant else "lora"
    m.set("method", method, key, kind, f"LoRA on a {quant} base" if quant else "")
    m.int_or_default("lora_rank", "lora_rank", 8, f"lora_rank 8 ({TUNER_ARGS})",
                     high=MAX_LORA_RANK)
    if m.has("lora_dropout"):
        m.set("lora_dropout", m.float_key("lora_dropout", high=0.99), "lora_dropout")
    else:
        m.default("lora_dropout", 0.05, f"lora_dropout 0.05 ({TUNER_ARGS})")
    _targets(m)
    for key_ in ("use_dora", "use_rslora", "target_regex", "lora_dtype", "target_parameters"):
        if m.has(key_):
            m.record(key_, m.get(key_), "not modelled (plain LoRA on target_modules, PEFT's "
                     "fp32 adapters)")
    _freezing(m, kind)
    return method


def _quant(m: Mapper, kind: str) -> str:
    """`quant_method` + `quant_bits` -> the setup's quant; '' when the base is not quantized."""
    method = m.str_key("quant_method")
    if method is None:
        if m.has("quant_bits"):
            m.ignore("quant_bits", f"without quant_method ms-swift loads no quantization config "
                     f"({QUANT_ARGS} get_quantization_config; pre-quantized AWQ/GPTQ "
                     "checkpoints are not modelled)")
        m.seen("bnb_4bit_quant_type", "bnb_4bit_use_double_quant")
        return ""
    method = method.lower()
    if method not in _QUANT_METHODS:
        raise TrainingConfigError("quant_method", f"{shown(method)}: one of "
                                  f"{', '.join(_QUANT_METHODS)}")
    if kind == "full":
        raise TrainingConfigError("quant_method", "a quantized base trains through adapters: "
                                  "use tuner_type lora")
    if method != "bnb":
        m.set("quant", method, "quant_method", method, "not modelled (bitsandbytes is)")
        m.seen("quant_bits")
        return method
    bits = m.get("quant_bits")
    if bits not in (4, 8, "4", "8"):
        raise TrainingConfigError("quant_bits", f"quant_method bnb takes 4 or 8, got "
                                  f"{shown(bits)} ({QUANT_ARGS})")
    if int(bits) == 8:
        m.set("quant", "int8", "quant_bits", bits, "bitsandbytes LLM.int8")
        m.seen("bnb_4bit_quant_type", "bnb_4bit_use_double_quant")
        return "int8"
    qtype = (m.str_key("bnb_4bit_quant_type") or "nf4").lower()
    if qtype not in ("nf4", "fp4"):
        raise TrainingConfigError("bnb_4bit_quant_type", f"{shown(qtype)}: nf4 or fp4")
    if qtype == "fp4":
        m.set("quant", "fp4", "bnb_4bit_quant_type", qtype, "not modelled (nf4 is)")
        return "fp4"
    double = m.bool_key("bnb_4bit_use_double_quant")
    dq = True if double is None else double
    m.set("quant", "nf4-dq" if dq else "nf4", "quant_bits", bits, "bitsandbytes nf4"
          + (f", double quantization (bnb_4bit_use_double_quant default True, {QUANT_ARGS})"
             if double is None and dq else ""))
    return "nf4"


def _targets(m: Mapper) -> None:
    raw = m.get("target_modules")
    if raw is None:
        m.default("lora_targets", "all-linear", f"target_modules ['all-linear'] ({TUNER_ARGS})")
        return
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TrainingConfigError("target_modules", f"module names or all-linear, got "
                                  f"{shown(raw)}")
    if "all-linear" in names:
        m.set("lora_targets", "all-linear", "target_modules", raw)
        rest = [n for n in names if n != "all-linear"]
        if rest:
            m.note(f"target_modules {rest} besides all-linear: not modelled")
        return
    m.lora_targets("target_modules", names, raw)


def _freezing(m: Mapper, kind: str) -> None:
    """freeze_vit / freeze_aligner: the tower and projector get no gradients and no LoRA."""
    vit, aligner = m.bool_key("freeze_vit"), m.bool_key("freeze_aligner")
    if m.bool_key("freeze_llm"):
        m.record("freeze_llm", True, "the language model frozen: not modelled")
    if kind == "lora_llm":
        m.set("freeze_vision", False, "tuner_type", kind, f"swift/tuner_plugin/lora_llm.py{AT} "
              "trains the vision tower and aligner in full; vram gives them LoRA instead "
              "(their gradients and optimizer states are not counted)")
        return
    if vit is None and aligner is None:
        m.default("freeze_vision", True, f"freeze_vit True, freeze_aligner True ({TUNER_ARGS})")
        return
    frozen = vit if vit is not None else True
    differs = aligner is not None and aligner != frozen
    m.set("freeze_vision", frozen, "freeze_vit" if vit is not None else "freeze_aligner",
          vit if vit is not None else aligner,
          "the tower and aligner" + ("; vram freezes the aligner with the tower" if differs
                                     else ""))


def _batch(m: Mapper, n_gpus: int) -> None:
    m.int_or_default("micro_batch", "per_device_train_batch_size", 1,
                     f"per_device_train_batch_size 1 ({TRAIN_ARGS})")
    micro = int(m.fields["micro_batch"])
    accum = max(1, math.ceil(16 / micro / n_gpus))
    m.int_or_default("grad_accum", "gradient_accumulation_steps", accum,
                     f"gradient_accumulation_steps None: ceil(16 / {micro} / {n_gpus} GPUs) = "
                     f"{accum} ({TRAIN_ARGS})")
    m.int_or_default("seq_len", "max_length", 2048, f"vram's default: max_length None is the "
                     f"model's max_model_len ({TEMPLATE_ARGS}); pass --seq", high=MAX_SEQ_LEN)
    for key in ("packing", "padding_free"):
        if m.has(key):
            m.record(key, m.bool_key(key), "samples fill max_length" if key == "packing" else
                     "no padding between the batch's samples")
    if m.has("packing_length"):
        m.record("packing_length", m.int_key("packing_length", high=MAX_SEQ_LEN),
                 "packed length (vram takes max_length)")


def _rlhf(m: Mapper) -> None:
    """`swift rlhf`: the policy's step; for GRPO, PPO and GKD `max_length` is the prompt's
    (template_args.py) and the step sees prompt + completion."""
    kind = (m.str_key("rlhf_type") or "dpo").lower()
    m.record("rlhf_type", kind, f"{kind}: recorded; the policy step is estimated, reference "
             f"and reward models and generation are not (swift/arguments/rlhf_args.py{AT}: "
             "default dpo)")
    if kind in ("grpo", "ppo", "gkd"):
        completion = m.int_key("max_completion_length", high=MAX_SEQ_LEN) or 512
        prompt = int(m.fields["seq_len"])
        m.set("seq_len", prompt + completion, "max_length + max_completion_length",
              f"{prompt}+{completion}", f"max_completion_length default 512 (swift/arguments/"
              f"rlhf_args.py{AT}); the policy's step sees prompt + completion")
    for key in _RL_KEYS:
        if m.has(key) and not (key == "max_completion_length" and kind in ("grpo", "ppo",
                                                                         "gkd")):
            m.record(key, m.get(key), "RL setting (recorded, not modelled)")


def _precision(m: Mapper, method: str) -> None:
    raw = m.str_key("torch_dtype")
    if raw is None:
        weights = "bf16"
        m.note(f"torch_dtype unset: the checkpoint's config.json dtype ({MODEL_ARGS}); bf16 "
               "assumed, as recent checkpoints are")
    else:
        weights = _DTYPES.get(raw.lower(), "")
        if not weights:
            raise TrainingConfigError("torch_dtype", f"{shown(raw)}: bfloat16, float16 or "
                                      "float32")
        m.record("torch_dtype", raw, f"weights loaded in {weights}")
    bf16_flag, fp16_flag = m.bool_key("bf16"), m.bool_key("fp16")
    if bf16_flag and fp16_flag:
        raise TrainingConfigError("fp16", "contradicts bf16: set only one")
    # model_args.py _init_mixed_precision: bfloat16 -> bf16, float16/float32 -> fp16 autocast.
    bf16 = bf16_flag if bf16_flag is not None else (weights == "bf16" and not fp16_flag)
    fp16 = fp16_flag if fp16_flag is not None else (weights != "bf16" and not bf16_flag)
    precision = precision_for(bf16=bf16, fp16=fp16, weights=weights, method=method)
    key = "bf16" if bf16_flag is not None else "fp16" if fp16_flag is not None else (
        "torch_dtype" if raw is not None else "(torch_dtype unset)")
    m.set("precision", precision, key, raw or weights, f"autocast from torch_dtype "
          f"({MODEL_ARGS} _init_mixed_precision)" if key.startswith(("torch", "(")) else "")


def _attention(m: Mapper) -> None:
    raw = m.str_key("attn_impl")
    if raw is None:
        m.default("attention", "sdpa", f"attn_impl None: the config.json's, Transformers' sdpa "
                  f"({MODEL_ARGS})")
    else:
        mapped = "flash" if raw.lower() in _FLASH else attention_from_hf(raw)
        m.set("attention", mapped or raw, "attn_impl", raw, "" if mapped else "not modelled")
    for key in ("packing", "padding_free"):
        if m.bool_key(key) and (raw or "").lower() not in _FLASH:
            raise TrainingConfigError(key, f"needs attn_impl {', '.join(_FLASH)} "
                                      f"({SFT_ARGS} _check_padding_free)")


def _checkpointing(m: Mapper) -> None:
    value = m.bool_key("gradient_checkpointing")
    if value is None:
        m.default("grad_ckpt", True, f"gradient_checkpointing True ({TRAIN_ARGS}): ms-swift "
                  "checkpoints unless told not to")
    else:
        m.set("grad_ckpt", value, "gradient_checkpointing")
    if m.has("vit_gradient_checkpointing"):
        m.record("vit_gradient_checkpointing", m.bool_key("vit_gradient_checkpointing"),
                 "the vision tower's own checkpointing (vram follows gradient_checkpointing)")


def _distributed(m: Mapper, base_dir: Path | None) -> bool:
    """DeepSpeed (a preset name, a JSON file or inline JSON), FSDP2, sequence parallel; True
    when DeepSpeed or FSDP shards the run."""
    deepspeed = m.get("deepspeed")
    sharded = False
    if isinstance(deepspeed, str) and deepspeed in _DEEPSPEED:
        sharding, offload = _DEEPSPEED[deepspeed]
        source = f"ms-swift's preset swift/config/{deepspeed}.json{AT} ({SFT_ARGS})"
        m.set("sharding", sharding, "deepspeed", deepspeed, source)
        if sharding != "ddp":
            m.set("sharding_engine", "deepspeed", "deepspeed", deepspeed, "DeepSpeed's ZeRO")
        if offload != "none":
            m.set("offload", offload, "deepspeed", deepspeed, "offload to CPU")
        sharded = True
    elif deepspeed is not None:
        sharded = map_deepspeed(m, "deepspeed", base_dir)
    fsdp = m.get("fsdp")
    if fsdp not in (None, "", False):
        if sharded:
            raise TrainingConfigError("fsdp", f"contradicts deepspeed: use one of them "
                                      f"({SFT_ARGS})")
        if fsdp != "fsdp2":
            m.record("fsdp", fsdp, "an FSDP config file: not read; give --sharding")
        else:
            source = f"ms-swift's preset swift/config/fsdp2.json{AT}"
            m.set("sharding", "zero3", "fsdp", fsdp, f"{source}: full_shard, "
                  "reshard_after_forward")
            m.set("sharding_engine", "fsdp", "fsdp", fsdp)
            m.set("fsdp_version", 2, "fsdp", fsdp)
            m.set("grad_ckpt", True, "fsdp", fsdp, f"{source} activation_checkpointing")
            m.set("ckpt_reentrant", False, "fsdp", fsdp, "FSDP's checkpoint wrapper")
        sharded = True
    for key in ("device_map", "max_memory"):
        if m.has(key):
            m.record(key, m.get(key), "the model split over GPUs by hand: not modelled")
    if m.has("sequence_parallel_size"):
        size = m.int_key("sequence_parallel_size", high=MAX_GPUS)
        m.set("cp", size, "sequence_parallel_size", size)
        if size and size > 1:
            m.set("cp_kind", "ulysses", "sequence_parallel_size", size, "Ulysses first, ring "
                  f"over the rest (swift/sequence_parallel/sequence_parallel.py{AT})")
    return sharded


def _optimizer(m: Mapper) -> None:
    map_hf_optimizer(m, "optim", "adamw_torch_fused", TRAINING_ARGS + " (torch >= 2.8)")
    plugin = m.str_key("optimizer")
    if plugin is None:
        return
    if plugin == "multimodal":
        m.record("optimizer", plugin, "per-part learning rates (vit_lr, aligner_lr); the "
                 "states are optim's")
    else:
        m.set("optimizer", plugin, "optimizer", plugin, f"ms-swift optimizer plugin "
              f"(swift/optimizers/mapping.py{AT})")


def _max_pixels_flag(m: Mapper) -> None:
    """`--max_pixels` (template_args.py: every VLM's images scaled below it, before the
    processor); with `MAX_PIXELS` as well, the smaller bound holds."""
    if not m.has("max_pixels"):
        return
    bound = m.int_key("max_pixels", high=MAX_PIXELS)
    env_bound = m.fields.get("max_pixels")
    if isinstance(env_bound, int) and bound is not None and env_bound <= bound:
        m.record("max_pixels", bound, f"MAX_PIXELS {env_bound:,} is the smaller bound")
        return
    m.set("max_pixels", bound, "max_pixels", bound, f"images scaled below it ({TEMPLATE_ARGS})")
