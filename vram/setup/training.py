"""The training setup: every knob that changes how much memory one training step needs.

A `TrainingSetup` is frozen and validated; cross-field rules raise `ValueError` with a message
that names the field and says what is allowed. Defaults describe a sensible single-GPU QLoRA run.

    >>> TrainingSetup(method="full", optimizer="adamw", precision="bf16-mixed", micro_batch=4)
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vram.memory.allocator.conf import parse_alloc_conf
from vram.setup.compile import Compile, CompileLoss
from vram.setup.enums import (
    Attention,
    ContextParallel,
    ExpertBanks,
    Experts,
    Fp8Recipe,
    Framework,
    Loss,
    Method,
    Offload,
    Optimizer,
    PipelineSchedule,
    Precision,
    Quant,
    Sharding,
)
from vram.setup.knob import Knob
from vram.setup.layout import check_layout, shard_group
from vram.setup.liger import LigerVersion
from vram.setup.lora_targets import ALL_LINEAR, parse_lora_targets
from vram.setup.mixers import MixerKernels
from vram.setup.versions import MAJOR_MINOR_PATCH, lenient_version
from vram.setup.vision import (
    CropImages,
    FreezeVision,
    ImageHeight,
    ImagesPerSample,
    ImageWidth,
    MaxPixels,
    MinPixels,
    VideoFrames,
    VideoMaxPixels,
)

#: A PyTorch version's major and minor numbers at the start of its text.
TORCH_VERSION = re.compile(r"v?(\d{1,3})\.(\d{1,3})")
#: A bitsandbytes version's leading numbers: "0.41.1", "0.43" (patch 0 when absent).
BNB_VERSION = MAJOR_MINOR_PATCH

#: Names other tools use for the same sharding, accepted on input.
SHARDING_ALIASES: dict[str, Sharding] = {
    "fsdp-full": Sharding.ZERO3,
    "fsdp": Sharding.ZERO3,
    "fsdp-grad-op": Sharding.ZERO2,
    "fsdp-no-shard": Sharding.DDP,
}

#: The engine a sharding name states: FSDP's names are FSDP's; the case file's schema
#: (validation/README.md) spells DeepSpeed's stages zero1-3 apart from FSDP's fsdp-*, while
#: the CLI and the app read zero1-3 as "the stack's engine".
FSDP_SHARDING_NAMES = frozenset({"fsdp-full", "fsdp", "fsdp-grad-op", "fsdp-no-shard"})
CASE_FILE_DEEPSPEED_NAMES = frozenset({"zero1", "zero2", "zero3"})

MAX_MICRO_BATCH = 4096
MAX_SEQ_LEN = 4 * 1024 * 1024
MAX_GPUS = 4096
MAX_LORA_RANK = 4096
MAX_CONTEXT_MIB = 64 * 1024
#: The largest expert capacity factor accepted (every token of 64 ranks to one rank's experts).
MAX_CAPACITY_FACTOR = 64.0
#: The methods that train adapters (knobs of LoRA only mean something with them).
ADAPTERS: tuple[str, ...] = ("lora", "qlora")


class TrainingSetup(BaseModel):
    """How the model is trained: method, numerics, batch shape, parallelism and stack.

    Each field is a knob declared once: its `Knob` says how people meet it (the CLI flag, the
    app control and URL key, the case-file column); `vram.io.knobs` builds those from it.
    """

    # Numbers and switches are strict (no "3" -> 3); enums accept their text values.
    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Annotated[Method, Knob(
        "Method", key="method", flag="--method", column="method", basic=True,
        labels=(("full", "Full fine-tuning"), ("lora", "LoRA"), ("qlora", "QLoRA (4-bit base)")),
    )] = Method.QLORA
    lora_rank: Annotated[int, Field(strict=True, ge=1, le=MAX_LORA_RANK), Knob(
        "LoRA rank", key="rank", flag="--lora-rank", column="lora_rank", only_for=ADAPTERS,
        app_options=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    )] = 16
    lora_targets: Annotated[tuple[str, ...] | Literal["all-linear"], Knob(
        "LoRA targets", key="targets", flag="--lora-targets", column="lora_targets",
        only_for=ADAPTERS,
        help="q_proj,v_proj,... or all-linear ('all-linear' adapts every linear layer of the "
             "decoder)",
    )] = ALL_LINEAR
    lora_dropout: Annotated[float, Field(strict=False, ge=0.0, lt=1.0), Knob(
        "LoRA dropout", key="dropout", flag="--lora-dropout", only_for=ADAPTERS,
        app_options=(0.0, 0.05, 0.1),
        help="PEFT keeps the dropped-out copy of each adapted Linear's input.",
    )] = 0.05
    lora_experts: Annotated[ExpertBanks, Knob(
        "LoRA on expert banks", key="lexp", flag="--lora-experts", column="lora_experts",
        only_for=ADAPTERS,
        labels=(("none", "none beyond the targets"), ("gate_up", "gate/up banks"),
                ("down", "down banks"), ("all", "all expert banks")),
        help="MoE expert banks LoRA adapts through PEFT target_parameters (axolotl "
             "lora_target_parameters): a rank-r adapter per expert and a bank-sized copy of "
             "the adapted weights every forward",
    )] = ExpertBanks.NONE
    quant: Annotated[Quant | None, Knob(
        "Quantization of the base", key="quant", flag="--quant", column="quant",
        only_for=("qlora",),
        labels=(("auto", "default (NF4 for QLoRA)"), ("none", "none"), ("nf4", "NF4"),
                ("nf4-dq", "NF4 + double quant"), ("int8", "int8")),
        help="Only QLoRA quantizes the frozen base model.",
    )] = None
    optimizer: Annotated[Optimizer, Knob(
        "Optimizer", key="opt", flag="--optimizer", column="optimizer", basic=True,
        labels=(("adamw", "AdamW"), ("adamw-8bit", "AdamW 8-bit"),
                ("paged-adamw", "Paged AdamW"), ("paged-adamw-8bit", "Paged AdamW 8-bit"),
                ("sgd", "SGD"), ("sgd-momentum", "SGD + momentum"), ("adafactor", "Adafactor"),
                ("lion", "Lion"), ("adamw-in-backward", "AdamW fused in backward"),
                ("adamw-4bit", "AdamW 4-bit (torchao)"),
                ("galore-adamw8bit-per-layer", "GaLore AdamW 8-bit, per layer")),
    )] = Optimizer.ADAMW
    precision: Annotated[Precision, Knob(
        "Precision recipe", key="prec", flag="--precision", column="precision",
        labels=(("fp32", "fp32"), ("fp16-mixed", "fp16 mixed (AMP)"),
                ("bf16-mixed", "bf16 mixed (AMP)"), ("bf16-true", "pure bf16")),
    )] = Precision.BF16_MIXED
    micro_batch: Annotated[int, Field(strict=True, ge=1, le=MAX_MICRO_BATCH), Knob(
        "Micro-batch size", key="batch", flag="--batch", column="micro_batch", basic=True,
        app_options=tuple(range(1, 129)), help="sequences per GPU per step",
    )] = 1
    seq_len: Annotated[int, Field(strict=True, ge=1, le=MAX_SEQ_LEN), Knob(
        "Sequence length (tokens)", key="seq", flag="--seq", column="seq_len", basic=True,
        app_options=tuple(2**k for k in range(7, 18)), help="tokens per sequence",
    )] = 2048
    grad_accum: Annotated[int, Field(strict=True, ge=1, le=1_000_000), Knob(
        "Gradient accumulation steps", key="accum", flag="--grad-accum", column="grad_accum",
        app_options=(1, 2, 4, 8, 16, 32, 64, 128),
        help="More than 1 keeps every gradient alive through the next micro-batches.",
    )] = 1
    grad_ckpt: Annotated[bool, Field(strict=True), Knob(
        "Gradient checkpointing", key="ckpt", flag="--grad-ckpt", column="grad_ckpt",
        help="activation checkpointing per decoder layer",
    )] = False
    #: Selective (per-op) checkpointing, torchtitan's `selective_ac_option = "op"`: inside each
    #: checkpointed block the outputs of the attention kernel and of every other matmul are
    #: kept, the rest recomputed. The case file says `grad_ckpt = selective`.
    ckpt_selective: Annotated[bool, Field(strict=True), Knob(
        "Selective checkpointing (per op)", key="sac", flag="--ckpt-selective",
        help="with checkpointing: keep the attention kernel's and every other matmul's "
             "outputs (torchtitan's op policy)",
    )] = False
    #: Reentrant checkpointing (`use_reentrant=True`) runs the checkpointed forward under
    #: no_grad, so what an autograd Function keeps as ctx attributes (bitsandbytes' MatMul4Bit
    #: inputs) is not kept; non-reentrant keeps it. None: the stack's default.
    ckpt_reentrant: Annotated[bool | None, Field(strict=True), Knob(
        "Reentrant checkpointing", key="reentrant", flag="--ckpt-reentrant",
        column="ckpt_reentrant",
        labels=(("auto", "stack default"), ("true", "reentrant (use_reentrant=True)"),
                ("false", "non-reentrant")),
        help="torch.utils.checkpoint's use_reentrant, with checkpointing on (default: the "
             "stack's)",
    )] = None
    #: A LoRA base under a mixed recipe loaded in 16 bits (`dtype=torch.bfloat16`, or
    #: Transformers 5's `dtype="auto"`) rather than fp32. None: the stack's default.
    lora_base_16bit: Annotated[bool | None, Field(strict=True), Knob(
        "LoRA base in 16 bits", key="base16", flag="--lora-base-16bit",
        labels=(("auto", "stack default"), ("true", "16-bit base (bf16 / fp16)"),
                ("false", "fp32 base")),
        help="with LoRA under bf16/fp16 mixed precision: the frozen base loaded in 16 bits "
             "(default: the stack's; Transformers 5 loads the checkpoint's bf16)",
        only_for=("lora",),
    )] = None
    #: Checkpointed layer inputs are copied to CPU memory and brought back one layer at a time
    #: in backward (Unsloth's `use_gradient_checkpointing="unsloth"`). None: the stack's
    #: default; `offload="activations"` implies it.
    ckpt_offload: Annotated[bool | None, Field(strict=True), Knob(
        "Offload checkpoints to CPU", key="ckptoff", flag="--ckpt-offload",
        labels=(("auto", "stack default"), ("true", "checkpointed inputs on the CPU"),
                ("false", "checkpointed inputs on the GPU")),
        help="with checkpointing: each layer's saved input lives in CPU memory (default: the "
             "stack's; Unsloth offloads)",
    )] = None
    #: Who runs ZeRO-style sharding: DeepSpeed's ZeRO engine or PyTorch FSDP. None: the
    #: stack's (Accelerate's FSDP for the HF stacks, DeepSpeed for `deepspeed`). Hugging Face
    #: runs take either, from the same `sharding`; the case file spells DeepSpeed's `zero1-3`
    #: and FSDP's `fsdp-*` apart (`vram.io.validate`).
    sharding_engine: Annotated[Literal["deepspeed", "fsdp"] | None, Knob(
        "Sharding engine", key="engine", flag="--sharding-engine",
        labels=(("auto", "stack default"), ("deepspeed", "DeepSpeed ZeRO"),
                ("fsdp", "PyTorch FSDP")),
        help="with zero1-3: DeepSpeed's ZeRO engine or PyTorch FSDP (default: the stack's)",
    )] = None
    #: 1: the `FullyShardedDataParallel` wrapper; 2: `fully_shard`. None: the stack's default.
    fsdp_version: Annotated[Literal[1, 2] | None, Knob(
        "FSDP version", key="fsdp", flag="--fsdp-version", column="fsdp_version",
        labels=(("auto", "stack default"), ("1", "FSDP1 (FullyShardedDataParallel)"),
                ("2", "FSDP2 (fully_shard)")),
        help="with FSDP sharding: 1 = FullyShardedDataParallel, 2 = fully_shard (default: the "
             "stack's)",
    )] = None
    #: FSDP2's `fully_shard(reshard_after_forward=...)` for the blocks: free each block's
    #: all-gathered parameters after its forward (True) or keep them to its backward (False).
    #: None: the stack's default (FSDP2's True).
    fsdp_reshard_after_forward: Annotated[bool | None, Field(strict=True), Knob(
        "FSDP2 reshard after forward", key="reshard", flag="--fsdp-reshard-after-forward",
        labels=(("auto", "stack default"), ("true", "reshard (free after forward)"),
                ("false", "keep gathered parameters to backward")),
        help="with FSDP2: free each block's gathered parameters after its forward (default: "
             "the stack's, FSDP2's True)",
    )] = None
    #: FSDP2 wraps the token embedding and the output projection as units of their own
    #: (torchtune's `custom_sharded_layers: ['tok_embeddings', 'output']`, torchtitan's
    #: `apply_fsdp`), so the root unit keeps only the final norm; False: they are the root
    #: unit's (Accelerate's FSDP2). None: the stack's default (`vram.stacks.table`).
    fsdp_embedding_units: Annotated[bool | None, Field(strict=True), Knob(
        "FSDP2 embedding and head as units", key="embunits", flag="--fsdp-embedding-units",
        labels=(("auto", "stack default"), ("true", "embedding and head sharded as own units"),
                ("false", "embedding and head in the root unit")),
        help="with FSDP2: fully_shard the embedding and the output head as units of their own "
             "(default: the stack's; torchtitan and torchtune's full fine-tunes do)",
    )] = None
    #: The PyTorch version, as major.minor ("2.1"); None: a current one.
    torch_version: Annotated[str | None, Knob(
        "PyTorch version", key="torch", flag="--torch-version", column="torch_version",
        labels=(("auto", "a current one"),),
        app_options=("2.0", "2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9",
                     "2.10", "2.11"),
        help="PyTorch version such as 2.1 (default: a current one); FSDP1 before 2.2 kept "
             "frozen parameters unsharded in backward",
    )] = None
    #: The bitsandbytes version, as major.minor.patch ("0.41.1"); None: a current one, unless
    #: `torch_version` is 2.1 or older (see `vram.stacks.resolve`).
    bitsandbytes_version: Annotated[str | None, Knob(
        # No case-file column yet (../shared/validation/README.md): validate takes the
        # stack's pin, else the PyTorch version's time.
        "bitsandbytes version", key="bnb", flag="--bitsandbytes-version",
        labels=(("auto", "the stack's pin, else a current one"),),
        app_options=("0.41.1", "0.42.0", "0.43.0", "0.43.3", "0.45.5", "0.48.2", "0.50.2"),
        help="bitsandbytes version such as 0.41.1 (default: a current one, or one of "
             "PyTorch <= 2.1's time); up to 0.43.0 a 4-bit Linear kept its input for backward",
    )] = None
    liger_version: LigerVersion = None  # vram.setup.liger
    #: DeepSpeed ZeRO's reduce bucket in values; None: the stack's config, else DeepSpeed's
    #: default (5e8, deepspeed/runtime/zero/config.py@v0.16.0). No case-file column yet.
    zero_reduce_bucket_values: Annotated[int | None, Field(strict=True, ge=1, le=10**10), Knob(
        "ZeRO reduce bucket (values)", key="zbucket", flag="--zero-reduce-bucket",
        labels=(("auto", "the stack's, else DeepSpeed's 5e8"),),
        app_options=(50_000_000, 200_000_000, 500_000_000),
        help="DeepSpeed reduce_bucket_size: the IPG gradient bucket kept on each GPU under "
             "ZeRO-1/2/3 (default: the stack's config, else 5e8 values)",
    )] = None
    #: DeepSpeed's overlap_comm; None: DeepSpeed's default (on for ZeRO-3, off for ZeRO-1/2:
    #: deepspeed/runtime/zero/config.py@v0.16.0 overlap_comm_valid). ZeRO-1/2 then keep two
    #: reduce buckets instead of one.
    zero_overlap_comm: Annotated[bool | None, Field(strict=True), Knob(
        "ZeRO overlap_comm", key="zoverlap", flag="--zero-overlap-comm",
        labels=(("auto", "DeepSpeed's (ZeRO-3 on, ZeRO-1/2 off)"), ("true", "on"),
                ("false", "off")),
        help="DeepSpeed overlap_comm: ZeRO-1/2 double the reduce bucket (default: on for "
             "ZeRO-3, off for ZeRO-1/2)",
    )] = None
    #: DeepSpeed ZeRO-3's stage3_prefetch_bucket_size in parameters; None: DeepSpeed's 5e7.
    zero_prefetch_bucket_values: Annotated[int | None, Field(strict=True, ge=0, le=10**11), Knob(
        "ZeRO-3 prefetch bucket (parameters)", key="zprefetch", flag="--zero-prefetch-bucket",
        labels=(("auto", "DeepSpeed's 5e7"),),
        app_options=(0, 10_000_000, 50_000_000, 200_000_000),
        help="DeepSpeed stage3_prefetch_bucket_size: parameters gathered ahead of use "
             "(default 5e7)",
    )] = None
    #: DeepSpeed ZeRO-3's stage3_max_live_parameters; None: DeepSpeed's 1e9.
    zero_max_live_parameters: Annotated[int | None, Field(strict=True, ge=0, le=10**12), Knob(
        "ZeRO-3 max live parameters", key="zlive", flag="--zero-max-live-parameters",
        labels=(("auto", "DeepSpeed's 1e9"),),
        app_options=(100_000_000, 500_000_000, 1_000_000_000),
        help="DeepSpeed stage3_max_live_parameters: no prefetch beyond this many gathered "
             "parameters (default 1e9)",
    )] = None
    #: DeepSpeed ZeRO-3's stage3_max_reuse_distance in parameters; None: DeepSpeed's 1e9.
    zero_max_reuse_distance: Annotated[int | None, Field(strict=True, ge=0, le=10**12), Knob(
        "ZeRO-3 max reuse distance (parameters)", key="zreuse", flag="--zero-max-reuse-distance",
        labels=(("auto", "DeepSpeed's 1e9"),),
        app_options=(0, 100_000_000, 500_000_000, 1_000_000_000),
        help="DeepSpeed stage3_max_reuse_distance: a gathered parameter used again within "
             "this many parameters stays gathered, so the forward keeps the last ~half of it "
             "gathered for backward (default 1e9)",
    )] = None
    #: ZeRO-3's stage3_param_persistence_threshold; None: the stack's config, else DeepSpeed's 1e5.
    zero_param_persistence_threshold: Annotated[int | None, Field(strict=True, ge=0, le=10**12),
                                                Knob(
        "ZeRO-3 persistence threshold (values)", key="zpersist",
        flag="--zero-param-persistence-threshold",
        labels=(("auto", "the stack's, else DeepSpeed's 1e5"),),
        app_options=(0, 10_000, 100_000, 1_000_000),
        help="DeepSpeed stage3_param_persistence_threshold: parameters smaller than this stay "
             "whole on every GPU (default: the stack's config, else 1e5)",
    )] = None
    #: DeepSpeed ZeRO-3's memory-efficient Linear (`zero3_linear_wrap` in F.linear); None: the
    #: stack's. Without it, autograd keeps `weight.t()` (a view of the gathered weight) for each
    #: Linear's backward, so the gathered storage outlives its release until that backward.
    zero3_linear_wrapper: Annotated[bool | None, Field(strict=True), Knob(
        "ZeRO-3 memory-efficient Linear", key="zlinear", flag="--zero3-linear-wrapper",
        labels=(("auto", "the stack's"), ("true", "installed (zero.Init, DeepSpeed >= 0.19.4)"),
                ("false", "not installed")),
        help="DeepSpeed's zero3_linear_wrap in F.linear: installed by deepspeed.zero.Init, and "
             "from DeepSpeed 0.19.4 for any model; without it each gathered Linear weight stays "
             "on the GPU until its backward (default: the stack's)",
    )] = None
    #: torch.autocast over a model whose weights are 16-bit (pure bf16, or a ZeRO engine's
    #: 16-bit model): norms, softmax and the loss then run in fp32. None: DeepSpeed's
    #: low-precision model states (bf16-true under its ZeRO engine) run with it, as its
    #: documented config does; everything else without (`vram.stacks.resolve`).
    torch_autocast: Annotated[bool | None, Field(strict=True), Knob(
        "torch.autocast over a 16-bit model", key="autocast", flag="--torch-autocast",
        labels=(("auto", "DeepSpeed bf16-true: on; else off"), ("true", "on"), ("false", "off")),
        help="torch.autocast over 16-bit weights (DeepSpeed's torch_autocast section): norms, "
             "softmax and the loss run in fp32 (default: on for bf16-true under DeepSpeed "
             "ZeRO, else off)",
    )] = None
    #: The CUDA context in MiB as nvidia-smi counts it; None: the GPU's (data/gpus.csv).
    context_mib: Annotated[int | None, Field(strict=True, ge=0, le=MAX_CONTEXT_MIB), Knob(
        "CUDA context (MiB)", key="ctx", flag="--context-mib", column="context_mib",
        labels=(("auto", "the GPU's (data/gpus.csv)"),),
        app_options=(300, 500, 700, 1024, 1343, 2048),
        help="CUDA context, kernels and cuBLAS handle as nvidia-smi counts them (default: the "
             "GPU's, or 1024)",
    )] = None
    #: PyTorch's caching allocator settings (`PYTORCH_CUDA_ALLOC_CONF`, e.g.
    #: "expandable_segments:True"), in canonical form; "" is PyTorch's defaults; None: the
    #: stack's (data/stacks.toml). The trace replays a step under them
    #: (`vram.trace.allocator`); parsed as PyTorch parses them (`vram.memory.allocator.conf`).
    alloc_conf: Annotated[str | None, Knob(
        # The case-file column `alloc_conf` (issue 21) waits for ../shared/validation/cases.csv
        # to carry it; until then validate takes the stack's default.
        "Allocator settings (PYTORCH_CUDA_ALLOC_CONF)", key="alloc", flag="--alloc-conf",
        labels=(("auto", "stack default"), ("default", "PyTorch's defaults")),
        app_options=("expandable_segments:True", "default", "max_split_size_mb:128",
                     "expandable_segments:True,roundup_power2_divisions:16"),
        help="PYTORCH_CUDA_ALLOC_CONF such as expandable_segments:True or max_split_size_mb:128 "
             "(default: the stack's; 'default' for PyTorch's own)",
    )] = None
    #: Whether a step as long as the longest can follow another (packed or fixed-length data,
    #: any long run: yes). A stack that keeps the previous step's graph into the next forward
    #: (LitGPT) then holds two long steps at once; with a single longest batch (LitGPT's 2023
    #: scripts put it in the first step only) it does not. People state the opposite: the
    #: longest batch comes once.
    longest_batch_repeats: Annotated[bool, Field(strict=True), Knob(
        "Longest batch comes only once", key="once", flag="--longest-batch-once",
        column="longest_batch_once",
        flag_aliases=("--single-longest-batch",), inverse=True,
        help="only one step is as long as --seq, e.g. forced into the first iteration "
             "(lit-gpt's 2023 scripts); a stack that keeps the previous step's graph then "
             "never holds two long steps",
    )] = True
    compile: Compile = None  # vram.setup.compile
    compile_loss: CompileLoss = None
    attention: Annotated[Attention, Knob(
        "Attention kernel", key="attn", flag="--attention", column="attention",
        labels=(("sdpa", "SDPA"), ("eager", "eager (keeps s×s scores)"),
                ("flash", "FlashAttention")),
    )] = Attention.SDPA
    experts_implementation: Annotated[Experts, Knob(
        "MoE experts implementation", key="moeimpl", flag="--experts-implementation",
        column="experts_implementation",
        labels=(("grouped_mm", "grouped_mm (Transformers 5 default)"),
                ("eager", "eager loop over the experts")),
        help="Transformers 5's experts_implementation: grouped_mm runs each expert bank as one "
             "matmul in the bank's dtype; eager loops over the experts under autocast",
    )] = Experts.GROUPED_MM
    mixer_kernels: MixerKernels = None  # vram.setup.mixers
    loss: Annotated[Loss | None, Knob(
        "Loss (cross-entropy)", key="loss", flag="--loss", column="loss",
        labels=(("auto", "stack default"), ("standard", "standard (fp32 logits)"),
                ("chunked", "chunked / fused"), ("fused-linear", "fused linear + CE (Liger)")),
        help="standard, chunked or fused-linear cross-entropy (default: the stack's)",
    )] = None
    n_gpus: Annotated[int, Field(strict=True, ge=1, le=MAX_GPUS), Knob(
        "GPUs", key="gpus", flag="--gpus", column="n_gpus",
        app_options=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
        help="GPUs in the run: data x tensor x pipeline x context parallel",
    )] = 1
    sharding: Annotated[Sharding, Knob(
        "Sharding", key="shard", flag="--sharding", column="sharding",
        aliases=tuple(SHARDING_ALIASES),
        labels=(("none", "none"), ("ddp", "DDP"), ("zero1", "ZeRO-1"), ("zero2", "ZeRO-2"),
                ("zero3", "ZeRO-3 / FSDP")),
    )] = Sharding.NONE
    tp: Annotated[int, Field(strict=True, ge=1, le=MAX_GPUS), Knob(
        "Tensor parallel", key="tp", flag="--tp", column="tp", app_options=(1, 2, 4, 8, 16),
        help="GPUs each layer's matmuls are split over (Megatron's column/row split)",
    )] = 1
    sequence_parallel: Annotated[bool | None, Field(strict=True), Knob(
        "Sequence parallel (with TP)", key="sp", flag="--sequence-parallel",
        help="split the norms, dropouts and residual stream along the sequence over the TP "
             "ranks (default: the stack's)",
    )] = None
    pp: Annotated[int, Field(strict=True, ge=1, le=MAX_GPUS), Knob(
        "Pipeline parallel", key="pp", flag="--pp", column="pp", app_options=(1, 2, 4, 8, 16),
        help="pipeline stages; the micro-batches are the gradient accumulation steps",
    )] = 1
    pp_schedule: Annotated[PipelineSchedule | None, Knob(
        "Pipeline schedule", key="ppsched", flag="--pp-schedule",
        labels=(("auto", "stack default"), ("gpipe", "GPipe"), ("1f1b", "1F1B"),
                ("interleaved", "interleaved 1F1B")),
    )] = None
    pp_virtual: Annotated[int, Field(strict=True, ge=1, le=64), Knob(
        "Virtual stages per rank", key="ppv", flag="--pp-virtual", app_options=(1, 2, 3, 4),
        help="model chunks per pipeline rank (interleaved 1F1B)",
    )] = 1
    cp: Annotated[int, Field(strict=True, ge=1, le=MAX_GPUS), Knob(
        "Context parallel", key="cp", flag="--cp", column="cp", app_options=(1, 2, 4, 8, 16),
        help="GPUs each sequence is split over (ring attention or Ulysses)",
    )] = 1
    cp_kind: Annotated[ContextParallel | None, Knob(
        "Context parallel kind", key="cpkind", flag="--cp-kind",
        labels=(("auto", "stack default"), ("ring", "ring attention"),
                ("ulysses", "Ulysses (all-to-all)")),
    )] = None
    ep: Annotated[int, Field(strict=True, ge=1, le=MAX_GPUS), Knob(
        "Expert parallel", key="ep", flag="--ep", column="ep", app_options=(1, 2, 4, 8, 16),
        help="GPUs an MoE layer's experts are split over (within the data-parallel ranks)",
    )] = 1
    capacity_factor: Annotated[float, Field(strict=False, gt=0.0, le=MAX_CAPACITY_FACTOR), Knob(
        "Expert capacity factor", key="cf", flag="--capacity-factor", column="capacity_factor",
        app_options=(1.0, 1.25, 1.5, 2.0, 4.0),
        help="under expert parallel, the rows each GPU's experts compute as a multiple of its "
             "tokens × top-k (1: balanced routing; the worst case is ep × min(E/ep, top-k) / "
             "top-k, where the capacity is not capped)",
    )] = 1.0
    fp8: Annotated[Fp8Recipe, Knob(
        "FP8 training", key="fp8", flag="--fp8", column="fp8",
        labels=(("none", "none"), ("tensorwise", "torchao tensorwise"),
                ("rowwise", "torchao rowwise"), ("blockwise", "torchao blockwise"),
                ("te", "Transformer Engine")),
    )] = Fp8Recipe.NONE
    offload: Annotated[Offload, Knob(
        "Offload", key="offload", flag="--offload", column="offload",
        labels=(("none", "none"), ("optimizer", "optimizer → CPU"),
                ("params+optimizer", "params + optimizer → CPU"),
                ("activations", "activations → CPU")),
    )] = Offload.NONE
    framework: Annotated[Framework, Knob(
        "Training stack", key="stack", flag="--framework", column="framework",
        labels=(("hf-trainer", "HF Trainer"), ("litgpt", "LitGPT"), ("torchtune", "torchtune"),
                ("peft-accelerate", "PEFT + Accelerate"), ("fsdp-qlora", "FSDP-QLoRA"),
                ("unsloth", "Unsloth"), ("torchtitan", "torchtitan"),
                ("deepspeed", "DeepSpeed"), ("axolotl", "axolotl"),
                ("llama-factory", "LLaMA-Factory"), ("ms-swift", "ms-swift"), ("other", "other")),
    )] = Framework.HF_TRAINER
    # A vision-language model's inputs (vram.setup.vision): seq_len counts their tokens.
    images_per_sample: ImagesPerSample = 0
    image_height: ImageHeight = None
    image_width: ImageWidth = None
    max_pixels: MaxPixels = None
    min_pixels: MinPixels = None
    crop_images: CropImages = None
    video_frames: VideoFrames = 0
    video_max_pixels: VideoMaxPixels = None
    freeze_vision: FreezeVision = None

    @field_validator(
        "method", "quant", "optimizer", "precision", "attention", "loss", "offload", "framework",
        "lora_experts", "experts_implementation", "pp_schedule", "cp_kind", "fp8", mode="before",
    )
    @classmethod
    def _enum_from_text(cls, value: object) -> object:
        # Strict mode would refuse the plain strings that come from flags, URLs and CSV rows.
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("torch_version", mode="before")
    @classmethod
    def _torch_major_minor(cls, value: object) -> object:
        # "2.1.0", "2.6.0a0 nightly (...)", "2.4.0.dev20240427" -> "2.1", "2.6", "2.4"
        return lenient_version(value, TORCH_VERSION, "a PyTorch version such as 2.1")

    @field_validator("alloc_conf", mode="before")
    @classmethod
    def _alloc_conf(cls, value: object) -> object:
        # "expandable_segments: True ," -> "expandable_segments:True"; "default" -> ""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.lower() in ("default", "none", "pytorch"):
            return ""
        return parse_alloc_conf(text).text()

    @field_validator("bitsandbytes_version", mode="before")
    @classmethod
    def _bnb_version(cls, value: object) -> object:
        # "0.41.1", "0.43.0.post1" -> "0.41.1", "0.43.0" (patch 0 when absent)
        return lenient_version(value, BNB_VERSION, "a bitsandbytes version such as 0.41.1")

    @model_validator(mode="before")
    @classmethod
    def _fsdp_name_means_fsdp(cls, data: object) -> object:
        # `--sharding fsdp-full` says FSDP as plainly as `--sharding-engine fsdp`.
        if isinstance(data, dict) and data.get("sharding_engine") is None:
            sharding = data.get("sharding")
            if isinstance(sharding, str) and sharding.strip().lower() in FSDP_SHARDING_NAMES:
                return {**data, "sharding_engine": "fsdp"}
        return data

    @field_validator("sharding", mode="before")
    @classmethod
    def _sharding_alias(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip().lower()
            return SHARDING_ALIASES.get(text, text)
        return value

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _targets(cls, value: object) -> object:
        if isinstance(value, str | list | tuple) and all(
                isinstance(part, str) for part in value):
            return parse_lora_targets(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainingSetup:
        quant = self.effective_quant
        if self.method is Method.QLORA and quant is Quant.NONE:
            raise ValueError("quant: QLoRA needs a quantized base (nf4, nf4-dq or int8)")
        if self.method is not Method.QLORA and quant is not Quant.NONE:
            raise ValueError(
                f"quant: {quant.value} is for QLoRA; with method {self.method.value} use none"
            )
        check_layout(self)
        group = shard_group(self)  # every GPU unless tp or pp split the model
        if group == 1 and self.sharding not in (Sharding.NONE, Sharding.ZERO3):
            raise ValueError(
                f"sharding: {self.sharding.value} needs more than one GPU "
                + ("(gpus is 1)" if self.n_gpus == 1 else "(gpus ÷ tp ÷ pp is 1)")
            )
        if group > 1 and self.sharding is Sharding.NONE:
            where = "" if group == self.n_gpus else " (gpus ÷ tp ÷ pp)"
            raise ValueError(f"sharding: {group} GPUs{where} need a strategy (ddp, zero1, "
                             "zero2 or zero3)")
        if self.offload is Offload.OPTIMIZER and not self.offload.runs_with(self.sharding):
            raise ValueError("offload: optimizer offload needs ZeRO/FSDP sharding (zero1-3)")
        if self.offload is Offload.PARAMS_OPTIMIZER and not self.offload.runs_with(
                self.sharding):
            raise ValueError("offload: params+optimizer offload needs zero3 (FSDP full shard)")
        if self.ckpt_selective and not self.grad_ckpt:
            raise ValueError("ckpt_selective: selective checkpointing is checkpointing; "
                             "turn on grad_ckpt too")
        if self.sharding_engine == "deepspeed" and self.fsdp_version is not None:
            raise ValueError("fsdp_version: set only with FSDP; sharding_engine is deepspeed")
        if self.sharding_engine == "fsdp" and self.sharding is Sharding.ZERO1:
            raise ValueError("sharding: FSDP has no ZeRO-1 (use zero2 or zero3, or the "
                             "deepspeed engine)")
        if (self.image_height is None) != (self.image_width is None):
            raise ValueError("image_width: give image_height and image_width together, or "
                             "neither (the largest image the processor keeps)")
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels: {self.min_pixels:,} is above max_pixels "
                             f"{self.max_pixels:,}")
        if self.sharding_engine == "fsdp" and self.offload is Offload.OPTIMIZER:
            raise ValueError("offload: FSDP offloads the optimizer only with the parameters "
                             "(params+optimizer); optimizer-only offload is DeepSpeed's")
        return self

    @property
    def effective_quant(self) -> Quant:
        """The base quantization: NF4 for QLoRA unless another was chosen."""
        if self.quant is not None:
            return self.quant
        return Quant.NF4 if self.method is Method.QLORA else Quant.NONE

    @property
    def trains_adapters(self) -> bool:
        return self.method is not Method.FULL
