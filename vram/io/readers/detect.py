"""Which tool a training config is for, from its keys (an ms-swift launch script is told
by its `swift sft` line: `swift_command.looks_like_command`)."""

from __future__ import annotations

from typing import Any

from vram.errors import TrainingConfigError
from vram.io.readers.report import Format

_MARKERS: dict[Format, tuple[str, ...]] = {
    "axolotl": ("base_model", "micro_batch_size", "sequence_len", "adapter", "lora_r",
                "lora_target_linear", "sample_packing", "load_in_4bit", "num_epochs",
                "dataset_prepared_path", "val_set_size", "flash_attention", "wandb_project"),
    "llamafactory": ("stage", "finetuning_type", "cutoff_len", "template", "lora_target",
                     "dataset_dir", "quantization_bit", "disable_gradient_checkpointing",
                     "plot_loss", "overwrite_cache", "preprocessing_num_workers", "lora_rank"),
    "trl": ("model_name_or_path", "per_device_train_batch_size", "use_peft", "max_length",
            "max_seq_length", "dataset_name", "num_train_epochs", "lora_target_modules",
            "gradient_checkpointing_kwargs", "optim", "bf16", "attn_implementation",
            "num_generations", "dataset_mixture", "torch_dtype"),
    # ms-swift's config file (`swift sft config.yaml`): its own flag names and `ENV`.
    "ms-swift": ("tuner_type", "train_type", "quant_bits", "quant_method", "attn_impl",
                 "target_modules", "freeze_vit", "freeze_aligner", "freeze_llm", "ENV",
                 "model_author", "model_name", "split_dataset_ratio", "sequence_parallel_size",
                 "vit_lr", "aligner_lr", "load_from_cache_file", "padding_free", "system"),
}


def infer_format(data: dict[str, Any]) -> Format:
    """torchtune if it names `_component_`s; otherwise the tool whose keys it uses most."""
    if any(isinstance(v, dict) and "_component_" in v for v in data.values()):
        return "torchtune"
    scores = {fmt: sum(key in data for key in keys) for fmt, keys in _MARKERS.items()}
    ranked = sorted(scores.items(), key=lambda item: item[1], reverse=True)
    (best, top), (_, second) = ranked[0], ranked[1]
    if top == 0 or top == second:
        raise TrainingConfigError(
            "format", "cannot tell which tool this config is for; give --format "
            "axolotl, torchtune, llamafactory, trl or ms-swift")
    return best
