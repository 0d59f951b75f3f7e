"""axolotl YAML -> setup.

Defaults and behaviours are read at axolotl@067b021 (main, after v0.18.0):
`src/axolotl/utils/schemas/{config,training,peft}.py` (key defaults),
`src/axolotl/utils/config/__init__.py` (`normalize_config`: `use_reentrant: True` when
checkpointing without kwargs, except RL and `unfrozen_parameters` runs, which the trainer
builder `src/axolotl/core/builders/base.py` gives False),
`src/axolotl/utils/config/__init__.py` (`bf16: auto` -> bf16 on Ampere+, and the model is loaded
in that dtype: `cfg.torch_dtype = torch.bfloat16`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vram.errors import TrainingConfigError
from vram.io.readers.common import (
    HF_IRRELEVANT,
    TRANSFORMERS,
    check_one_of,
    map_hf_optimizer,
    map_reentrant,
    resolve_model,
)
from vram.io.readers.mapper import Mapper, shown
from vram.io.readers.parallel import map_deepspeed, map_fsdp
from vram.io.readers.report import ReadResult
from vram.io.readers.vision import map_axolotl as map_vision
from vram.io.readers.vocab import attention_from_hf, precision_for
from vram.setup import MAX_LORA_RANK, MAX_SEQ_LEN

VERSION = "axolotl@067b021 (main after v0.18.0)"
SCHEMA = "axolotl src/axolotl/utils/schemas/config.py@067b021"
TRAINING = "axolotl src/axolotl/utils/schemas/training.py@067b021"

IRRELEVANT = HF_IRRELEVANT | frozenset({
    "base_model_config", "model_type", "tokenizer_type", "tokenizer_config", "strict",
    "datasets", "test_datasets", "dataset_prepared_path", "val_set_size", "shuffle_merged_datasets",
    "lora_model_dir", "lora_alpha", "lora_fan_in_fan_out", "lora_modules_to_save", "wandb_watch",
    "wandb_log_model", "wandb_project", "wandb_entity", "wandb_name", "num_epochs",
    "lr_scheduler", "train_on_inputs", "group_by_length", "early_stopping_patience",
    "local_rank", "evals_per_epoch", "eval_table_size", "saves_per_epoch", "debug",
    "special_tokens", "tokens", "chat_template", "pad_to_sequence_len", "eval_sample_packing",
    "hub_model_id", "plugins", "save_first_step", "eval_max_new_tokens", "dataset_processes",
    "gptq", "max_steps", "loss_watchdog_threshold", "loss_watchdog_patience",
    "flash_attn_cross_entropy",
    "flash_attn_rms_norm", "flash_attn_fuse_qkv", "flash_attn_fuse_mlp", "peft_use_dora",
    "peft_use_rslora", "lora_on_cpu", "save_safetensors", "auto_resume_from_checkpoints",
    "sample_packing_eff_est", "total_num_tokens", "eval_sequence_len", "seed",
    "trust_remote_code", "is_llama_derived_model", "is_mistral_derived_model", "rl_beta",
})

_ATTENTION_FLAGS = {"flash_attention": "flash", "sdp_attention": "sdpa",
                    "eager_attention": "eager", "xformers_attention": None,
                    "flex_attention": None, "sage_attention": None}


def read(data: dict[str, Any], *, base_dir: Path | None = None) -> ReadResult:
    m = Mapper("axolotl", VERSION, data, IRRELEVANT)
    m.set("framework", "axolotl", "(format)", "axolotl")
    model_ref, slug = resolve_model(m, "base_model")
    method = _method(m)
    if method != "full":
        _lora(m)
    m.int_or_default("micro_batch", "micro_batch_size", 1, f"micro_batch_size 1 ({TRAINING})")
    m.int_or_default("grad_accum", "gradient_accumulation_steps", 1,
                     f"gradient_accumulation_steps 1 ({TRAINING})")
    m.int_or_default("seq_len", "sequence_len", 512,
                     f"sequence_len 512 ({SCHEMA})", high=MAX_SEQ_LEN)
    packing = m.bool_key("sample_packing")
    if packing is not None:
        m.record("sample_packing", packing, "packing: every micro-batch is filled to "
                 "sequence_len" if packing else "no packing: sequences up to sequence_len")
    _checkpointing(m)
    map_hf_optimizer(m, "optimizer", "adamw_torch_fused", TRAINING)
    _precision(m, method)
    _attention(m)
    _loss(m)
    compile_value = m.get("torch_compile")
    if compile_value is not None:
        if compile_value == "auto":
            m.set("compile", True, "torch_compile", compile_value,
                  "auto: on where torch.compile works")
        else:
            m.set("compile", m.bool_key("torch_compile"), "torch_compile")
    else:
        m.default("compile", False, f"torch_compile None = off ({SCHEMA})")
    map_vision(m)
    uses_deepspeed = map_deepspeed(m, "deepspeed", base_dir)
    if map_fsdp(m, version_key="fsdp_version") and uses_deepspeed:
        raise TrainingConfigError("fsdp", "contradicts deepspeed: use one of them")
    _rl(m)
    return m.finish(model_ref, slug)


def _method(m: Mapper) -> str:
    check_one_of(m, "load_in_4bit", "load_in_8bit")
    adapter = m.str_key("adapter")
    four = m.bool_key("load_in_4bit") is True
    eight = m.bool_key("load_in_8bit") is True
    if adapter in (None, ""):
        if four or eight:
            raise TrainingConfigError("load_in_4bit" if four else "load_in_8bit",
                                      "quantized loading needs an adapter (adapter: qlora or lora)")
        m.set("method", "full", "adapter", "(none)", "no adapter: full fine-tuning")
        return "full"
    if adapter == "qlora" or (adapter == "lora" and four):
        if eight:
            raise TrainingConfigError("load_in_8bit", "contradicts adapter: qlora (4-bit)")
        m.set("method", "qlora", "adapter", adapter)
        kwargs = m.get("bnb_config_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TrainingConfigError("bnb_config_kwargs", "must be a mapping")
        double = (kwargs or {}).get("bnb_4bit_use_double_quant")
        if double is not None:
            on = m.bool_key("bnb_config_kwargs.bnb_4bit_use_double_quant", double)
            m.set("quant", "nf4-dq" if on else "nf4",
                  "bnb_config_kwargs.bnb_4bit_use_double_quant", double)
        else:
            m.set("quant", "nf4-dq", "load_in_4bit", four,
                  "axolotl's 4-bit config: nf4, double quantization "
                  "(bnb_4bit_use_double_quant=True, src/axolotl/loaders/model.py@067b021)")
        return "qlora"
    if adapter == "lora" and eight:
        m.set("method", "qlora", "adapter", adapter, "LoRA on a quantized base (load_in_8bit)")
        m.set("quant", "int8", "load_in_8bit", True, "bitsandbytes LLM.int8 base")
        return "qlora"
    if adapter == "lora":
        m.set("method", "lora", "adapter", adapter)
        return "lora"
    raise TrainingConfigError("adapter", f"{shown(adapter)} is not modelled (lora or qlora)")


def _lora(m: Mapper) -> None:
    if m.has("lora_r"):
        m.set("lora_rank", m.int_key("lora_r", high=MAX_LORA_RANK), "lora_r")
    else:
        raise TrainingConfigError("lora_r", "an adapter needs lora_r (axolotl has no default)")
    if m.has("lora_dropout"):
        m.set("lora_dropout", m.float_key("lora_dropout", high=0.99), "lora_dropout")
    if m.bool_key("lora_target_linear"):
        m.set("lora_targets", "all-linear", "lora_target_linear", True)
        m.seen("lora_target_modules")
        return
    modules = m.get("lora_target_modules")
    if isinstance(modules, str):
        modules = [modules]
    if modules:
        m.lora_targets("lora_target_modules", modules)
    else:
        m.default("lora_targets", ("q_proj", "v_proj"),
                  "PEFT's per-architecture default for Llama/Mistral/Qwen "
                  "(peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)")


def _checkpointing(m: Mapper) -> None:
    value = m.get("gradient_checkpointing")
    if value is None:
        m.default("grad_ckpt", False, f"gradient_checkpointing False ({SCHEMA})")
        m.seen("gradient_checkpointing_kwargs")
        return
    if value in ("offload", "offload_disk"):
        m.set("grad_ckpt", True, "gradient_checkpointing", value)
        m.set("offload", "activations", "gradient_checkpointing", value,
              "checkpointed activations offloaded to CPU")
    else:
        m.set("grad_ckpt", m.bool_key("gradient_checkpointing"), "gradient_checkpointing")
    if m.fields.get("grad_ckpt"):
        # normalize_config sets {"use_reentrant": True} unless the run is RL or unfreezes
        # parameters; the trainer builder then passes False for what is still unset.
        if m.has("rl") or m.has("unfrozen_parameters"):
            map_reentrant(m, "gradient_checkpointing_kwargs", False,
                          "use_reentrant False for RL / unfrozen_parameters runs "
                          "(axolotl src/axolotl/core/builders/base.py@067b021)")
        else:
            map_reentrant(m, "gradient_checkpointing_kwargs", True,
                          "use_reentrant True when unset "
                          "(axolotl src/axolotl/utils/config/__init__.py@067b021 "
                          "normalize_config)")
    else:
        m.seen("gradient_checkpointing_kwargs")


def _precision(m: Mapper, method: str) -> None:
    bf16_raw = m.get("bf16")
    fp16 = m.bool_key("fp16") is True
    tf32 = m.bool_key("tf32")
    if tf32 is not None:
        m.record("tf32", tf32, "TF32 matmuls: speed only, no memory change")
    if bf16_raw is None:
        bf16_raw = "auto"
        m.note(f"bf16 unset: 'auto' ({SCHEMA}), bf16 on Ampere or newer")
    bf16 = True if bf16_raw in ("auto", "full") else m.bool_key("bf16", bf16_raw) is True
    if bf16 and fp16 and bf16_raw != "auto":
        raise TrainingConfigError("fp16", "contradicts bf16: set only one")
    if fp16:
        bf16 = False
    weights = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    precision = precision_for(bf16=bf16, fp16=fp16, weights=weights, method=method)
    why = ("the model is loaded in bf16 (cfg.torch_dtype) and trained without an fp32 copy"
           if precision == "bf16-true" else "")
    m.set("precision", precision, "fp16" if fp16 else "bf16", fp16 if fp16 else bf16_raw, why)


def _attention(m: Mapper) -> None:
    for key in ("attn_implementation", "attention"):
        name = m.str_key(key)
        if name is None:
            continue
        mapped = attention_from_hf(name)
        if mapped is None:
            m.set("attention", name.lower(), key, name, "not modelled")
        else:
            m.set("attention", mapped, key, name)
        m.seen("attn_implementation", "attention", *_ATTENTION_FLAGS)
        return
    for flag, mapped in _ATTENTION_FLAGS.items():
        if m.bool_key(flag):
            m.set("attention", mapped or flag.removesuffix("_attention"), flag, True)
            return
    m.default("attention", "sdpa", f"Transformers' default attn_implementation ({TRANSFORMERS})")


def _loss(m: Mapper) -> None:
    liger = m.bool_key("liger_fused_linear_cross_entropy")
    cce = m.bool_key("cut_cross_entropy")
    chunked = m.get("chunked_cross_entropy")
    if liger:
        m.set("loss", "fused-linear", "liger_fused_linear_cross_entropy", True, "Liger FLCE")
    elif cce:
        m.set("loss", "fused-linear", "cut_cross_entropy", True, "Cut Cross-Entropy")
    elif chunked:
        m.set("loss", "chunked", "chunked_cross_entropy", chunked)
    else:
        m.default("loss", "standard",
                  f"full logits, upcast to fp32 ({TRANSFORMERS} ForCausalLMLoss)")
    for key in ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_layer_norm"):
        if m.bool_key(key):
            m.ignore(key, "Liger fused kernel: saves some activation memory, not modelled yet")
    if m.bool_key("liger_cross_entropy"):
        m.record("liger_cross_entropy", True, "Liger CE (logits still materialized)")


def _rl(m: Mapper) -> None:
    rl = m.str_key("rl")
    if rl is None:
        return
    m.record("rl", rl, f"RL algorithm {rl}: recorded; the estimate is of the policy's "
             "training step only (reference model, pairs and generation are not modelled)")
    trl = m.get("trl")
    if isinstance(trl, dict):
        for sub in ("beta", "num_generations", "max_completion_length", "use_vllm",
                    "vllm_mode", "vllm_gpu_memory_utilization"):
            if sub in trl:
                m.record(f"trl.{sub}", trl[sub], "RL generation/algorithm setting (recorded)")
