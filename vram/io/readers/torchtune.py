"""torchtune recipe YAML (with `tune run` `key=value` overrides) -> setup.

Defaults are the recipes' own `cfg.get(...)` fallbacks at torchtune@bd2a0fc (main after
v0.6.1): `recipes/lora_finetune_single_device.py`, `recipes/full_finetune_distributed.py`
(`enable_activation_checkpointing` False, `enable_activation_offloading` False,
`fsdp_cpu_offload` False, `optimizer_in_bwd` False). `dtype: bf16` is PURE bf16 (weights,
gradients and optimizer state in bf16; `torchtune/training/precision.py`), a missing dtype is
fp32. Checkpointing is non-reentrant (`torchtune/training/activations.py`), sharding is FSDP2's
`fully_shard` (`torchtune/training/_distributed.py`), and QLoRA's base is torchao NF4 with
quantized scalers (`to_nf4`, block 64, scaler block 256: double quantization).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vram.errors import TrainingConfigError
from vram.io.readers.mapper import Mapper, shown
from vram.io.readers.report import ReadResult
from vram.io.readers.safe_yaml import parse_mapping
from vram.io.readers.vocab import TORCHTUNE_OPTIMIZERS
from vram.model.catalog import resolve_hub_id
from vram.setup import MAX_LORA_RANK, MAX_SEQ_LEN

VERSION = "torchtune@bd2a0fc (main after v0.6.1)"
RECIPES = "torchtune recipes/*_finetune_*.py@bd2a0fc"
PRECISION = "torchtune/training/precision.py@bd2a0fc"

IRRELEVANT = frozenset({
    "output_dir", "tokenizer", "checkpointer", "resume_from_checkpoint",
    "save_adapter_weights_only", "dataset", "seed", "shuffle", "epochs", "max_steps_per_epoch",
    "clip_grad_norm", "lr_scheduler", "metric_logger", "log_every_n_steps",
    "log_peak_memory_stats", "log_level", "device", "profiler", "run_val_every_n_steps",
    "dataset_val", "batch_size_val", "low_cpu_ram", "name", "base_model_path",
    "save_every_n_epochs", "save_every_n_steps", "num_steps", "ref_checkpointer",
    "cudnn_deterministic_mode", "enable_async_checkpointing", "collate_fn", "model",
    "optimizer", "loss", "inference", "reward_functions",
})

#: torchtune model builders (without lora_/qlora_) -> catalog slug, where the checkpoint
#: folder does not name a Hub model.
BUILDERS: dict[str, str] = {
    "llama3_1_8b": "llama-3.1-8b", "llama3_1_70b": "llama-3.1-70b",
    "llama3_1_405b": "llama-3.1-405b-instruct", "llama3_2_1b": "llama-3.2-1b",
    "llama3_2_3b": "llama-3.2-3b", "llama3_8b": "meta-llama-3-8b", "llama3_70b": "llama-3.1-70b",
    "llama3_3_70b": "llama-3.3-70b-instruct", "llama2_7b": "llama-2-7b",
    "llama2_13b": "llama-2-13b", "llama2_70b": "llama-2-70b", "mistral_7b": "mistral-7b-v0.1",
    "gemma_2b": "gemma-2b", "gemma_7b": "gemma-7b", "gemma2_2b": "gemma-2-2b",
    "gemma2_9b": "gemma-2-9b", "gemma2_27b": "gemma-2-27b", "qwen2_7b": "qwen2-7b",
    "qwen2_5_0_5b": "qwen2.5-0.5b-instruct", "qwen2_5_1_5b": "qwen2.5-1.5b-instruct",
    "qwen2_5_7b": "qwen2.5-7b-instruct", "qwen2_5_14b": "qwen2.5-14b-instruct",
    "qwen2_5_32b": "qwen2.5-32b-instruct", "qwen2_5_72b": "qwen2.5-72b-instruct",
    "phi3_mini": "phi-3-mini-4k-instruct", "code_llama2_7b": "codellama-7b",
    "code_llama2_13b": "codellama-13b", "code_llama2_70b": None,  # type: ignore[dict-item]
}

_LOSSES = {
    "CEWithChunkedOutputLoss": ("chunked", "chunked output + cross-entropy"),
    "LinearCrossEntropyLoss": ("fused-linear", "output projection fused into the chunked loss"),
    "CrossEntropyLoss": ("standard", "full logits"),
}
_RL_LOSSES = ("DPOLoss", "RSOLoss", "SimPOLoss", "PPOLoss", "GRPOLoss", "GRPOSimpleLoss")
_INTERPOLATION = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")
_MAX_OVERRIDES = 200


def _lookup(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _interpolate(value: Any, data: dict[str, Any], depth: int = 0) -> Any:
    """OmegaConf-style `${key}` references to other keys (text only, a few levels deep)."""
    if depth > 5:
        raise TrainingConfigError("file", "interpolations nested too deeply (${...})")
    if isinstance(value, str) and "${" in value:
        full = _INTERPOLATION.fullmatch(value)
        if full:
            return _interpolate(_lookup(data, full.group(1)), data, depth + 1)
        return _INTERPOLATION.sub(
            lambda match: str(_interpolate(_lookup(data, match.group(1)), data, depth + 1)),
            value)
    return value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`tune run ... key=value` overrides (dotted keys; `~key` deletes), values as YAML scalars."""
    if len(overrides) > _MAX_OVERRIDES:
        raise TrainingConfigError("overrides", f"at most {_MAX_OVERRIDES}")
    result: dict[str, Any] = dict(data)
    for text in overrides:
        if text.startswith("~"):
            _delete(result, text[1:])
            continue
        key, sep, raw = text.partition("=")
        key = key.strip().lstrip("+")
        if not sep or not key or not re.fullmatch(r"[A-Za-z0-9_.]+", key):
            raise TrainingConfigError(text[:40] or "override",
                                      "an override is key=value (dotted keys, e.g. "
                                      "model.lora_rank=16)")
        if len(raw) > 2000:
            raise TrainingConfigError(key, "override value too long (at most 2,000 characters)")
        try:
            value = parse_mapping(f"value: {raw}")["value"] if raw.strip() else None
        except TrainingConfigError:
            raise TrainingConfigError(key, f"value {shown(raw)} is not a YAML value") from None
        _assign(result, key, value)
    return result


def _assign(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        child = dict(child) if isinstance(child, dict) else {}
        node[part] = child
        node = child
    node[parts[-1]] = value


def _delete(data: dict[str, Any], dotted: str) -> None:
    parts = dotted.split(".")
    node: Any = data
    for part in parts[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return
        node[part] = dict(node[part])
        node = node[part]
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def _component(section: Any, key: str) -> str | None:
    if section is None:
        return None
    if not isinstance(section, dict) or not isinstance(section.get("_component_"), str):
        raise TrainingConfigError(f"{key}._component_", "must name a torchtune component")
    return str(section["_component_"])


def _model_slug(builder: str, checkpoint_dir: str | None) -> tuple[str | None, str]:
    if checkpoint_dir:
        folder = Path(checkpoint_dir.rstrip("/")).name
        for owner in ("meta-llama", "Qwen", "mistralai", "google", "microsoft"):
            slug = resolve_hub_id(f"{owner}/{folder}")
            if slug:
                return slug, f"checkpoint folder {folder}"
    base = re.sub(r"^(q?lora_)", "", builder)
    base = re.sub(r"_(instruct|base)$", "", base)
    slug = BUILDERS.get(base)
    return slug, f"builder {builder}"


def read(data: dict[str, Any], *, overrides: Sequence[str] = (),
         file_name: str | None = None) -> ReadResult:
    data = apply_overrides(data, overrides)
    m = Mapper("torchtune", VERSION, data, IRRELEVANT)
    m.set("framework", "torchtune", "(format)", "torchtune")
    for text in overrides:
        m.note(f"override applied: {text[:80]}")
    model = data.get("model")
    component = _component(model, "model")
    if component is None or not isinstance(model, dict):
        raise TrainingConfigError("model._component_", "a recipe needs model._component_")
    builder = component.rsplit(".", 1)[-1]
    checkpointer = data.get("checkpointer")
    folder = None
    if isinstance(checkpointer, dict):
        folder = _interpolate(checkpointer.get("checkpoint_dir"), data)
        folder = folder if isinstance(folder, str) else None
    slug, how = _model_slug(builder, folder)
    model_ref = folder or component
    m.record("model._component_", component,
             f"model: catalog entry {slug} ({how})" if slug else
             "model: not in the catalog; give its config.json (--model PATH)")
    _method(m, builder, model)
    _batch(m, data)
    _precision(m)
    _optimizer(m, data)
    _loss(m, data)
    _checkpointing(m)
    _distributed(m, file_name)
    compile_value = m.get("compile")
    if compile_value is None:
        m.default("compile", False, f"`compile` is required by the recipes ({RECIPES}); "
                  "taken as off")
    else:
        m.set("compile", m.bool_key("compile"), "compile")
    m.set("attention", "sdpa", "(recipe)", "torchtune",
          "torchtune's attention calls F.scaled_dot_product_attention")
    _rl(m, data)
    return m.finish(model_ref, slug)


def _method(m: Mapper, builder: str, model: dict[str, Any]) -> None:
    if builder.startswith("qlora_"):
        m.set("method", "qlora", "model._component_", builder)
        m.set("quant", "nf4-dq", "model._component_", builder,
              "torchao NF4 with quantized scalers (double quantization)")
    elif builder.startswith("lora_"):
        m.set("method", "lora", "model._component_", builder)
    else:
        m.set("method", "full", "model._component_", builder)
        return
    rank = model.get("lora_rank")
    if rank is None:
        raise TrainingConfigError("model.lora_rank", "a LoRA builder needs lora_rank")
    m.set("lora_rank", m.int_key("model.lora_rank", rank, high=MAX_LORA_RANK),
          "model.lora_rank", rank)
    dropout = model.get("lora_dropout")
    if dropout is not None:
        m.set("lora_dropout", m.float_key("model.lora_dropout", dropout, high=0.99),
              "model.lora_dropout", dropout)
    attn = model.get("lora_attn_modules")
    if attn is None:
        raise TrainingConfigError("model.lora_attn_modules", "a LoRA builder needs it")
    if not isinstance(attn, list) or not all(isinstance(x, str) for x in attn):
        raise TrainingConfigError("model.lora_attn_modules", "must be a list of module names")
    names = list(attn)
    if m.bool_key("model.apply_lora_to_mlp", model.get("apply_lora_to_mlp")):
        names += ["w1", "w2", "w3"]
    if m.bool_key("model.apply_lora_to_output", model.get("apply_lora_to_output")):
        names.append("output")
    m.lora_targets("model.lora_attn_modules", names,
                   source="model.lora_attn_modules + apply_lora_to_*")


def _batch(m: Mapper, data: dict[str, Any]) -> None:
    if m.has("batch_size"):
        m.set("micro_batch", m.int_key("batch_size"), "batch_size")
    else:
        raise TrainingConfigError("batch_size", "the recipe needs batch_size")
    m.int_or_default("grad_accum", "gradient_accumulation_steps", 1,
                     f"required by the recipes ({RECIPES}); taken as 1")
    tokenizer = data.get("tokenizer")
    seq = tokenizer.get("max_seq_len") if isinstance(tokenizer, dict) else None
    if seq is not None:
        m.set("seq_len", m.int_key("tokenizer.max_seq_len", seq, high=MAX_SEQ_LEN),
              "tokenizer.max_seq_len", seq)
    else:
        m.default("seq_len", 2048, "vram's default: tokenizer.max_seq_len is null, so "
                  "torchtune does not truncate and the length is the data's; pass --seq")
    dataset = data.get("dataset")
    if isinstance(dataset, dict) and dataset.get("packed") is not None:
        packed = m.bool_key("dataset.packed", dataset.get("packed"))
        m.record("dataset.packed", packed, "packing: every sample is max_seq_len long"
                 if packed else "no packing")


def _precision(m: Mapper) -> None:
    dtype = m.str_key("dtype")
    if dtype is None:
        m.default("precision", "fp32", f"dtype None -> float32 ({PRECISION} get_dtype)")
        return
    mapped = {"bf16": "bf16-true", "fp32": "fp32", "fp16": "fp16-true"}.get(dtype)
    if mapped is None:
        raise TrainingConfigError("dtype", f"{shown(dtype)}: torchtune takes bf16, fp32 or fp16")
    m.set("precision", mapped, "dtype", dtype,
          "PURE bf16: weights, gradients and optimizer state in bf16" if dtype == "bf16" else "")


def _optimizer(m: Mapper, data: dict[str, Any]) -> None:
    component = _component(data.get("optimizer"), "optimizer")
    in_backward = m.bool_key("optimizer_in_bwd")
    if component is None:
        raise TrainingConfigError("optimizer._component_", "the recipe needs an optimizer")
    mapped = TORCHTUNE_OPTIMIZERS.get(component)
    if in_backward and mapped == "adamw":
        m.set("optimizer", "adamw-in-backward", "optimizer_in_bwd", True,
              "AdamW stepped per parameter inside backward")
        return
    if in_backward:
        m.note("optimizer_in_bwd with a non-AdamW optimizer: gradients modelled as kept")
    m.set("optimizer", mapped if mapped is not None else component, "optimizer._component_",
          component, "" if mapped is not None else "not modelled")


def _loss(m: Mapper, data: dict[str, Any]) -> None:
    component = _component(data.get("loss"), "loss")
    if component is None:
        m.default("loss", "chunked", "torchtune configs use CEWithChunkedOutputLoss since v0.3")
        return
    name = component.rsplit(".", 1)[-1]
    if name in _RL_LOSSES:
        m.record("loss._component_", component, f"RL loss {name}: recorded; the policy step is "
                 "estimated, reference model and generation are not modelled")
        m.default("loss", "standard", "RL losses compute full-vocabulary log-probabilities")
        return
    if name not in _LOSSES:
        m.set("loss", name, "loss._component_", component, "not modelled")
        return
    value, why = _LOSSES[name]
    m.set("loss", value, "loss._component_", component, why)


def _checkpointing(m: Mapper) -> None:
    ckpt = m.bool_key("enable_activation_checkpointing")
    if ckpt is None:
        m.default("grad_ckpt", False, f"enable_activation_checkpointing False ({RECIPES})")
    else:
        m.set("grad_ckpt", ckpt, "enable_activation_checkpointing")
    if m.fields["grad_ckpt"]:
        m.default("ckpt_reentrant", False,
                  "torchtune/training/activations.py@bd2a0fc: use_reentrant=False")
    if m.bool_key("enable_activation_offloading"):
        m.set("offload", "activations", "enable_activation_offloading", True)


def _distributed(m: Mapper, file_name: str | None) -> None:
    keys = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "custom_sharded_layers",
            "data_parallel_shard_dim", "tensor_parallel_dim", "context_parallel_dim")
    by_keys = any(m.has(k) for k in keys)
    by_name = file_name is not None and "single_device" not in file_name
    if not (by_keys or by_name):
        m.note("single-device recipe")
        return
    why = "distributed recipe (FSDP2 fully_shard)" + (
        "" if by_keys else f"; {file_name} is not a single_device config")
    m.set("fsdp_version", 2, "(recipe)", "full_finetune/lora_finetune_distributed", why)
    reshard = m.bool_key("fsdp_reshard_after_forward")
    if reshard is False:
        m.set("sharding", "zero2", "fsdp_reshard_after_forward", False)
    else:
        m.set("sharding", "zero3", "fsdp_reshard_after_forward", True if reshard else "(unset)",
              "parameters resharded after forward")
    if m.bool_key("fsdp_cpu_offload"):
        m.set("offload", "params+optimizer", "fsdp_cpu_offload", True)
    _sharded_layers(m)
    m.note("the GPU count is tune run's --nproc_per_node: pass --gpus N")


def _sharded_layers(m: Mapper) -> None:
    """`custom_sharded_layers` naming both the embedding and the output: FSDP2 units of their
    own; unset, the recipes shard the layers only (the embedding and output in the root)."""
    layers = m.get("custom_sharded_layers")
    if layers is None:
        m.default("fsdp_embedding_units", False, "custom_sharded_layers unset: the recipe "
                  "shards the layers and the model (torchtune/training/_distributed.py@v0.3.0 "
                  "shard_model)")
        return
    names = {str(name).rsplit(".", 1)[-1] for name in layers} if isinstance(layers, list) \
        else set()
    m.set("fsdp_embedding_units", {"tok_embeddings", "output"} <= names,
          "custom_sharded_layers", layers,
          "the embedding and the output as FSDP2 units of their own" if
          {"tok_embeddings", "output"} <= names else "not both tok_embeddings and output: "
          "the root keeps what is not listed")


def _rl(m: Mapper, data: dict[str, Any]) -> None:
    for key in ("grpo_samples", "max_generated_tokens", "forward_batch_size", "ppo_epochs",
                "temperature", "top_k", "kl_coeff"):
        if key in data:
            m.record(key, data[key], "RL generation/algorithm setting (recorded, not modelled)")
    if "ref_checkpointer" in data:
        m.ignore("ref_checkpointer", "a reference model is loaded: not modelled yet")
