"""What each training stack really does, where stacks differ in ways that change memory.

The same setup costs different memory in Hugging Face Trainer + PEFT, LitGPT and torchtune,
because each makes its own choices about dtypes, tied heads, quantized layers and the loss.

`STACKS` holds one explicit row per stack: every behaviour and every knob default, each with
the `file@version` it was read from (`docs/stacks.md` is generated from it). `profile_for` is
the one place where a row meets a setup: a few behaviours apply only to QLoRA, or to sharded
QLoRA, or follow the precision recipe. A framework without a row is an error: a new stack
never silently behaves like another.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Literal

from vram.errors import VramError
from vram.setup.training import Framework, Loss, Method, Offload, Sharding, TrainingSetup
from vram.stacks.precision import PrecisionPolicy, precision_policy
from vram.stacks.rules import (
    bnb_keeps_matmul_input,
    effective_fsdp_version,
    fsdp1_keeps_frozen_unsharded,
    runs_deepspeed_engine,
    torch_autocast,
)
from vram.units import Dtype


@dataclass(frozen=True, slots=True, kw_only=True)
class StackRow:
    """One stack's behaviours and defaults, as read from its source (`sources` names it)."""

    #: Builds a separate lm_head, copying a tied embedding into it.
    unties_head: bool
    #: QLoRA quantizes the output head too (every nn.Linear becomes Linear4bit).
    quantizes_head: bool
    #: QLoRA on one device: `prepare_model_for_kbit_training` casts every non-quantized
    #: parameter to fp32.
    kbit_upcast: bool
    #: ... and also when the QLoRA base is sharded (TRL skips the upcast there).
    kbit_upcast_sharded: bool
    #: LoRA adapters are upcast to fp32 (PEFT's `autocast_adapter_dtype=True`).
    fp32_adapters: bool
    #: The loss runs on `logits.float()`.
    upcasts_logits: bool
    #: The loss the stack's recipes use (chunked: the logits are never whole in fp32).
    default_loss: Loss
    #: AdamW/Lion step with fused kernels (no full-size temporaries); False: foreach.
    fused_optimizer: bool
    #: The key/value heads are expanded to all query heads before attention (a copy).
    expands_kv: bool
    #: Norms upcast their input to fp32 and keep that copy for backward.
    norm_keeps_fp32_input: bool
    #: LoRA on a fused qkv adapts the selected slices (not the whole fused module).
    adapts_fused_slices: bool
    #: QLoRA's 4-bit Linear keeps its input for backward (bitsandbytes MatMul4Bit), rather than
    #: the weight only (torchao's NF4 linear).
    quantized_linear_keeps_input: bool
    #: A trained RMSNorm keeps its normalized input in fp32 (multiplies by `weight.float()`).
    norm_keeps_fp32_normalized: bool
    #: Sharded LoRA keeps frozen parameters unsharded through backward (FSDP1, PyTorch <= 2.1).
    fsdp_keeps_frozen_unsharded: bool
    #: The MLP activation is a fused kernel (F.silu / F.gelu) whatever the config says.
    fused_activations: bool
    #: torch.compile of model and loss in the stack's published runs.
    default_compile: bool
    #: Activation checkpointing through reentrant `torch.utils.checkpoint`.
    default_ckpt_reentrant: bool
    #: ... in the stack's sharded-QLoRA recipe (PEFT's DeepSpeed/FSDP guides pass True).
    sharded_qlora_ckpt_reentrant: bool
    #: FSDP generation the stack wraps with (1: FullyShardedDataParallel, 2: fully_shard;
    #: None: the stack shards with DeepSpeed ZeRO, not FSDP).
    default_fsdp_version: Literal[1, 2] | None
    #: FSDP2 wraps the token embedding and the output head as units of their own (the
    #: `fsdp_embedding_units` default) in the stack's full fine-tune recipe ...
    default_fsdp_embedding_units: bool
    #: ... and in its LoRA/QLoRA recipe.
    adapter_fsdp_embedding_units: bool
    #: The training loop keeps the logits referenced through backward.
    keeps_logits: bool
    #: The loop keeps the previous step's `logits` and `loss` into the next forward.
    keeps_previous_graph: bool
    #: QLoRA quantizes from an fp16 copy, so each dequantization is fp16 then a cast.
    quantizes_from_fp16: bool
    #: The module's floating outputs are cast to fp32 (Lightning Fabric `convert_output`).
    casts_output_to_fp32: bool
    #: The bitsandbytes version the stack pins ("0.42.0"); None: it pins none (a current one).
    default_bitsandbytes_version: str | None
    #: DeepSpeed ZeRO-3's reduce_bucket_size in the stack's configs; None: DeepSpeed's default.
    default_zero_reduce_bucket_values: int | None
    #: DeepSpeed ZeRO-3's stage3_param_persistence_threshold in the stack's configs; None:
    #: DeepSpeed's default (1e5).
    default_zero_param_persistence_threshold: int | None
    #: DeepSpeed ZeRO-3's memory-efficient Linear is installed: the model is built inside
    #: deepspeed.zero.Init (None: the stack does not run DeepSpeed).
    default_zero3_linear_wrapper: bool | None
    #: The stack's chunked loss is a fused linear + cross-entropy (Liger): no whole logits.
    chunked_loss_fuses_head: bool
    #: A LoRA base under a mixed recipe is loaded in 16 bits (the checkpoint's dtype), not
    #: upcast to fp32 like trained weights (`vram.stacks.precision.lora_base_16bit`).
    loads_lora_base_16bit: bool
    #: Checkpointed layer inputs are offloaded to CPU memory (the `ckpt_offload` default).
    default_ckpt_offload: bool
    #: QLoRA quantizes MoE expert banks (experts as nn.Linear); False: the model code holds a
    #: bank as one 3-D parameter, which bitsandbytes' Linear replacement passes by.
    quantizes_expert_banks: bool
    #: `file@version` for each field above (every field has one: a test says so).
    sources: MappingProxyType[str, str]


#: The fields of a row that hold a behaviour or a default (every one needs a source).
ROW_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StackRow) if f.name != "sources")


def _cite(**by_field: str) -> MappingProxyType[str, str]:
    return MappingProxyType(dict(by_field))


# Citations shared by the stacks that run Transformers' model code with PEFT.
_TF = "transformers@v4.46.0"
_PEFT_ADAPTER = ("peft/tuners/tuners_utils.py@v0.13.0 BaseTuner._cast_adapter_dtype "
                 "(get_peft_model autocast_adapter_dtype=True)")
_PEFT_KBIT = "peft/utils/other.py@v0.13.0 prepare_model_for_kbit_training"
_TRL_SHARDED = ("trl/trainer/sft_trainer.py@v0.12.0: no kbit preparation when the base is "
                "sharded (FSDP/ZeRO-3 QLoRA)")
_HF_LOSS = f"transformers/loss/loss_utils.py@{_TF.split('@')[1]} ForCausalLMLoss logits.float()"
_HF_CODE = f"transformers/models/llama/modeling_llama.py@{_TF.split('@')[1]}"
_BNB_KEEPS = "bitsandbytes/autograd/_functions.py@0.44.1 MatMul4Bit ctx.tensors = (A, B)"
_HF_BNB = ("transformers/integrations/bitsandbytes.py@v4.46.0 (no pin: the installed "
           "bitsandbytes, current >= 0.43.3)")
_HF_LIGER = ("transformers/training_args.py@v4.46.0 use_liger_kernel (the Trainer's chunked loss: "
             "liger_kernel/ops/fused_linear_cross_entropy.py@v0.3.0)")
_HF_REENTRANT = ("transformers/modeling_utils.py@v5.0.0 gradient_checkpointing_enable "
                 "(use_reentrant=False unless given)")
_PEFT_SHARDED_CKPT = ("peft docs/source/accelerate/{deepspeed,fsdp}.md@v0.13.0: "
                      "use_reentrant=True for sharded QLoRA")
_HF_FSDP = "accelerate/utils/dataclasses.py@v1.0.0 FullyShardedDataParallelPlugin (FSDP1)"
_HF_FSDP2_WRAP = ("accelerate/utils/fsdp_utils.py@v1.13.0 fsdp2_prepare_model: fully_shard "
                  "on the auto-wrap policy's layers, then the model (embedding and head in "
                  "the root unit)")
_NONE = "not done: no such code path in the stack"


#: Hugging Face Trainer (and TRL's SFTTrainer) with PEFT on Transformers' model code.
_HF_TRAINER = StackRow(
    unties_head=False, quantizes_head=False, kbit_upcast=True, kbit_upcast_sharded=False,
    fp32_adapters=True, upcasts_logits=True, default_loss=Loss.STANDARD,
    fused_optimizer=True, expands_kv=False, norm_keeps_fp32_input=True,
    adapts_fused_slices=False, quantized_linear_keeps_input=True,
    norm_keeps_fp32_normalized=False, fsdp_keeps_frozen_unsharded=False,
    fused_activations=False, default_compile=False, default_ckpt_reentrant=False,
    sharded_qlora_ckpt_reentrant=True, default_fsdp_version=1,
    default_fsdp_embedding_units=False, adapter_fsdp_embedding_units=False,
    default_bitsandbytes_version=None,
    chunked_loss_fuses_head=True, loads_lora_base_16bit=True, default_ckpt_offload=False,
    quantizes_expert_banks=False,
    default_zero3_linear_wrapper=True, default_zero_param_persistence_threshold=None,
    default_zero_reduce_bucket_values=None, keeps_logits=False,
    keeps_previous_graph=False, quantizes_from_fp16=False, casts_output_to_fp32=False,
    sources=_cite(
            chunked_loss_fuses_head=_HF_LIGER,
            quantizes_expert_banks=("transformers/integrations/bitsandbytes.py@v5.24.0#L189 "
                                    "replaces type(module) is nn.Linear only; models/mixtral/"
                                    "modeling_mixtral.py@v5.24.0#L65-L66 banks are 3-D "
                                    "nn.Parameter"),
            default_ckpt_offload=("transformers/modeling_utils.py@v5.24.0 "
                                  "gradient_checkpointing_enable (inputs kept on the GPU)"),
            loads_lora_base_16bit=("transformers/modeling_utils.py@v5.24.0#L4186 "
                                   "from_pretrained dtype defaults to 'auto' (the checkpoint's "
                                   "bf16); PEFT/TRL recipes pass torch_dtype=bfloat16"),
            default_zero_reduce_bucket_values=(
                "transformers/integrations/deepspeed.py@v4.46.0 (the stack shards with FSDP)"),
            default_zero_param_persistence_threshold=(
                "transformers/integrations/deepspeed.py@v4.46.0 (the stack shards with FSDP)"),
            default_zero3_linear_wrapper=(
                "transformers/modeling_utils.py@v4.46.0 from_pretrained builds the model inside "
                "deepspeed.zero.Init under ZeRO-3 (is_deepspeed_zero3_enabled)"),
            default_bitsandbytes_version=_HF_BNB,
        unties_head=f"{_HF_CODE} (tie_word_embeddings shares the matrix)",
        quantizes_head=("transformers/integrations/bitsandbytes.py@v4.46.0 "
                        "llm_int8_skip_modules keeps lm_head 16-bit"),
        kbit_upcast=_PEFT_KBIT, kbit_upcast_sharded=_TRL_SHARDED,
        fp32_adapters=_PEFT_ADAPTER, upcasts_logits=_HF_LOSS,
        default_loss=_HF_LOSS,
        fused_optimizer=("transformers/training_args.py@v5.0.0 default_optim = "
                         "'adamw_torch_fused' with torch >= 2.8 (older: adamw_torch, foreach)"),
        expands_kv=f"{_HF_CODE} (SDPA/flash get k, v unexpanded)",
        norm_keeps_fp32_input=f"{_HF_CODE} LlamaRMSNorm hidden_states.to(torch.float32)",
        adapts_fused_slices="peft/tuners/lora/model.py@v0.13.0 (whole modules only)",
        quantized_linear_keeps_input=_BNB_KEEPS,
        norm_keeps_fp32_normalized=f"{_HF_CODE} LlamaRMSNorm weight * x.to(input_dtype)",
        fsdp_keeps_frozen_unsharded=_HF_FSDP + " on PyTorch >= 2.2 (pytorch#101982)",
        fused_activations=f"{_HF_CODE} ACT2FN (Python activation modules)",
        default_compile="transformers/training_args.py@v4.46.0 torch_compile=False",
        default_ckpt_reentrant=_HF_REENTRANT,
        sharded_qlora_ckpt_reentrant=_PEFT_SHARDED_CKPT, default_fsdp_version=_HF_FSDP,
        default_fsdp_embedding_units=_HF_FSDP2_WRAP, adapter_fsdp_embedding_units=_HF_FSDP2_WRAP,
        keeps_logits="transformers/trainer.py@v4.46.0 training_step drops outputs",
        keeps_previous_graph="transformers/trainer.py@v4.46.0 (loss.detach() returned)",
        quantizes_from_fp16=("transformers/integrations/bitsandbytes.py@v4.46.0 "
                             "(quantizes from the loaded dtype)"),
        casts_output_to_fp32=f"{_HF_CODE} (logits returned in compute dtype)",
    ),
)


def _like(base: StackRow, **changes: tuple[object, str]) -> StackRow:
    """`base` with the named fields changed, each given as (value, source)."""
    unknown = set(changes) - set(ROW_FIELDS)
    if unknown:
        raise TypeError(f"unknown stack fields: {sorted(unknown)}")
    values = {name: value for name, (value, _) in changes.items()}
    sources = {**base.sources, **{name: source for name, (_, source) in changes.items()}}
    return replace(base, **values, sources=MappingProxyType(sources))  # type: ignore[arg-type]


#: A stack whose optimizer is plain torch.optim.AdamW: foreach on CUDA, whose sqrt(v) is a
#: full-size temporary.
_FOREACH = "torch.optim.AdamW (foreach, the CUDA default: torch/optim/adamw.py@v2.4.0)"

_AXOLOTL_CONFIG = "axolotl src/axolotl/utils/config/__init__.py@00ce888"
_LLAMA_FACTORY = "LLaMA-Factory@06d78ff src/llamafactory"
_TORCHTITAN = "torchtitan@6404b93"
_DEEPSPEED = "deepspeed@v0.16.0"
_DS_EXAMPLE = "DeepSpeedExamples training/bf16_master_weight/train.py@ac3800b7"
_DS_EXAMPLE_CONFIG = "DeepSpeedExamples training/bf16_master_weight/configs/baseline.json@ac3800b7"
_LITGPT = "litgpt@v0.4.0"
_LIGHTNING = "lightning@2.3.0"
_TORCHTUNE = "torchtune@v0.3.0"
_UNSLOTH = "unslothai/unsloth unsloth@November-2024"
_UNSLOTH_ZOO = "unslothai/unsloth-zoo unsloth_zoo@ce232d6c"

#: Every stack `vram` knows, one explicit row each.
STACKS: MappingProxyType[Framework, StackRow] = MappingProxyType({
    Framework.HF_TRAINER: _HF_TRAINER,
    # PEFT + accelerate scripts (peft/examples).
    Framework.PEFT_ACCELERATE: _like(_HF_TRAINER, fused_optimizer=(
        False, f"peft/examples/sft/train.py@v0.13.0 {_FOREACH}")),
    # Answer.AI's fsdp_qlora: Transformers + PEFT/custom LoRA.
    Framework.FSDP_QLORA: _like(_HF_TRAINER, fused_optimizer=(
        False, f"AnswerDotAI/fsdp_qlora train.py@main {_FOREACH}")),
    # Unsloth: Transformers + TRL underneath, with its own checkpointing and loss.
    Framework.UNSLOTH: _like(
        _HF_TRAINER,
        fused_optimizer=(False, f"unslothai/unsloth README@2024.11 {_FOREACH}"),
        default_ckpt_offload=(True, f"{_UNSLOTH}/models/loader.py#L78 from_pretrained("
                                    "use_gradient_checkpointing='unsloth') -> _utils.py#L534 "
                                    "_offloaded_gradient_checkpointing; "
                                    f"{_UNSLOTH_ZOO}/gradient_checkpointing.py#L269 "
                                    "hidden_states.to('cpu')"),
        default_ckpt_reentrant=(True, f"{_UNSLOTH_ZOO}/gradient_checkpointing.py#L259-L272 "
                                      "Unsloth_Offloaded_Gradient_Checkpointer (an autograd."
                                      "Function: forward under no_grad, like reentrant)"),
        sharded_qlora_ckpt_reentrant=(True, f"{_UNSLOTH_ZOO}/gradient_checkpointing.py#L259 "
                                            "(the same checkpointer)"),
        default_loss=(Loss.FUSED_LINEAR, f"{_UNSLOTH}/models/llama.py#L983 "
                                         "fused_linear_cross_entropy when HAS_CUT_CROSS_ENTROPY "
                                         f"({_UNSLOTH_ZOO}/loss_utils.py#L46-L52: torch >= 2.4, "
                                         "triton >= 3; cut_cross_entropy is a dependency, "
                                         "unsloth-zoo pyproject.toml@ce232d6c#L33)"),
    ),
    # A hand-written loop on Transformers + PEFT.
    Framework.OTHER: _like(_HF_TRAINER, fused_optimizer=(False, _FOREACH)),
    # axolotl: HF Trainer + PEFT underneath, with its own defaults.
    Framework.AXOLOTL: _like(
        _HF_TRAINER,
        default_ckpt_reentrant=(True, f"{_AXOLOTL_CONFIG} normalize_config "
                                      "gradient_checkpointing_kwargs={'use_reentrant': True}"),
        sharded_qlora_ckpt_reentrant=(True, f"{_AXOLOTL_CONFIG} normalize_config (any run)"),
        fused_optimizer=(True, "axolotl src/axolotl/utils/schemas/training.py@94c00c1 "
                               "optimizer default adamw_torch_fused"),
        chunked_loss_fuses_head=(False, "axolotl src/axolotl/monkeypatch/loss/chunked.py@067b021 "
                                        "CEWithChunkedOutputLoss (torchtune's: chunks kept; "
                                        "Liger's is liger_fused_linear_cross_entropy)"),
    ),
    # LLaMA-Factory: HF Trainer + PEFT, its own model preparation instead of PEFT's.
    Framework.LLAMA_FACTORY: _like(
        _HF_TRAINER,
        default_ckpt_reentrant=(True, f"{_LLAMA_FACTORY}/hparams/model_args.py "
                                      "use_reentrant_gc=True"),
        sharded_qlora_ckpt_reentrant=(True, f"{_LLAMA_FACTORY}/model/model_utils/"
                                            "checkpointing.py (False only under FSDP2)"),
        kbit_upcast=(False, f"{_LLAMA_FACTORY}/model/model_utils/checkpointing.py "
                            "prepare_model_for_training (no kbit upcast; "
                            "upcast_layernorm=False)"),
        default_fsdp_version=(1, f"{_LLAMA_FACTORY}/model/model_utils/checkpointing.py "
                                 "FSDP_VERSION defaults to 1"),
    ),
    Framework.LITGPT: StackRow(
        unties_head=True, quantizes_head=True, kbit_upcast=False, kbit_upcast_sharded=False,
        fp32_adapters=False, upcasts_logits=False, default_loss=Loss.CHUNKED,
        fused_optimizer=False, expands_kv=True, norm_keeps_fp32_input=True,
        adapts_fused_slices=True, quantized_linear_keeps_input=True,
        norm_keeps_fp32_normalized=False, fsdp_keeps_frozen_unsharded=True,
        fused_activations=True, default_compile=False, default_ckpt_reentrant=False,
        sharded_qlora_ckpt_reentrant=False, default_fsdp_version=1,
    default_fsdp_embedding_units=False, adapter_fsdp_embedding_units=False,
    default_bitsandbytes_version="0.42.0",
    chunked_loss_fuses_head=False, loads_lora_base_16bit=False, default_ckpt_offload=False,
    quantizes_expert_banks=True,
    default_zero3_linear_wrapper=None, default_zero_param_persistence_threshold=None,
    default_zero_reduce_bucket_values=None, keeps_logits=True,
        keeps_previous_graph=True, quantizes_from_fp16=True, casts_output_to_fp32=True,
        sources=_cite(
            quantizes_expert_banks=(f"litgpt/model.py@{_LITGPT}#L329 LLaMAMoE experts = "
                                    "ModuleList of LLaMAMLP (nn.Linear: each becomes "
                                    "Linear4bit)"),
            default_ckpt_offload=(f"litgpt/finetune/lora.py@{_LITGPT} activation_checkpointing"
                                  "_policy (inputs kept on the GPU)"),
            loads_lora_base_16bit=(f"lightning/fabric/plugins/precision/amp.py@{_LIGHTNING} "
                                   "MixedPrecision (bf16-mixed keeps the fp32 module)"),
            chunked_loss_fuses_head=(
                f"litgpt/utils.py@{_LITGPT} chunked_cross_entropy (all chunks' logits kept)"),
            default_zero_reduce_bucket_values=(
                f"litgpt/finetune/lora.py@{_LITGPT} (FSDP, not DeepSpeed)"),
            default_zero_param_persistence_threshold=(
                f"litgpt/finetune/lora.py@{_LITGPT} (FSDP, not DeepSpeed)"),
            default_zero3_linear_wrapper=f"litgpt/finetune/lora.py@{_LITGPT} (FSDP, not DeepSpeed)",
            default_bitsandbytes_version=(
                f"pyproject.toml@{_LITGPT} extra bitsandbytes==0.42.0"),
            unties_head=f"litgpt/model.py@{_LITGPT} GPT.__init__ (lm_head always its own)",
            quantizes_head=(f"lightning/fabric/plugins/precision/bitsandbytes.py@{_LIGHTNING} "
                            "(every nn.Linear becomes Linear4bit)"),
            kbit_upcast=f"litgpt/finetune/lora.py@{_LITGPT} (no kbit preparation)",
            kbit_upcast_sharded=f"litgpt/finetune/lora.py@{_LITGPT} (no kbit preparation)",
            fp32_adapters=f"litgpt/lora.py@{_LITGPT} (adapters in the model dtype)",
            upcasts_logits=f"litgpt/utils.py@{_LITGPT} chunked_cross_entropy (no .float())",
            default_loss=(f"litgpt/finetune/lora.py@{_LITGPT} lm_head_chunk_size=128 + "
                          "chunked_cross_entropy"),
            fused_optimizer=f"litgpt/finetune/lora.py@{_LITGPT} torch.optim.AdamW (foreach)",
            expands_kv=f"litgpt/model.py@{_LITGPT} CausalSelfAttention k.expand(...)",
            norm_keeps_fp32_input=f"litgpt/model.py@{_LITGPT} RMSNorm x.float()",
            adapts_fused_slices=f"litgpt/lora.py@{_LITGPT} LoRAQKVLinear enable_lora",
            quantized_linear_keeps_input=_BNB_KEEPS,
            norm_keeps_fp32_normalized=(f"litgpt/model.py@{_LITGPT}#L433-L438 RMSNorm "
                                        "x_normed.to(dtype) * self.weight (16-bit; the fp32 "
                                        "product came with #1545, 2024-07-22, after v0.4.0)"),
            fsdp_keeps_frozen_unsharded=("torch/distributed/fsdp/_runtime_utils.py@v2.1.0 "
                                         "(pytorch#95805, fixed in v2.2.0 by #101982): "
                                         "LitGPT's published FSDP LoRA peaks"),
            fused_activations=f"litgpt/model.py@{_LITGPT} LLaMAMLP F.silu / GptNeoxMLP F.gelu",
            default_compile=f"litgpt/finetune/lora.py@{_LITGPT} (no torch.compile)",
            default_ckpt_reentrant=(f"litgpt/finetune/lora.py@{_LITGPT} activation_checkpointing"
                                    "_policy (non-reentrant wrapper)"),
            sharded_qlora_ckpt_reentrant=(f"litgpt/finetune/lora.py@{_LITGPT} "
                                          "(same wrapper when sharded)"),
            default_fsdp_embedding_units=(f"litgpt/finetune/full.py@{_LITGPT} FSDPStrategy("
                                          "auto_wrap_policy={Block}): the embedding and head "
                                          "are the root's"),
            adapter_fsdp_embedding_units=(f"litgpt/finetune/lora.py@{_LITGPT} FSDPStrategy("
                                          "auto_wrap_policy={Block}): the embedding and head "
                                          "are the root's"),
            default_fsdp_version=(f"litgpt/finetune/lora.py@{_LITGPT} FSDPStrategy "
                                  "(lightning FSDP1)"),
            keeps_logits=f"litgpt/finetune/lora.py@{_LITGPT} fit() keeps `logits`",
            keeps_previous_graph=(f"litgpt/finetune/lora.py@{_LITGPT} fit() keeps `logits` and "
                                  "`loss` until reassigned"),
            quantizes_from_fp16=(f"lightning/fabric/plugins/precision/bitsandbytes.py@"
                                 f"{_LIGHTNING} weight.to(dtype=torch.half)"),
            casts_output_to_fp32=(f"lightning/fabric/wrappers.py@{_LIGHTNING} "
                                  "_FabricModule.forward convert_output"),
        ),
    ),
    Framework.TORCHTUNE: StackRow(
        unties_head=False, quantizes_head=False, kbit_upcast=False, kbit_upcast_sharded=False,
        fp32_adapters=False, upcasts_logits=True, default_loss=Loss.CHUNKED,
        fused_optimizer=True, expands_kv=False, norm_keeps_fp32_input=True,
        adapts_fused_slices=False, quantized_linear_keeps_input=False,
        norm_keeps_fp32_normalized=False, fsdp_keeps_frozen_unsharded=False,
        fused_activations=True, default_compile=True, default_ckpt_reentrant=False,
        sharded_qlora_ckpt_reentrant=False, default_fsdp_version=2,
        default_fsdp_embedding_units=True, adapter_fsdp_embedding_units=False,
    default_bitsandbytes_version=None,
    chunked_loss_fuses_head=False, loads_lora_base_16bit=False, default_ckpt_offload=False,
    quantizes_expert_banks=False,
    default_zero3_linear_wrapper=None, default_zero_param_persistence_threshold=None,
    default_zero_reduce_bucket_values=None, keeps_logits=False,
        keeps_previous_graph=False, quantizes_from_fp16=False, casts_output_to_fp32=False,
        sources=_cite(
            quantizes_expert_banks=f"torchtune/models@{_TORCHTUNE} (no MoE model)",
            default_ckpt_offload=(f"recipes/configs/llama3_1/8B_lora_single_device.yaml@"
                                  f"{_TORCHTUNE} enable_activation_offloading: False"),
            loads_lora_base_16bit=(f"recipes/lora_finetune_single_device.py@{_TORCHTUNE} "
                                   "(dtype bf16 or fp32: no mixed recipe)"),
            chunked_loss_fuses_head=(
                f"torchtune/modules/loss/ce_chunked_output_loss.py@{_TORCHTUNE} (chunks kept)"),
            default_zero_reduce_bucket_values=f"{_TORCHTUNE} (FSDP2, not DeepSpeed)",
            default_zero_param_persistence_threshold=f"{_TORCHTUNE} (FSDP2, not DeepSpeed)",
            default_zero3_linear_wrapper=f"{_TORCHTUNE} (FSDP2, not DeepSpeed)",
            default_bitsandbytes_version=f"{_TORCHTUNE} (torchao NF4, no bitsandbytes)",
            unties_head=f"torchtune/modules/tied_linear.py@{_TORCHTUNE} TiedLinear",
            quantizes_head=f"torchtune/models/llama3/_component_builders.py@{_TORCHTUNE} "
                           "(output projection stays 16-bit)",
            kbit_upcast=f"recipes/lora_finetune_single_device.py@{_TORCHTUNE} (no upcast)",
            kbit_upcast_sharded=f"recipes/lora_finetune_distributed.py@{_TORCHTUNE} (no upcast)",
            fp32_adapters=f"torchtune/modules/peft/lora.py@{_TORCHTUNE} (model dtype)",
            upcasts_logits=(f"torchtune/modules/loss/ce_chunked_output_loss.py@{_TORCHTUNE} "
                            "logits.float() per chunk"),
            default_loss=(f"recipes/configs/llama3_1/8B_lora_single_device.yaml@{_TORCHTUNE} "
                          "CEWithChunkedOutputLoss"),
            fused_optimizer=(f"recipes/configs/llama3_1/8B_full.yaml@{_TORCHTUNE} "
                             "torch.optim.AdamW fused: True"),
            expands_kv=(f"torchtune/modules/attention.py@{_TORCHTUNE} "
                        "(SDPA enable_gqa / expand views)"),
            norm_keeps_fp32_input=f"torchtune/modules/rms_norm.py@{_TORCHTUNE} x.float()",
            adapts_fused_slices=(f"torchtune/models/llama3/_component_builders.py@{_TORCHTUNE} "
                                 "(separate q, k, v projections)"),
            quantized_linear_keeps_input=(f"torchtune/modules/low_precision/"
                                          f"_register_nf4_dispatch_ops.py@{_TORCHTUNE} "
                                          "(torchao linear_nf4 keeps the weight only)"),
            norm_keeps_fp32_normalized=(f"torchtune/modules/rms_norm.py@{_TORCHTUNE} "
                                        "(output cast before * scale)"),
            fsdp_keeps_frozen_unsharded=f"recipes/lora_finetune_distributed.py@{_TORCHTUNE} "
                                        "fully_shard (FSDP2)",
            fused_activations=f"torchtune/modules/feed_forward.py@{_TORCHTUNE} F.silu",
            default_compile=("torchtune docs memory tables@v0.3.0 (published with "
                             "compile=True)"),
            default_ckpt_reentrant=(f"torchtune/training/activations.py@{_TORCHTUNE} "
                                    "checkpoint_wrapper NO_REENTRANT"),
            sharded_qlora_ckpt_reentrant=(f"torchtune/training/activations.py@{_TORCHTUNE} "
                                          "checkpoint_wrapper NO_REENTRANT"),
            default_fsdp_embedding_units=(
                f"recipes/configs/llama3_1/70B_full.yaml@{_TORCHTUNE} custom_sharded_layers: "
                "['tok_embeddings', 'output'] (also 8B_full; recipes/full_finetune_"
                "distributed.py shards each as its own unit, reshard_after_forward as the "
                "blocks)"),
            adapter_fsdp_embedding_units=(
                f"recipes/lora_finetune_distributed.py@{_TORCHTUNE} _is_layer_name: only the "
                "layers, then the model (embedding and output in the root unit)"),
            default_fsdp_version=(f"recipes/lora_finetune_distributed.py@{_TORCHTUNE} "
                                  "fully_shard (FSDP2)"),
            keeps_logits=f"recipes/lora_finetune_single_device.py@{_TORCHTUNE} del logits",
            keeps_previous_graph=(f"recipes/lora_finetune_single_device.py@{_TORCHTUNE} "
                                  "(loss.detach() kept)"),
            quantizes_from_fp16=f"torchtune/modules/low_precision/nf4_linear.py@{_TORCHTUNE} "
                                "(to_nf4 from bf16)",
            casts_output_to_fp32=f"recipes/lora_finetune_single_device.py@{_TORCHTUNE} "
                                 "(logits in compute dtype)",
        ),
    ),
    # torchtitan: PyTorch-native pre-training (its own Llama code, FSDP2, no PEFT/QLoRA).
    Framework.TORCHTITAN: StackRow(
        unties_head=True, quantizes_head=False, kbit_upcast=False, kbit_upcast_sharded=False,
        fp32_adapters=False, upcasts_logits=True, default_loss=Loss.STANDARD,
        fused_optimizer=True, expands_kv=True, norm_keeps_fp32_input=True,
        adapts_fused_slices=False, quantized_linear_keeps_input=False,
        norm_keeps_fp32_normalized=False, fsdp_keeps_frozen_unsharded=False,
        fused_activations=True, default_compile=False, default_ckpt_reentrant=False,
        sharded_qlora_ckpt_reentrant=False, default_fsdp_version=2,
        default_fsdp_embedding_units=True, adapter_fsdp_embedding_units=True,
    default_bitsandbytes_version=None,
    chunked_loss_fuses_head=False, loads_lora_base_16bit=False, default_ckpt_offload=False,
    quantizes_expert_banks=False,
    default_zero3_linear_wrapper=None, default_zero_param_persistence_threshold=None,
    default_zero_reduce_bucket_values=None, keeps_logits=False,
        keeps_previous_graph=False, quantizes_from_fp16=False, casts_output_to_fp32=False,
        sources=_cite(
            loads_lora_base_16bit=f"torchtitan/train.py@{_TORCHTITAN} (no LoRA path)",
            quantizes_expert_banks=f"torchtitan/train.py@{_TORCHTITAN} (no QLoRA path)",
            default_ckpt_offload=(f"torchtitan/distributed/activation_checkpoint.py@"
                                  f"{_TORCHTITAN} (inputs kept on the GPU)"),
            chunked_loss_fuses_head=(
                f"torchtitan/components/loss.py@{_TORCHTITAN} (no chunked loss)"),
            default_zero_reduce_bucket_values=f"{_TORCHTITAN} (FSDP2, not DeepSpeed)",
            default_zero_param_persistence_threshold=f"{_TORCHTITAN} (FSDP2, not DeepSpeed)",
            default_zero3_linear_wrapper=f"{_TORCHTITAN} (FSDP2, not DeepSpeed)",
            default_bitsandbytes_version=(
                f"torchtitan/train.py@{_TORCHTITAN} (no QLoRA path)"),
            unties_head=f"torchtitan/models/llama3/model/model.py@{_TORCHTITAN} "
                        "self.output = nn.Linear (own matrix)",
            quantizes_head=f"torchtitan/train.py@{_TORCHTITAN} (no QLoRA path)",
            kbit_upcast=f"torchtitan/train.py@{_TORCHTITAN} (no QLoRA path)",
            kbit_upcast_sharded=f"torchtitan/train.py@{_TORCHTITAN} (no QLoRA path)",
            fp32_adapters=f"torchtitan/train.py@{_TORCHTITAN} (no PEFT: model dtype)",
            upcasts_logits=f"torchtitan/components/loss.py@{_TORCHTITAN} cross_entropy("
                           "pred.float())",
            default_loss=f"torchtitan/components/loss.py@{_TORCHTITAN} full-logit "
                         "cross_entropy_loss",
            fused_optimizer=f"torchtitan/config/job_config.py@{_TORCHTITAN} Optimizer."
                            "implementation='fused' (Dec 2024 builds: fused=False, foreach)",
            expands_kv=f"torchtitan/models/llama3/model/model.py@{_TORCHTITAN} repeat_kv",
            norm_keeps_fp32_input=f"torchtitan/models/llama3/model/model.py@{_TORCHTITAN} "
                                  "nn.RMSNorm (upcasts internally)",
            adapts_fused_slices=f"torchtitan/models/llama3/model/model.py@{_TORCHTITAN} "
                                "(separate wq, wk, wv)",
            quantized_linear_keeps_input=f"torchtitan/train.py@{_TORCHTITAN} (no QLoRA path)",
            norm_keeps_fp32_normalized=f"torchtitan/models/llama3/model/model.py@"
                                       f"{_TORCHTITAN} nn.RMSNorm",
            fsdp_keeps_frozen_unsharded=f"torchtitan/models/llama3/infra/parallelize.py@"
                                        f"{_TORCHTITAN} fully_shard (FSDP2)",
            fused_activations=f"torchtitan/models/llama3/model/model.py@{_TORCHTITAN} "
                              "FeedForward F.silu",
            default_compile=f"torchtitan/config/job_config.py@{_TORCHTITAN} Compile."
                            "enable=False",
            default_ckpt_reentrant=f"torchtitan/distributed/activation_checkpoint.py@"
                                   f"{_TORCHTITAN} ptd_checkpoint_wrapper (non-reentrant)",
            sharded_qlora_ckpt_reentrant=f"torchtitan/distributed/activation_checkpoint.py@"
                                         f"{_TORCHTITAN} (same wrapper)",
            default_fsdp_embedding_units=(
                f"torchtitan/models/llama3/infra/parallelize.py@{_TORCHTITAN} apply_fsdp: "
                "tok_embeddings, each block, [norm, output], then the model"),
            adapter_fsdp_embedding_units=f"torchtitan/train.py@{_TORCHTITAN} (no LoRA path; "
                                         "apply_fsdp as for full training)",
            default_fsdp_version=f"torchtitan/models/llama3/infra/parallelize.py@"
                                 f"{_TORCHTITAN} apply_fsdp fully_shard",
            keeps_logits=f"torchtitan/train.py@{_TORCHTITAN} forward_backward_step "
                         "del pred before backward",
            keeps_previous_graph=f"torchtitan/train.py@{_TORCHTITAN} (loss detached)",
            quantizes_from_fp16=f"torchtitan/train.py@{_TORCHTITAN} (no QLoRA path)",
            casts_output_to_fp32=f"torchtitan/models/llama3/model/model.py@{_TORCHTITAN} "
                                 "(logits in the compute dtype)",
        ),
    ),
    # DeepSpeed's own engine driving a PyTorch model (DeepSpeedExamples scripts). Under a
    # mixed recipe ZeRO runs a 16-bit model with an fp32 master (vram.stacks.precision).
    Framework.DEEPSPEED: StackRow(
        unties_head=False, quantizes_head=False, kbit_upcast=False, kbit_upcast_sharded=False,
        fp32_adapters=False, upcasts_logits=False, default_loss=Loss.STANDARD,
        fused_optimizer=True, expands_kv=False, norm_keeps_fp32_input=True,
        adapts_fused_slices=False, quantized_linear_keeps_input=False,
        norm_keeps_fp32_normalized=False, fsdp_keeps_frozen_unsharded=False,
        fused_activations=True, default_compile=False, default_ckpt_reentrant=True,
        sharded_qlora_ckpt_reentrant=True, default_fsdp_version=None,
        default_fsdp_embedding_units=False, adapter_fsdp_embedding_units=False,
    default_bitsandbytes_version=None,
    chunked_loss_fuses_head=False, loads_lora_base_16bit=False, default_ckpt_offload=False,
    quantizes_expert_banks=False,
    default_zero3_linear_wrapper=False, default_zero_param_persistence_threshold=0,
    default_zero_reduce_bucket_values=50_000_000, keeps_logits=True,
        keeps_previous_graph=False, quantizes_from_fp16=False, casts_output_to_fp32=False,
        sources=_cite(
            quantizes_expert_banks=f"{_DS_EXAMPLE} (no QLoRA path)",
            default_ckpt_offload=(f"deepspeed/runtime/activation_checkpointing/config.py@"
                                  f"{_DEEPSPEED} cpu_checkpointing: false"),
            loads_lora_base_16bit=(f"deepspeed/runtime/engine.py@{_DEEPSPEED} (a mixed "
                                   "recipe runs a 16-bit model anyway)"),
            chunked_loss_fuses_head=f"{_DS_EXAMPLE} (no chunked loss)",
            default_zero_reduce_bucket_values=(
                f"{_DS_EXAMPLE_CONFIG} zero_optimization.reduce_bucket_size 5e7"),
            default_zero_param_persistence_threshold=(
                f"{_DS_EXAMPLE_CONFIG} zero_optimization.stage3_param_persistence_threshold 0"),
            default_zero3_linear_wrapper=(
                f"{_DS_EXAMPLE} builds the model, then deepspeed.initialize (no zero.Init); "
                "before DeepSpeed 0.19.4 (#8189) only zero.Init installed the wrapper: "
                "deepspeed/runtime/zero/partition_parameters.py@v0.18.4#L574-L580"),
            default_bitsandbytes_version=f"{_DS_EXAMPLE} (no QLoRA path)",
            unties_head=f"{_DS_EXAMPLE} (the model's own head)",
            quantizes_head=f"{_DS_EXAMPLE} (no QLoRA path)",
            kbit_upcast=f"{_DS_EXAMPLE} (no QLoRA path)",
            kbit_upcast_sharded=f"{_DS_EXAMPLE} (no QLoRA path)",
            fp32_adapters=f"deepspeed/runtime/engine.py@{_DEEPSPEED} (the engine casts the "
                          "whole module to the ZeRO dtype)",
            upcasts_logits=f"{_DS_EXAMPLE} nn.CrossEntropyLoss on the model's logits",
            default_loss=f"{_DS_EXAMPLE} nn.CrossEntropyLoss (full logits)",
            fused_optimizer=f"deepspeed/runtime/engine.py@{_DEEPSPEED} _configure_basic_"
                            "optimizer: FusedAdam unless torch_adam",
            expands_kv=f"{_DS_EXAMPLE} nn.MultiheadAttention (no grouped k/v)",
            norm_keeps_fp32_input=f"{_DS_EXAMPLE} nn.LayerNorm",
            adapts_fused_slices=f"{_DS_EXAMPLE} (no LoRA path)",
            quantized_linear_keeps_input=f"{_DS_EXAMPLE} (no QLoRA path)",
            norm_keeps_fp32_normalized=f"{_DS_EXAMPLE} nn.LayerNorm",
            fsdp_keeps_frozen_unsharded=f"deepspeed/runtime/zero/stage3.py@{_DEEPSPEED} "
                                        "(ZeRO-3 releases gathered parameters)",
            fused_activations=f"{_DS_EXAMPLE} nn.GELU",
            default_compile=f"deepspeed/runtime/config.py@{_DEEPSPEED} compile disabled",
            default_ckpt_reentrant=f"deepspeed/runtime/activation_checkpointing/"
                                   f"checkpointing.py@{_DEEPSPEED} CheckpointFunction "
                                   "(an autograd.Function: reentrant)",
            sharded_qlora_ckpt_reentrant=f"deepspeed/runtime/activation_checkpointing/"
                                         f"checkpointing.py@{_DEEPSPEED} CheckpointFunction",
            default_fsdp_version=f"deepspeed/runtime/engine.py@{_DEEPSPEED} (ZeRO, not FSDP)",
            default_fsdp_embedding_units=f"{_DS_EXAMPLE} (ZeRO, not FSDP)",
            adapter_fsdp_embedding_units=f"{_DS_EXAMPLE} (ZeRO, not FSDP)",
            keeps_logits=f"{_DS_EXAMPLE} (logits bound through engine.backward)",
            keeps_previous_graph=f"{_DS_EXAMPLE} (loss.item() only)",
            quantizes_from_fp16=f"{_DS_EXAMPLE} (no QLoRA path)",
            casts_output_to_fp32=f"{_DS_EXAMPLE} (logits in the module dtype)",
        ),
    ),
})


def stack_row(framework: Framework) -> StackRow:
    """The row of `framework`; a framework without one is an error, not a guess."""
    row = STACKS.get(framework)
    if row is None:
        known = ", ".join(sorted(f.value for f in STACKS))
        raise VramError(f"framework: no stack profile for {framework.value!r}; known: {known}")
    return row


@dataclass(frozen=True, slots=True)
class StackProfile:
    """A stack's behaviours for one setup: what the estimate reads (see `StackRow`)."""

    unties_head: bool
    quantizes_head: bool
    upcasts_frozen_to_fp32: bool
    #: Bytes of the LoRA branch's input (the adapter dtype as it computes).
    adapter_bytes: int
    upcasts_logits: bool
    chunked_loss: bool
    #: The loss fuses the head and cross-entropy per chunk of tokens (Liger): see
    #: `vram.memory.head._fused_linear_head`.
    fused_linear_loss: bool
    fused_optimizer: bool
    expands_kv: bool
    norm_keeps_fp32_input: bool
    adapts_fused_slices: bool
    quantized_linear_keeps_input: bool
    norm_keeps_fp32_normalized: bool
    fsdp_keeps_frozen_unsharded: bool
    fused_activations: bool
    compiled: bool
    #: Checkpointing is non-reentrant: tensors an autograd Function keeps as ctx attributes
    #: (bitsandbytes' inputs) stay alive for every layer; reentrant checkpointing's forward
    #: keeps no graph at all.
    checkpoint_keeps_ctx_attributes: bool
    #: Checkpointed layer inputs live in CPU memory (`ckpt_offload`).
    offloads_checkpoints: bool
    #: QLoRA quantizes MoE expert banks (see `StackRow.quantizes_expert_banks`).
    quantizes_expert_banks: bool
    keeps_logits: bool
    keeps_previous_graph: bool
    #: bitsandbytes dequantizes to fp16 and casts to the compute dtype: two full copies.
    dequantizes_via_fp16: bool
    casts_output_to_fp32: bool
    #: The dtype of each kind of tensor in this run.
    precision: PrecisionPolicy
    #: FSDP2 (`fully_shard`) shards the run (`runs_fsdp2`; see `vram.sharding.fsdp2`).
    fsdp2: bool = False


def runs_transformers_code(profile: StackProfile) -> bool:
    """Whether the model code is Transformers' own (HF Trainer, PEFT, accelerate) rather than
    LitGPT's or torchtune's reimplementation: attention dispatch and masks follow it."""
    return not (profile.adapts_fused_slices or profile.fused_activations)


def _sharded_qlora(setup: TrainingSetup) -> bool:
    return setup.method is Method.QLORA and setup.sharding is Sharding.ZERO3


def effective_loss(setup: TrainingSetup) -> Loss:
    """The loss: the setup's, else the stack's default."""
    return setup.loss if setup.loss is not None else stack_row(setup.framework).default_loss


def effective_compile(setup: TrainingSetup) -> bool:
    """torch.compile: the setup's, else the stack's default."""
    if setup.compile is not None:
        return setup.compile
    return stack_row(setup.framework).default_compile


def ckpt_reentrant(setup: TrainingSetup) -> bool:
    """Reentrant activation checkpointing: the setup's choice, else the stack's default (its
    sharded-QLoRA recipe's when the QLoRA base is sharded)."""
    if setup.ckpt_reentrant is not None:
        return setup.ckpt_reentrant
    row = stack_row(setup.framework)
    if _sharded_qlora(setup):
        return row.sharded_qlora_ckpt_reentrant
    return row.default_ckpt_reentrant


def runs_fsdp2(setup: TrainingSetup) -> bool:
    """FSDP2 (`fully_shard`) shards the run: ZeRO-3-style sharding over 2+ GPUs, FSDP version 2
    (the setup's, else the stack's)."""
    return (setup.sharding is Sharding.ZERO3 and setup.n_gpus > 1
            and effective_fsdp_version(setup, stack_row(setup.framework).default_fsdp_version)
            == 2)


def fsdp_embedding_units(setup: TrainingSetup) -> bool:
    """FSDP2 wraps the embedding and the output head as units of their own: the setup's
    choice, else the stack's (its LoRA/QLoRA recipe's when adapters are trained)."""
    if setup.fsdp_embedding_units is not None:
        return setup.fsdp_embedding_units
    row = stack_row(setup.framework)
    if setup.trains_adapters:
        return row.adapter_fsdp_embedding_units
    return row.default_fsdp_embedding_units


def ckpt_offload(setup: TrainingSetup) -> bool:
    """Checkpointed layer inputs offloaded to CPU: the setup's choice, else activation offload
    (`offload="activations"`), else the stack's default. Without checkpointing: no."""
    if not setup.grad_ckpt:
        return False
    if setup.ckpt_offload is not None:
        return setup.ckpt_offload
    return setup.offload is Offload.ACTIVATIONS or stack_row(setup.framework).default_ckpt_offload


def profile_for(setup: TrainingSetup) -> StackProfile:
    """The stack's row applied to `setup`: the one place where behaviours depend on the
    method, the sharding or the precision."""
    row = stack_row(setup.framework)
    qlora = setup.method is Method.QLORA
    upcasts = row.kbit_upcast and qlora and (row.kbit_upcast_sharded or not _sharded_qlora(setup))
    deepspeed = runs_deepspeed_engine(setup, row.default_fsdp_version)
    precision = precision_policy(setup, fp32_adapters=row.fp32_adapters, upcasts_frozen=upcasts,
                                 base_16bit=row.loads_lora_base_16bit,
                                 deepspeed_engine=deepspeed,
                                 torch_autocast=torch_autocast(setup, deepspeed),
                                 fsdp2=runs_fsdp2(setup))
    return StackProfile(
        unties_head=row.unties_head,
        quantizes_head=row.quantizes_head and qlora,
        upcasts_frozen_to_fp32=upcasts,
        adapter_bytes=precision.adapter_inputs,
        upcasts_logits=row.upcasts_logits,
        chunked_loss=effective_loss(setup) is Loss.CHUNKED and not row.chunked_loss_fuses_head,
        fused_linear_loss=effective_loss(setup) is Loss.FUSED_LINEAR or (
            effective_loss(setup) is Loss.CHUNKED and row.chunked_loss_fuses_head),
        fused_optimizer=row.fused_optimizer,
        expands_kv=row.expands_kv,
        norm_keeps_fp32_input=row.norm_keeps_fp32_input,
        adapts_fused_slices=row.adapts_fused_slices,
        quantized_linear_keeps_input=(row.quantized_linear_keeps_input and qlora
                                      and bnb_keeps_matmul_input(
                                          setup, row.default_bitsandbytes_version)),
        norm_keeps_fp32_normalized=row.norm_keeps_fp32_normalized,
        fsdp_keeps_frozen_unsharded=fsdp1_keeps_frozen_unsharded(setup, row.default_fsdp_version),
        fused_activations=row.fused_activations,
        compiled=effective_compile(setup),
        checkpoint_keeps_ctx_attributes=not ckpt_reentrant(setup),
        offloads_checkpoints=ckpt_offload(setup),
        quantizes_expert_banks=row.quantizes_expert_banks,
        keeps_logits=row.keeps_logits,
        keeps_previous_graph=row.keeps_previous_graph,
        # Quantized from fp16, an fp16 compute dtype needs no second copy.
        dequantizes_via_fp16=(row.quantizes_from_fp16 and qlora
                              and precision.sixteen_bit is not Dtype.FP16),
        casts_output_to_fp32=row.casts_output_to_fp32,
        precision=precision,
        fsdp2=runs_fsdp2(setup),
    )


#: The knobs a user can set, whose default each stack decides (docs/stacks.md, first table).
KNOB_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("default_loss", "loss"),
    ("default_compile", "compile"),
    ("default_ckpt_reentrant", "ckpt_reentrant"),
    ("default_ckpt_offload", "ckpt_offload"),
    ("sharded_qlora_ckpt_reentrant", "ckpt_reentrant (sharded QLoRA)"),
    ("default_fsdp_version", "fsdp_version"),
    ("default_fsdp_embedding_units", "fsdp_embedding_units"),
    ("adapter_fsdp_embedding_units", "fsdp_embedding_units (LoRA/QLoRA)"),
    ("default_bitsandbytes_version", "bitsandbytes_version"),
    ("default_zero_reduce_bucket_values", "zero_reduce_bucket_values"),
    ("default_zero_param_persistence_threshold", "zero_param_persistence_threshold"),
    ("default_zero3_linear_wrapper", "zero3_linear_wrapper"),
)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "n/a"
    return str(value)


def stacks_markdown() -> str:
    """docs/stacks.md, generated from `STACKS` (a test keeps the file equal to it):
    `python -c "from vram.stacks.table import stacks_markdown; print(stacks_markdown(), end='')"`."""
    sources: dict[str, int] = {}

    def cite(framework: Framework, name: str) -> str:
        source = STACKS[framework].sources[name]
        number = sources.setdefault(source, len(sources) + 1)
        return f"{_cell(getattr(STACKS[framework], name))} [{number}]"

    frameworks = list(STACKS)
    lines = [
        "# Training stacks: knob defaults and behaviours",
        "",
        "Generated from `vram.stacks.table.STACKS` by `vram.stacks.table.stacks_markdown()`; "
        "`tests/domain/test_tables.py` keeps this file equal to it. Each value names the "
        "source it was read from (`file@version`, numbered below). A setup's own value "
        "(`loss`, `compile`, `ckpt_reentrant`, `fsdp_version`) overrides the stack's default.",
        "",
        "## Knob defaults",
        "",
        "| stack | " + " | ".join(label for _, label in KNOB_DEFAULTS) + " |",
        "|---" * (len(KNOB_DEFAULTS) + 1) + "|",
    ]
    for framework in frameworks:
        cells = [cite(framework, name) for name, _ in KNOB_DEFAULTS]
        lines.append(f"| {framework.value} | " + " | ".join(cells) + " |")
    knob_fields = {name for name, _ in KNOB_DEFAULTS}
    lines += [
        "",
        "## Behaviours",
        "",
        "| behaviour | " + " | ".join(f.value for f in frameworks) + " |",
        "|---" * (len(frameworks) + 1) + "|",
    ]
    for name in ROW_FIELDS:
        if name in knob_fields:
            continue
        cells = [cite(framework, name) for framework in frameworks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Sources", ""]
    lines += [f"{number}. {source}" for source, number in sources.items()]
    return "\n".join(lines) + "\n"
