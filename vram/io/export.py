"""Write a setup as the config a training tool runs: an axolotl YAML or a TRL config.

    >>> text, notes = vram.io.export.to_axolotl_yaml(setup, "meta-llama/Llama-3.1-8B")

Each writer states every memory-relevant key explicitly (no reliance on the tool's defaults),
so reading the file back with `vram.io.readers` gives the same setup. What a tool cannot express
is returned as notes rather than written wrongly. Data, schedule and output keys are left for
the user to fill in.
"""

from __future__ import annotations

from typing import Any

import yaml

from vram.memory.optimizer import optimizer_spec
from vram.model.catalog import catalog_entry
from vram.setup import (
    ALL_LINEAR,
    Loss,
    Method,
    Offload,
    Precision,
    Sharding,
    TrainingSetup,
)
from vram.stacks.resolve import resolve

_ATTENTION = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}
_STAGE = {Sharding.ZERO1: 1, Sharding.ZERO2: 2, Sharding.ZERO3: 3}


def hub_id(model: str) -> str:
    """A catalog slug's Hub repository; anything else unchanged."""
    entry = catalog_entry(model)
    return entry.hf_repo if entry else model


def _optimizer(setup: TrainingSetup, notes: list[str]) -> str:
    name = optimizer_spec(setup.optimizer).hf_optim  # Transformers' `optim` / axolotl's
    if name is None:
        notes.append(f"optimizer {setup.optimizer.value} has no Transformers optim name; "
                     "written as adamw_torch_fused")
        return "adamw_torch_fused"
    return name


def _targets(setup: TrainingSetup) -> list[str] | str:
    return ALL_LINEAR if setup.lora_targets == ALL_LINEAR else list(setup.lora_targets)


def _reentrant(setup: TrainingSetup) -> dict[str, Any]:
    """The checkpointing the estimate assumed, written out: the setup's choice, else the
    stack's default (`vram.stacks.resolve`)."""
    return {"use_reentrant": bool(resolve(setup).run.ckpt_reentrant)}


def _deepspeed(setup: TrainingSetup) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": _STAGE[setup.sharding]}
    if setup.offload in (Offload.OPTIMIZER, Offload.PARAMS_OPTIMIZER):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if setup.offload is Offload.PARAMS_OPTIMIZER:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {"zero_optimization": zero, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}


def _parallel(setup: TrainingSetup, out: dict[str, Any], notes: list[str], *,
              version_key: str | None) -> None:
    """FSDP where the estimate ran FSDP (zero2/zero3 without optimizer-only offload),
    DeepSpeed otherwise."""
    if setup.sharding in (Sharding.NONE, Sharding.DDP):
        return
    fsdp_ok = setup.sharding.shards_gradients and (
        setup.offload is not Offload.OPTIMIZER)
    # the engine the estimate assumed: the knobs, else the stack's (FSDP1 for the HF stacks)
    version_value = resolve(setup).run.fsdp_version
    if fsdp_ok and version_value is not None:
        version = int(version_value)
        strategy = "FULL_SHARD" if setup.sharding is Sharding.ZERO3 else "SHARD_GRAD_OP"
        config: dict[str, Any] = {"fsdp_sharding_strategy": strategy,
                                  "fsdp_offload_params": setup.offload is
                                  Offload.PARAMS_OPTIMIZER,
                                  "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}
        if version_key:
            out[version_key] = version
        else:
            config["fsdp_version"] = version
        out["fsdp"] = ["full_shard" if strategy == "FULL_SHARD" else "shard_grad_op",
                       "auto_wrap"]
        out["fsdp_config"] = config
        return
    out["deepspeed"] = _deepspeed(setup)
    notes.append(f"sharding {setup.sharding.value} written as an inline DeepSpeed ZeRO config")


def _stack_note(setup: TrainingSetup, tool: str, notes: list[str]) -> None:
    if setup.framework.value not in ("hf-trainer", "peft-accelerate", "other"):
        notes.append(f"the setup's stack was {setup.framework.value}; {tool} runs Transformers' "
                     "Trainer, whose memory differs (estimate the file again to see it)")


def _gpu_note(setup: TrainingSetup, notes: list[str]) -> None:
    if setup.n_gpus > 1:
        notes.append(f"launch on {setup.n_gpus} GPUs (e.g. accelerate launch --num_processes "
                     f"{setup.n_gpus}); a config file does not hold the GPU count")


def to_axolotl(setup: TrainingSetup, model: str) -> tuple[dict[str, Any], list[str]]:
    """An axolotl config (as a dict) and notes on what axolotl cannot say exactly."""
    notes: list[str] = []
    out: dict[str, Any] = {"base_model": hub_id(model)}
    quant = setup.effective_quant.value
    if setup.method is Method.FULL:
        out["load_in_4bit"] = False
        out["load_in_8bit"] = False
    else:
        out["adapter"] = "qlora" if quant in ("nf4", "nf4-dq") else "lora"
        out["load_in_4bit"] = quant in ("nf4", "nf4-dq")
        out["load_in_8bit"] = quant == "int8"
        if quant == "nf4":
            out["bnb_config_kwargs"] = {"bnb_4bit_use_double_quant": False}
        out["lora_r"] = setup.lora_rank
        out["lora_alpha"] = 2 * setup.lora_rank
        out["lora_dropout"] = setup.lora_dropout
        targets = _targets(setup)
        if targets == ALL_LINEAR:
            out["lora_target_linear"] = True
        else:
            out["lora_target_modules"] = targets
    out["sequence_len"] = setup.seq_len
    out["micro_batch_size"] = setup.micro_batch
    out["gradient_accumulation_steps"] = setup.grad_accum
    out["gradient_checkpointing"] = setup.grad_ckpt
    if setup.grad_ckpt:
        out["gradient_checkpointing_kwargs"] = _reentrant(setup)
    out["optimizer"] = _optimizer(setup, notes)
    _axolotl_precision(setup, out, notes)
    out["attn_implementation"] = _ATTENTION[setup.attention.value]
    loss = setup.loss.value if setup.loss else None
    if loss == "fused-linear":
        out["plugins"] = ["axolotl.integrations.liger.LigerPlugin"]
        out["liger_fused_linear_cross_entropy"] = True
    elif loss == Loss.CHUNKED.value:
        out["chunked_cross_entropy"] = True
    out["torch_compile"] = bool(resolve(setup).run.compile)
    if setup.offload is Offload.ACTIVATIONS:
        if setup.grad_ckpt:
            out["gradient_checkpointing"] = "offload"
        else:
            notes.append("axolotl offloads activations only with checkpointing; not written")
    _parallel(setup, out, notes, version_key="fsdp_version")
    _stack_note(setup, "axolotl", notes)
    _gpu_note(setup, notes)
    return out, notes


def _axolotl_precision(setup: TrainingSetup, out: dict[str, Any], notes: list[str]) -> None:
    precision = setup.precision
    if precision is Precision.FP16_MIXED:
        out["bf16"], out["fp16"] = False, True
    elif precision is Precision.FP32:
        out["bf16"], out["fp16"] = False, False
    else:
        out["bf16"], out["fp16"] = True, False
        mixed_ok = setup.method is Method.QLORA
        if precision is Precision.BF16_MIXED and not mixed_ok:
            notes.append("axolotl loads the model in bf16 when bf16 is on, so it trains pure "
                         "bf16 (bf16-true), not bf16-mixed with fp32 weights")
        if precision is Precision.BF16_TRUE and setup.method is Method.QLORA:
            notes.append("QLoRA under axolotl upcasts the non-quantized parameters "
                         "(bf16-mixed)")
    out["tf32"] = False


def to_trl(setup: TrainingSetup, model: str) -> tuple[dict[str, Any], list[str]]:
    """A `trl sft --config` file (as a dict) and notes."""
    notes: list[str] = []
    out: dict[str, Any] = {"model_name_or_path": hub_id(model)}
    quant = setup.effective_quant.value
    pure = setup.precision is Precision.BF16_TRUE
    # QLoRA's non-quantized parameters are upcast whatever the dtype; bf16 is the usual choice.
    out["dtype"] = "bfloat16" if pure or setup.method is Method.QLORA else "float32"
    out["use_peft"] = setup.method is not Method.FULL
    if setup.method is not Method.FULL:
        out["load_in_4bit"] = quant in ("nf4", "nf4-dq")
        out["load_in_8bit"] = quant == "int8"
        if quant in ("nf4", "nf4-dq"):
            out["bnb_4bit_quant_type"] = "nf4"
            out["use_bnb_nested_quant"] = quant == "nf4-dq"
        out["lora_r"] = setup.lora_rank
        out["lora_alpha"] = 2 * setup.lora_rank
        out["lora_dropout"] = setup.lora_dropout
        out["lora_target_modules"] = _targets(setup)
        if pure and setup.method is Method.QLORA:
            notes.append("QLoRA under TRL/PEFT upcasts the non-quantized parameters "
                         "(bf16-mixed)")
    out["per_device_train_batch_size"] = setup.micro_batch
    out["gradient_accumulation_steps"] = setup.grad_accum
    out["max_length"] = setup.seq_len
    out["gradient_checkpointing"] = setup.grad_ckpt
    if setup.grad_ckpt:
        out["gradient_checkpointing_kwargs"] = _reentrant(setup)
    out["optim"] = _optimizer(setup, notes)
    out["bf16"] = setup.precision in (Precision.BF16_MIXED, Precision.BF16_TRUE)
    out["fp16"] = setup.precision is Precision.FP16_MIXED
    out["attn_implementation"] = _ATTENTION[setup.attention.value]
    loss = resolve(setup).run.loss
    if loss is Loss.FUSED_LINEAR:
        out["use_liger_kernel"] = True
    else:
        out["use_liger_kernel"] = False
        out["loss_type"] = "chunked_nll" if loss is Loss.CHUNKED else "nll"
    out["torch_compile"] = bool(resolve(setup).run.compile)
    if setup.offload is Offload.ACTIVATIONS:
        out["activation_offloading"] = True
    _parallel(setup, out, notes, version_key=None)
    _stack_note(setup, "TRL", notes)
    _gpu_note(setup, notes)
    return out, notes


def dump_yaml(config: dict[str, Any], notes: list[str], header: str) -> str:
    """YAML text with the notes as comments at the top."""
    lines = [f"# {header}", "# Written by vram; add your datasets, schedule and output keys."]
    lines += [f"# note: {note}" for note in notes]
    body = str(yaml.safe_dump(config, sort_keys=False, default_flow_style=False))
    return "\n".join(lines) + "\n" + body


def to_axolotl_yaml(setup: TrainingSetup, model: str,
) -> tuple[str, list[str]]:
    config, notes = to_axolotl(setup, model)
    return dump_yaml(config, notes, "axolotl config (axolotl train this.yml)"), notes


def to_trl_yaml(setup: TrainingSetup, model: str,
) -> tuple[str, list[str]]:
    config, notes = to_trl(setup, model)
    return dump_yaml(config, notes, "TRL config (trl sft --config this.yml)"), notes
