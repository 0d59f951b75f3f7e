"""Keys that axolotl, LLaMA-Factory, TRL and ms-swift share because all four run Transformers'
Trainer, and the model reference every reader resolves against the catalog."""

from __future__ import annotations

from typing import Any

from vram.errors import TrainingConfigError
from vram.io.readers.mapper import Mapper, shown
from vram.io.readers.vocab import HF_OPTIMIZERS
from vram.model.catalog import resolve_hub_id

TRANSFORMERS = "transformers@v5.24.0"
TRAINING_ARGS = "transformers/training_args.py@v5.24.0"

#: TrainingArguments keys that never change a step's memory.
HF_IRRELEVANT = frozenset({
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "eval_strategy",
    "evaluation_strategy", "per_device_eval_batch_size", "learning_rate", "weight_decay",
    "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "num_train_epochs",
    "max_steps", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps",
    "log_level", "logging_dir", "logging_strategy", "logging_first_step", "logging_steps",
    "save_strategy", "save_steps", "save_total_limit", "save_only_model", "seed", "data_seed",
    "eval_steps", "dataloader_num_workers", "dataloader_pin_memory", "run_name",
    "report_to", "push_to_hub", "hub_model_id", "hub_strategy", "hub_private_repo",
    "resume_from_checkpoint", "remove_unused_columns", "label_names", "load_best_model_at_end",
    "metric_for_best_model", "greater_is_better", "overwrite_cache", "preprocessing_num_workers",
    "ddp_timeout", "plot_loss", "logging_nan_inf_filter", "save_safetensors", "use_cpu",
    "optim_args", "eval_on_start", "include_num_input_tokens_seen", "neftune_noise_alpha",
    "dataset_num_proc", "dataset_text_field", "dataset_kwargs", "dataset_name",
    "dataset_mixture", "dataset_config", "dataset_train_split", "dataset_test_split",
    "chat_template", "hub_revision", "model_revision", "trust_remote_code",
    "tokenizer_name_or_path",
    "lora_alpha", "lora_task_type", "use_rslora", "use_dora", "lora_modules_to_save",
    "bf16_full_eval", "fp16_full_eval", "torch_empty_cache_steps", "ddp_find_unused_parameters",
    "eos_token", "pad_token", "completion_only_loss", "assistant_only_loss",
    "callbacks", "wandb_project", "wandb_entity", "wandb_name",
    "gradient_checkpointing_kwargs",
})


def resolve_model(m: Mapper, key: str) -> tuple[str | None, str | None]:
    """The model reference under `key` and its catalog slug (None when not in the catalog)."""
    ref = m.str_key(key)
    if ref is None:
        m.note(f"no {key}: give --model (a catalog name, Hub id or config.json path)")
        return None, None
    slug = resolve_hub_id(ref)
    m.record(key, ref, f"model: catalog entry {slug}" if slug else
             "model: not in the catalog; give its config.json (--model PATH)")
    return ref, slug


def map_hf_optimizer(m: Mapper, key: str, default: str, default_source: str) -> None:
    """Transformers' `optim` name -> the setup optimizer (None: read, not modelled)."""
    name = m.str_key(key)
    if name is None:
        mapped = HF_OPTIMIZERS[default]
        m.default("optimizer", mapped, f"{default} ({default_source})")
        return
    text = name.lower()
    if text not in HF_OPTIMIZERS:
        m.set("optimizer", text, key, name, "not a Transformers optimizer name vram knows")
        return
    mapped = HF_OPTIMIZERS[text]
    m.set("optimizer", mapped if mapped is not None else text, key, name)


def map_reentrant(m: Mapper, key: str, default: bool | None, source: str) -> None:
    """`gradient_checkpointing_kwargs: {use_reentrant: ...}`."""
    kwargs = m.get(key)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TrainingConfigError(key, f"must be a mapping, got {shown(kwargs)}")
    value: Any = (kwargs or {}).get("use_reentrant")
    if value is not None:
        m.set("ckpt_reentrant", m.bool_key(f"{key}.use_reentrant", value),
              f"{key}.use_reentrant", value)
    elif default is not None:
        m.default("ckpt_reentrant", default, source)


def map_torch_compile(m: Mapper) -> None:
    """`torch_compile`, TrainingArguments' switch, off unless the file turns it on."""
    if m.has("torch_compile"):
        m.set("compile", m.bool_key("torch_compile"), "torch_compile")
    else:
        m.default("compile", False, f"torch_compile False ({TRAINING_ARGS})")


def check_one_of(m: Mapper, *keys: str) -> None:
    """Keys that contradict each other when more than one is true."""
    on = [k for k in keys if m.bool_key(k) is True]
    if len(on) > 1:
        raise TrainingConfigError(on[1], f"contradicts {on[0]}: set only one of "
                                  f"{', '.join(keys)}")


def map_training_args_batch(m: Mapper) -> None:
    """micro-batch and accumulation from `TrainingArguments`' keys (LLaMA-Factory and TRL take
    them as they are), each with the transformers default when the file leaves it out."""
    m.int_or_default("micro_batch", "per_device_train_batch_size", 8,
                     f"per_device_train_batch_size 8 ({TRAINING_ARGS})")
    m.int_or_default("grad_accum", "gradient_accumulation_steps", 1,
                     f"gradient_accumulation_steps 1 ({TRAINING_ARGS})")
