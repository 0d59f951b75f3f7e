"""Build the Hugging Face model of a config under fake tensors, with the setup applied.

Recipes (what each `TrainingSetup` field becomes):

* precision: `fp32` -> fp32 weights; `fp16-mixed` / `bf16-mixed` -> fp32 weights and
  `torch.autocast` in the forward pass; `bf16-true` -> bf16 weights, gradients and states.
* method `full`: every parameter trainable. `lora`: real PEFT `get_peft_model` with the setup's
  rank, dropout and targets (mapped to the family's module names). PEFT's default
  `autocast_adapter_dtype=True` keeps adapters in fp32 on a 16-bit base, as users of the HF
  stacks get; torchtune and LitGPT keep adapters in the model dtype, so for those frameworks
  the adapters follow the base dtype.
* `qlora`: every linear layer of the repeated blocks becomes a `QuantLinear` (bitsandbytes
  storage, see `quant.py`); the LM head stays 16-bit except with LitGPT, which quantizes it too.
  For the HF Trainer and PEFT+Accelerate stacks `peft.prepare_model_for_kbit_training` runs
  first, which upcasts every non-quantized 16-bit parameter (embeddings, norms, LM head) to fp32;
  axolotl then casts its norms and embedding modules back (`kbit_recasts_16bit`). A stack that
  runs neither (ms-swift, LLaMA-Factory) keeps the base in the 16 bits it was loaded in.
* `grad_ckpt`: the model's own `activation_checkpointing_enable(use_reentrant=False)` (transformers
  5.x; `gradient_checkpointing_enable` before it).
* attention: `eager` builds HF's eager attention (s x s scores are real). `sdpa` builds HF's
  SDPA attention, and the step runs every SDPA call with PyTorch's CUDA kernel choice and
  memory (see `attention.py`); a family HF refuses SDPA for (Gemma 2: `_supports_sdpa = False`,
  soft-capping) runs eager, as HF does. `flash` builds the `vram_fused` attention
  implementation: flash-attn 2 as HF calls it (no mask, kv heads unexpanded, soft-capping
  allowed; saves out + fp32 logsumexp); a family without HF's attention interface (Falcon)
  builds SDPA and every call runs the flash kernel.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vram.errors import VramError
from vram.setup import (
    ALL_LINEAR,
    Attention,
    ExpertBanks,
    Experts,
    Method,
    Precision,
    TrainingSetup,
)
from vram.stacks.precision import lora_base_16bit, qlora_base_16bit
from vram.stacks.profile import profile_for
from vram.stacks.resolve import resolve
from vram.stacks.table import stack_row
from vram.trace import vision
from vram.trace.quant import QuantLinear, lora_forward_bnb

#: Config keys that hold the number of repeated blocks.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")

#: Families the trace knows: model_type -> kind of head.
SEQ2SEQ = {"t5", "mt5", "bart"}
CLASSIFIER = {"bert", "roberta", "deberta", "deberta-v2", "distilbert"}

#: LoRA target name -> module-name suffixes (regex, matched at the end of the module path).
_LLAMA_LIKE = {
    "q_proj": ["q_proj"], "k_proj": ["k_proj"], "v_proj": ["v_proj"], "o_proj": ["o_proj"],
    "gate_proj": ["gate_proj"], "up_proj": ["up_proj"], "down_proj": ["down_proj"],
}
_FUSED_QKV = {
    "q_proj": ["query_key_value"], "k_proj": ["query_key_value"],
    "v_proj": ["query_key_value"], "o_proj": [r"attention\.dense", r"self_attention\.dense"],
    "gate_proj": [], "up_proj": ["dense_h_to_4h"], "down_proj": ["dense_4h_to_h"],
}
TARGET_MAP: dict[str, dict[str, list[str]]] = {
    "phi": {
        "q_proj": ["q_proj"], "k_proj": ["k_proj"], "v_proj": ["v_proj"], "o_proj": ["dense"],
        "gate_proj": [], "up_proj": ["fc1"], "down_proj": ["fc2"],
    },
    "phi3": {
        "q_proj": ["qkv_proj"], "k_proj": ["qkv_proj"], "v_proj": ["qkv_proj"],
        "o_proj": ["o_proj"], "gate_proj": ["gate_up_proj"], "up_proj": ["gate_up_proj"],
        "down_proj": ["down_proj"],
    },
    "falcon": _FUSED_QKV, "bloom": _FUSED_QKV, "gpt_neox": _FUSED_QKV,
    "t5": {
        "q_proj": ["q"], "k_proj": ["k"], "v_proj": ["v"], "o_proj": ["o"],
        "gate_proj": ["wi_0"], "up_proj": ["wi", "wi_1"], "down_proj": ["wo"],
    },
    "bert": {
        "q_proj": ["query"], "k_proj": ["key"], "v_proj": ["value"],
        "o_proj": [r"attention\.output\.dense"], "gate_proj": [],
        "up_proj": [r"intermediate\.dense"], "down_proj": [r"layer\.\d+\.output\.dense"],
    },
}
TARGET_MAP["gpt2"] = {  # Conv1D modules; PEFT adapts them with fan_in_fan_out
    "q_proj": [r"attn\.c_attn"], "k_proj": [r"attn\.c_attn"], "v_proj": [r"attn\.c_attn"],
    "o_proj": [r"attn\.c_proj"], "gate_proj": [], "up_proj": [r"mlp\.c_fc"],
    "down_proj": [r"mlp\.c_proj"],
}
#: Families whose projections are transformers' Conv1D (weight stored as in x out).
CONV1D_TYPES = frozenset({"gpt2"})
TARGET_MAP["opt"] = {
    "q_proj": ["q_proj"], "k_proj": ["k_proj"], "v_proj": ["v_proj"], "o_proj": ["out_proj"],
    "gate_proj": [], "up_proj": ["fc1"], "down_proj": ["fc2"],
}
TARGET_MAP["gptj"] = {
    "q_proj": ["q_proj"], "k_proj": ["k_proj"], "v_proj": ["v_proj"], "o_proj": ["out_proj"],
    "gate_proj": [], "up_proj": ["fc_in"], "down_proj": ["fc_out"],
}
TARGET_MAP["gpt_bigcode"] = {  # nn.Linear modules under GPT-2's names
    "q_proj": [r"attn\.c_attn"], "k_proj": [r"attn\.c_attn"], "v_proj": [r"attn\.c_attn"],
    "o_proj": [r"attn\.c_proj"], "gate_proj": [], "up_proj": [r"mlp\.c_fc"],
    "down_proj": [r"mlp\.c_proj"],
}
TARGET_MAP["mt5"] = TARGET_MAP["t5"]
TARGET_MAP["roberta"] = TARGET_MAP["bert"]


class TraceUnsupported(VramError):
    """This family or setup cannot be traced; the message says why (one line, naming the
    field: the CLI prints it as any bad input)."""


@dataclass
class Built:
    """The model ready to train, and what the step driver needs to know about it."""

    model: nn.Module
    hf: Any  # the underlying transformers model (below any PEFT wrapper)
    kind: str  # "causal", "seq2seq" or "classifier"
    autocast: torch.dtype | None
    vocab: int
    layer_lists: list[tuple[str, nn.ModuleList]]
    #: A vision-language model's micro-batch (ids and image inputs), built in the step;
    #: None: random ids only.
    inputs: vision.Inputs | None = None


def _block_kinds(config: dict[str, Any]) -> list[Any] | None:
    """Nemotron-H's one entry per block (`layers_block_type`): its depth, and its pattern."""
    kinds = config.get("layers_block_type")
    return kinds if isinstance(kinds, list) and kinds else None


def depth(config: dict[str, Any]) -> int:
    """Number of repeated blocks the config describes (a VLM: its language model's;
    Nemotron-H: its list of blocks, which NemotronHConfig reads instead of a count)."""
    for key in LAYER_KEYS:
        if isinstance(config.get(key), int):
            return int(config[key])
    if vision.is_vlm(config) and vision.text_part(config) is not config:
        return depth(vision.text_part(config))
    kinds = _block_kinds(config)
    if kinds is not None:
        return len(kinds)
    raise TraceUnsupported("config: no num_hidden_layers / num_layers / n_layer key")


def _period(types: list[Any]) -> int:
    for period in range(1, len(types) + 1):
        if all(types[i] == types[i % period] for i in range(len(types))):
            return period
    return 1


def layer_period(config: dict[str, Any]) -> int:
    """After how many blocks the block kinds repeat (1: every block alike).

    Read from Nemotron-H's `layers_block_type`, else the `layer_types` Transformers derives
    for the config (Gemma 2 alternates sliding-window and global attention: period 2). The
    trace extrapolates whole periods.
    """
    from transformers import AutoConfig

    kinds = _block_kinds(config)
    if kinds is not None:
        return _period(kinds)
    try:
        fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
        hf = AutoConfig.for_model(str(config.get("model_type", "")), **fields)
    except (ValueError, TypeError, KeyError):
        return 1
    types = getattr(hf.get_text_config(), "layer_types", None)
    if not isinstance(types, list) or not types:
        return 1
    return _period(types)


def with_depth(config: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """A copy of `config` with every layer-count key set to `n_layers` (a VLM's in its
    `text_config`)."""
    out = copy.deepcopy(config)
    if vision.is_vlm(out) and vision.text_part(out) is not out:
        out["text_config"] = with_depth(vision.text_part(out), n_layers)
        return out
    for key in LAYER_KEYS:
        if key in out and isinstance(out[key], int):
            out[key] = n_layers
    for key in ("layer_types", "layers_block_type"):
        if isinstance(out.get(key), list):
            out[key] = (out[key] * n_layers)[:n_layers]
    return out


def kind_of(model_type: str, config: dict[str, Any] | None = None) -> str:
    if config is not None and vision.is_vlm(config):
        return "vlm"
    if model_type in SEQ2SEQ:
        return "seq2seq"
    if model_type in CLASSIFIER:
        return "classifier"
    return "causal"


def weight_dtype(setup: TrainingSetup) -> torch.dtype:
    """The dtype the model is loaded in: 16 bits for pure bf16, for a LoRA base loaded in
    16 bits under a mixed recipe (`vram.stacks.precision.lora_base_16bit`) and for a QLoRA base
    whose stack keeps it so (`qlora_base_16bit`), else fp32."""
    if setup.precision is Precision.BF16_TRUE:
        return torch.bfloat16
    if lora_base_16bit(resolve(setup).run) or qlora_base_16bit(
            setup, profile_for(setup).upcasts_frozen_to_fp32):
        return torch.float16 if setup.precision is Precision.FP16_MIXED else torch.bfloat16
    return torch.float32


def autocast_dtype(setup: TrainingSetup) -> torch.dtype | None:
    if setup.precision is Precision.BF16_MIXED:
        return torch.bfloat16
    if setup.precision is Precision.FP16_MIXED:
        return torch.float16
    return None


def compute_dtype(setup: TrainingSetup) -> torch.dtype:
    return autocast_dtype(setup) or weight_dtype(setup)


def _instantiate(config: dict[str, Any], setup: TrainingSetup, kind: str) -> nn.Module:
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSeq2SeqLM,
        AutoModelForSequenceClassification,
    )

    cfg_dict = {k: v for k, v in config.items() if k not in ("architectures", "_name_or_path")}
    model_type = cfg_dict.pop("model_type", None)
    if not model_type:
        raise TraceUnsupported("config: no model_type")
    # Quantization configs describe checkpoints, not the architecture.
    cfg_dict.pop("quantization_config", None)
    if kind == "classifier":
        cfg_dict["num_labels"] = 2
    if kind == "seq2seq" and cfg_dict.get("decoder_start_token_id") is None:
        cfg_dict["decoder_start_token_id"] = cfg_dict.get("pad_token_id") or 0
    try:
        hf_config = AutoConfig.for_model(model_type, **cfg_dict)
    except (ValueError, KeyError) as exc:
        raise TraceUnsupported(
            f"model_type {model_type!r}: transformers cannot build it ({exc})") from exc
    # as the Trainer does (transformers/trainer.py@v5.24.0 L645-646): on the built top-level
    # config only, so a VLM's text config keeps its own (a flat Qwen2.5-VL config's too)
    hf_config.use_cache = False
    if kind == "vlm":
        if setup.attention is Attention.FLASH:
            raise TraceUnsupported("attention: flash is not traced for vision-language models")
        return vision.instantiate(hf_config, weight_dtype(setup),
                                  "eager" if setup.attention is Attention.EAGER else "sdpa")
    auto = {"causal": AutoModelForCausalLM, "seq2seq": AutoModelForSeq2SeqLM,
            "classifier": AutoModelForSequenceClassification}[kind]
    if setup.attention is Attention.FLASH:
        from vram.trace.attention import register_fused

        try:
            return auto.from_config(copy.deepcopy(hf_config), dtype=weight_dtype(setup),
                                    attn_implementation=register_fused())
        except (ValueError, KeyError):  # no attention interface (Falcon): SDPA, flash-routed
            pass
    attn = "eager" if setup.attention is Attention.EAGER else "sdpa"
    try:
        model = auto.from_config(hf_config, dtype=weight_dtype(setup), attn_implementation=attn)
    except ValueError as exc:
        if "attn_implementation" in str(exc) or "does not support" in str(exc):
            model = auto.from_config(hf_config, dtype=weight_dtype(setup),
                                     attn_implementation="eager")
        else:
            raise TraceUnsupported(f"model_type {model_type!r}: {exc}") from exc
    return model


def layer_lists(model: nn.Module, n_layers: int) -> list[tuple[str, nn.ModuleList]]:
    """The ModuleLists of repeated blocks (two for encoder-decoder models)."""
    found = []
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if (isinstance(module, nn.ModuleList) and len(module) == n_layers
                and last in ("layers", "h", "block", "layer", "blocks")):
            found.append((name, module))
    if not found:
        raise TraceUnsupported("model: no list of repeated blocks found (layers/h/block)")
    return found


def target_patterns(model_type: str, setup: TrainingSetup) -> str | list[str]:
    """PEFT `target_modules` for the setup's LoRA targets in this family's naming."""
    if setup.lora_targets == ALL_LINEAR:
        return "all-linear"
    mapping = TARGET_MAP.get(model_type, _LLAMA_LIKE)
    suffixes: list[str] = []
    for name in setup.lora_targets:
        if name == "lm_head":
            suffixes.append("classifier" if model_type in CLASSIFIER else "lm_head")
            continue
        suffixes.extend(mapping.get(name, []))
    if not suffixes:
        raise TraceUnsupported(
            f"lora_targets: none of {list(setup.lora_targets)} exists in a {model_type} model")
    unique = list(dict.fromkeys(suffixes))
    return r"(?:.*\.)?(?:" + "|".join(unique) + r")"


def _quantize(model: nn.Module, lists: list[tuple[str, nn.ModuleList]], setup: TrainingSetup,
              quant_head: bool) -> None:
    cdtype = compute_dtype(setup)
    quant = setup.effective_quant.value
    keeps = resolve(setup).bnb_keeps_matmul_input
    # transformers keeps these in full precision under bitsandbytes (T5's `wo`).
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    for _, blocks in lists:
        for block in blocks:
            for parent in list(block.modules()):
                for child_name, child in list(parent.named_children()):
                    if (isinstance(child, nn.Linear) and not isinstance(child, QuantLinear)
                            and child_name not in keep):
                        setattr(parent, child_name, QuantLinear(child, quant, cdtype, keeps))
    if quant_head:
        get_out = getattr(model, "get_output_embeddings", None)
        head = get_out() if get_out else None
        if type(head) is nn.Linear:
            for parent in model.modules():
                for child_name, child in list(parent.named_children()):
                    if child is head:
                        setattr(parent, child_name, QuantLinear(head, quant, cdtype, keeps))
            if hasattr(model.config, "tie_word_embeddings"):
                model.config.tie_word_embeddings = False


#: PEFT `target_parameters` of each `lora_experts` choice: the expert banks by their names in
#: transformers 5 (`gate_up_proj`, or `up_proj` for a non-gated expert; `down_proj`).
EXPERT_PARAMETERS: dict[ExpertBanks, tuple[str, ...]] = {
    ExpertBanks.NONE: (),
    ExpertBanks.GATE_UP: ("experts.gate_up_proj", "experts.up_proj"),
    ExpertBanks.DOWN: ("experts.down_proj",),
    ExpertBanks.ALL: ("experts.gate_up_proj", "experts.up_proj", "experts.down_proj"),
}


@contextlib.contextmanager
def _expert_adapters_without_dropout() -> Iterator[None]:
    """PEFT's `ParamWrapper` (LoRA on a parameter: the expert banks, a router weight) refuses
    `lora_dropout != 0` (peft/tuners/lora/layer.py@v0.21.2 `ParamWrapper.__init__`); axolotl
    builds it with dropout 0 and keeps the run's dropout on every other adapter
    (src/axolotl/loaders/adapter.py@01883e35 `_patch_peft_param_wrapper_dropout`). The trace
    does the same, so a run that names the banks (or whose targets PEFT rewrites into them)
    traces as axolotl runs it."""
    from peft.tuners.lora.layer import ParamWrapper

    original = ParamWrapper.__init__

    def init(self: Any, base_layer: Any, adapter_name: str, parameter_name: str, config: Any,
             *args: Any, **kwargs: Any) -> None:
        config = copy.copy(config)
        config.lora_dropout = 0.0
        original(self, base_layer, adapter_name, parameter_name, config, *args, **kwargs)

    ParamWrapper.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        ParamWrapper.__init__ = original  # type: ignore[method-assign]


#: axolotl's embedding modules by model type (src/axolotl/loaders/utils.py@v0.18.0#L231-L238
#: get_linear_embedding_layers); every other type: embed_tokens and lm_head.
_EMBEDDING_MODULES = {"gpt_neox": ("embed_in", "embed_out"),
                      "falcon": ("word_embeddings", "lm_head"),
                      "nemotron_h": ("embeddings", "lm_head")}


def _recast_norms_and_embeddings(model: nn.Module, model_type: str, dtype: torch.dtype) -> None:
    """axolotl after `prepare_model_for_kbit_training`: every module whose name holds 'norm',
    and the embedding modules, back to the model dtype (src/axolotl/loaders/model.py@v0.18.0
    `_convert_embedding_modules_dtype`, L1025-L1047; names matched as substrings)."""
    embeddings = _EMBEDDING_MODULES.get(model_type, ("embed_tokens", "lm_head"))
    for name, module in model.named_modules():
        if "norm" in name:
            module.to(dtype)
        if any(m in name for m in embeddings) and hasattr(module, "weight"):
            module.to(dtype)


def _apply_lora(model: nn.Module, model_type: str, setup: TrainingSetup, kind: str) -> nn.Module:
    from peft import LoraConfig, TaskType, get_peft_model

    task = {"causal": TaskType.CAUSAL_LM, "seq2seq": TaskType.SEQ_2_SEQ_LM,
            "classifier": TaskType.SEQ_CLS, "vlm": TaskType.CAUSAL_LM}[kind]
    frozen_vision = kind == "vlm" and bool(resolve(setup).run.freeze_vision)
    lora_config = LoraConfig(
        exclude_modules=vision.lora_exclusions() if frozen_vision else None,
        r=setup.lora_rank, lora_alpha=2 * setup.lora_rank,
        target_modules=target_patterns(model_type, setup),
        lora_dropout=setup.lora_dropout, task_type=task,
        # Conv1D stores its weight transposed; PEFT would set this itself, with a warning
        fan_in_fan_out=model_type in CONV1D_TYPES,
        target_parameters=list(EXPERT_PARAMETERS[setup.lora_experts]) or None,
    )
    # PEFT upcasts adapters to fp32 unless the stack keeps the model dtype (vram.stacks.table).
    keep_dtype = not stack_row(setup.framework).fp32_adapters
    with _expert_adapters_without_dropout():
        peft_model = get_peft_model(model, lora_config, autocast_adapter_dtype=not keep_dtype)
    if keep_dtype:
        dtype = weight_dtype(setup)
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.data = param.data.to(dtype)
    if setup.method is Method.QLORA:
        from peft.tuners.lora import Linear as LoraLinear

        bnb_cls = type("LoraBnbLinear", (LoraLinear,), {"forward": lora_forward_bnb})
        for module in peft_model.modules():
            if isinstance(module, LoraLinear) and isinstance(module.base_layer, QuantLinear):
                module.__class__ = bnb_cls
    return peft_model


def build(config: dict[str, Any], setup: TrainingSetup) -> Built:
    """Instantiate `config` with `setup` applied. Call inside a `FakeTensorMode`."""
    model_type = str(config.get("model_type", ""))
    kind = kind_of(model_type, config)
    n_layers = depth(config)
    if kind == "vlm" and (setup.sharding.shards_weights or setup.n_gpus > 1):
        raise TraceUnsupported("sharding: vision-language models are traced on one GPU")
    model = _instantiate(config, setup, kind)
    if setup.experts_implementation is Experts.EAGER:
        from vram.trace.moe import patch_moe, use_uniform_experts

        patch_moe()
        use_uniform_experts(model)
    lists = layer_lists(model, n_layers) if kind != "vlm" else vision.block_lists(
        model, n_layers, _vision_depth(config))
    if lists is None:
        raise TraceUnsupported("model: no list of decoder layers or vision blocks found")
    if setup.method is Method.QLORA:
        profile = profile_for(setup)
        _quantize(model, lists, setup, quant_head=profile.quantizes_head)
        if kind == "vlm":
            _quantize_linears(vision.projector_linears(model), setup)
        if profile.kbit_prepared:
            from peft import prepare_model_for_kbit_training

            prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
            if stack_row(setup.framework).kbit_recasts_16bit:
                _recast_norms_and_embeddings(model, model_type, weight_dtype(setup))
    if setup.ckpt_selective:
        raise TraceUnsupported("ckpt_selective: the trace runs Transformers' per-layer "
                               "checkpointing; torchtitan's per-op policy is not traced")
    if setup.grad_ckpt:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise TraceUnsupported(f"model_type {model_type!r}: no gradient checkpointing")
        # transformers 5.x renamed it (the old name warns "deprecated ... removed in v6" and
        # calls the new one); the pinned trace extra has the new name, an older one the old.
        # Always non-reentrant: a reentrant setup gets a note (`vram.trace.step`).
        kwargs = {"use_reentrant": False}
        enable: Any = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            enable = model.gradient_checkpointing_enable
            enable(gradient_checkpointing_kwargs=kwargs)
    hf = model
    if setup.method is Method.FULL:
        for param in model.parameters():
            param.requires_grad_(True)
        if kind == "vlm" and resolve(setup).run.freeze_vision:
            vision.freeze(model)
    else:
        model = _apply_lora(model, model_type, setup, kind)
    model.train()
    config_of: Any = hf.config
    text_config = config_of.get_text_config() if kind == "vlm" else config_of
    vocab = int(getattr(text_config, "vocab_size", 0) or 0)
    inputs = vision.make_inputs(model_type, config, hf.config, setup) if kind == "vlm" else None
    return Built(model=model, hf=hf, kind=kind, autocast=autocast_dtype(setup), vocab=vocab,
                 layer_lists=lists, inputs=inputs)


def _vision_depth(config: dict[str, Any]) -> int:
    """The vision tower's blocks (`depth` in Qwen's config, else `num_hidden_layers`)."""
    tower = config["vision_config"]
    for key in ("depth", "num_hidden_layers"):
        if isinstance(tower.get(key), int):
            return int(tower[key])
    raise TraceUnsupported("vision_config: no depth / num_hidden_layers")


def _quantize_linears(linears: list[tuple[nn.Module, str, nn.Linear]],
                      setup: TrainingSetup) -> None:
    """Replace each (parent, name, Linear) by its bitsandbytes-style 4/8-bit twin."""
    keeps = resolve(setup).bnb_keeps_matmul_input
    for parent, name, child in linears:
        setattr(parent, name, QuantLinear(child, setup.effective_quant.value,
                                          compute_dtype(setup), keeps))


def trainable(model: nn.Module) -> Iterator[nn.Parameter]:
    return (p for p in model.parameters() if p.requires_grad)
