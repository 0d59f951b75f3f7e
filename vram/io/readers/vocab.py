"""Names the training stacks use, translated to the setup's vocabulary.

Optimizer names are Transformers' `OptimizerNames` (transformers/training_args.py; axolotl,
LLaMA-Factory and TRL pass them through) and torchtune's `_component_` paths. A name that maps
to None is read but not modelled yet; the reader says so in its report.
"""

from __future__ import annotations

from vram.memory.optimizer import OPTIMIZERS
from vram.setup import LORA_TARGET_NAMES

#: transformers OptimizerNames (and axolotl's extra names) -> setup optimizer: the other names
#: an optimizer goes by, the names of optimizers not modelled yet (None), and last, so that
#: they win, each modelled optimizer's own `hf_optim` (`vram.memory.optimizer`).
HF_OPTIMIZERS: dict[str, str | None] = {
    "adamw_torch": "adamw",
    "adamw_hf": "adamw",
    "adamw_apex_fused": "adamw",
    "adamw_torch_xla": "adamw",
    "adamw_torch_npu_fused": "adamw",
    "adam": "adamw",
    "adamw_8bit": "adamw-8bit",
    "adam8bit": "adamw-8bit",
    "ademamix_8bit": None,
    "paged_adamw": "paged-adamw",
    "paged_adam_8bit": "paged-adamw-8bit",
    "adamw_torch_8bit": "adamw-8bit",
    "lion_8bit": None,
    "paged_lion_32bit": "lion",
    "paged_lion_8bit": None,
    "galore_adamw": None,
    "galore_adamw_8bit": None,
    "apollo_adamw": None,
    "adopt_adamw": "adamw",  # ADOPT keeps Adam's two moments (axolotl's `adopt_adamw`)
    "schedule_free_adamw": None,
    "lomo": None,
    "adalomo": None,
    "muon": None,
    "grokadamw": None,
    "rmsprop": None,
    **{spec.hf_optim: optimizer.value for optimizer, spec in OPTIMIZERS.items()
       if spec.hf_optim},
}

#: torchtune `optimizer._component_` -> setup optimizer.
TORCHTUNE_OPTIMIZERS: dict[str, str | None] = {
    "torch.optim.AdamW": "adamw",
    "torch.optim.Adam": "adamw",
    "torch.optim.SGD": "sgd",
    "bitsandbytes.optim.AdamW8bit": "adamw-8bit",
    "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw-8bit",
    "bitsandbytes.optim.PagedAdamW": "paged-adamw",
    "bitsandbytes.optim.PagedAdamW32bit": "paged-adamw",
    "torchao.optim.AdamW8bit": "adamw-8bit",
    "torchao.optim.AdamW4bit": "adamw-4bit",
    "torchao.prototype.low_bit_optim.AdamW8bit": "adamw-8bit",
    "torchao.prototype.low_bit_optim.AdamW4bit": "adamw-4bit",
    "torchao.optim.AdamWFp8": None,
}

#: PEFT / torchtune module names -> the setup's (PEFT, Llama-style) names.
TARGET_ALIASES: dict[str, str] = {
    "output_proj": "o_proj",  # torchtune attention output
    "w1": "gate_proj",  # torchtune FeedForward
    "w3": "up_proj",
    "w2": "down_proj",
    "output": "lm_head",
    "dense": "o_proj",
}


def map_targets(names: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """Known LoRA targets in setup names, and the names that have no counterpart."""
    known: list[str] = []
    unknown: list[str] = []
    for raw in names:
        name = TARGET_ALIASES.get(raw, raw)
        (known if name in LORA_TARGET_NAMES else unknown).append(raw if name == raw else name)
    return tuple(dict.fromkeys(known)), unknown


def attention_from_hf(name: str) -> str | None:
    """Transformers' `attn_implementation` -> setup attention."""
    text = name.strip().lower()
    if text.startswith(("flash_attention", "kernels-community/flash-attn")) or text in (
            "fa2", "fa3", "flash"):
        return "flash"
    if text in ("sdpa", "sdp", "auto"):
        return "sdpa"
    if text == "eager":
        return "eager"
    return None


def precision_for(*, bf16: bool, fp16: bool, weights: str, method: str) -> str:
    """The setup precision for a stack that loads weights in `weights` and autocasts.

    A model loaded in bf16 and trained with Transformers' `bf16=True` has no fp32 copy: its
    trained parameters, gradients and Adam states are bf16 (pure bf16 = `bf16-true`). PEFT
    keeps LoRA adapters in fp32 either way (`autocast_adapter_dtype=True`), which the stack
    profile counts. QLoRA runs autocast over a base whose frozen non-quantized parameters stay
    in the loaded dtype or are upcast to fp32 (`prepare_model_for_kbit_training`), as the stack
    does (`kbit_upcast`): the `bf16-mixed` recipe.
    """
    if fp16:
        return "fp16-mixed"
    if weights == "bf16" and method != "qlora":
        return "bf16-true"
    if bf16:
        return "bf16-mixed"
    return "fp32"
