"""Invariants that must hold for every setup (hypothesis)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from vram import Estimate, TrainingSetup, estimate, load_model
from vram.memory.activations.plan import plan as activation_plan
from vram.memory.nccl import nccl_bytes
from vram.model.params import param_groups
from vram.stacks.profile import profile_for

MODELS = [
    "llama-3.2-1b",
    "llama-3.1-8b",
    "mistral-7b-v0.1",
    "gemma-2-9b",
    "phi-2",
    "falcon-7b",
    "mixtral-8x7b-v0.1",
    "t0_3b",
    "bert-large-uncased",
    "qwen2.5-7b-instruct",
]

SETUP_FIELDS = (
    {
        "method": st.sampled_from(["full", "lora", "qlora"]),
        "optimizer": st.sampled_from(
            [
                "adamw",
                "adamw-8bit",
                "paged-adamw",
                "sgd",
                "sgd-momentum",
                "adafactor",
                "lion",
                "adamw-in-backward",
            ]
        ),
        "precision": st.sampled_from(["fp32", "fp16-mixed", "bf16-mixed", "bf16-true"]),
        "micro_batch": st.integers(1, 16),
        "seq_len": st.sampled_from([128, 512, 2048, 8192]),
        "grad_ckpt": st.booleans(),
        "attention": st.sampled_from(["eager", "sdpa", "flash"]),
        "framework": st.sampled_from(["hf-trainer", "litgpt", "torchtune"]),
        "lora_targets": st.sampled_from(
            ["all-linear", "q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj"]
        ),
    }
)
setups = st.fixed_dictionaries(SETUP_FIELDS)


def _model(name: str):
    return load_model(name)


@settings(max_examples=150, deadline=None)
@given(model=st.sampled_from(MODELS), fields=setups)
def test_parts_sum_to_the_device_peak(model: str, fields: dict) -> None:
    result = estimate(_model(model), TrainingSetup(**fields))
    assert sum(result.bucket_bytes.values()) == result.device_peak_bytes
    assert result.allocated_peak_bytes <= result.reserved_peak_bytes <= result.device_peak_bytes
    buckets = result.bucket_bytes
    assert (
        buckets["weights"] + buckets["gradients"] + buckets["optimizer"] + buckets["activations"]
        == result.allocated_peak_bytes
    )
    assert all(item.bytes >= 0 for bucket in result.buckets for item in bucket.items)


@settings(max_examples=150, deadline=None)
@given(
    model=st.sampled_from(MODELS), fields=setups, grow=st.sampled_from(["micro_batch", "seq_len"])
)
def test_more_batch_or_sequence_never_needs_less(model: str, fields: dict, grow: str) -> None:
    small = TrainingSetup(**fields)
    large = small.model_copy(update={grow: getattr(small, grow) * 2})
    spec = _model(model)
    assert estimate(spec, large).device_peak_bytes >= estimate(spec, small).device_peak_bytes


@settings(max_examples=150, deadline=None)
@given(model=st.sampled_from(MODELS), fields=setups)
def test_lora_never_needs_more_model_state_than_full(model: str, fields: dict) -> None:
    """Weights + gradients + optimizer state (paged state included): adapters on a frozen base
    always cost less, and a 4-bit base less again, unless bitsandbytes cannot quantize the
    MoE expert banks (Transformers 5 holds each as a 3-D parameter, not an nn.Linear): then
    QLoRA's base keeps them dense (fp32 after PEFT's kbit upcast), the H200 measured it."""
    spec = _model(model)

    def state(method: str) -> int:
        return estimate(spec, TrainingSetup(**{**fields, "method": method})).state_bytes

    assert state("lora") <= state("full")
    qlora = TrainingSetup(**{**fields, "method": "qlora"})
    banks = [g for g in param_groups(spec, qlora, profile_for(qlora)) if g.key == "expert_banks"]
    if banks:
        assert state("qlora") >= banks[0].bytes
    else:
        assert state("qlora") <= state("lora")


@settings(max_examples=150, deadline=None)
@given(model=st.sampled_from(MODELS), fields=setups)
def test_lora_never_needs_more_than_full(model: str, fields: dict) -> None:
    """The whole peak too, where the LoRA branch reads its input without copying it (no
    adapter dropout, adapters in the model's dtype: LitGPT and torchtune in bf16-true) and the
    optimizer keeps a state per parameter. With stateless SGD or factored Adafactor, full
    fine-tuning's forward holds nothing LoRA does not, while LoRA adds its adapters and their
    x·A activations: LoRA then exceeds full fine-tuning by those megabytes at the loss, which is
    what a real step does too."""
    spec = _model(model)
    stateless = ("sgd", "adafactor")
    optimizer = "adamw" if fields["optimizer"] in stateless else fields["optimizer"]
    # Within the model's positions: BERT's learned positions stop at 512. Far past them (BERT at
    # 15 x 8,192 tokens) LoRA's x·A activations (r values per adapted Linear and token) outgrow
    # what full fine-tuning's small 8-bit state saves, by 17 MB in 2.6 TB.
    seq_len = min(fields["seq_len"], spec.max_position_embeddings)
    common = {**fields, "precision": "bf16-true", "lora_dropout": 0.0, "optimizer": optimizer,
              "seq_len": seq_len}
    for framework in ("litgpt", "torchtune"):
        lora = TrainingSetup(**{**common, "method": "lora", "framework": framework})
        full = TrainingSetup(**{**common, "method": "full", "framework": framework})
        assert estimate(spec, lora).device_peak_bytes <= estimate(spec, full).device_peak_bytes


def test_peft_dropout_copies_can_make_lora_activations_exceed_full() -> None:
    """Why the invariant above is restricted: PEFT gives every adapted Linear its own dropout,
    and each keeps a dropped fp32 copy of its input plus a mask. On all seven Linears of a
    Llama layer that is more than full fine-tuning keeps (four 16-bit Linear inputs).
    (peft/tuners/lora/layer.py Linear.forward: lora_B(lora_A(dropout(x))) per adapter.)"""
    spec = load_model("llama-3.2-1b")
    common = {
        "precision": "bf16-true",
        "micro_batch": 4,
        "seq_len": 8192,
        "lora_targets": "all-linear",
        "lora_dropout": 0.1,
        "framework": "hf-trainer",
    }
    lora = estimate(spec, TrainingSetup(method="lora", **common))
    full = estimate(spec, TrainingSetup(method="full", **common))
    lora_branches = sum(i.bytes for i in lora.bucket("activations").items if "lora" in i.key)
    # 7 adapters x (4 B dropped copy + 1 B mask) x d_in, summed: 5 x (6h + I) per token-layer
    h, inter, layers, tokens = 2048, 8192, 16, 4 * 8192
    assert lora_branches >= 5 * (6 * h + inter) * layers * tokens
    assert lora.bucket("activations").bytes > full.bucket("activations").bytes


@settings(max_examples=150, deadline=None)
@given(model=st.sampled_from(MODELS), fields=setups, gpus=st.sampled_from([2, 4, 8, 64]))
@example(  # once failed: ZeRO-2's MoE layer counted its whole gradients and a dense backward
    model="mixtral-8x7b-v0.1", gpus=2,
    fields={"method": "full", "optimizer": "adamw", "precision": "bf16-mixed", "micro_batch": 11,
            "seq_len": 512, "grad_ckpt": False, "attention": "eager", "framework": "hf-trainer",
            "lora_targets": "all-linear"})
def test_more_sharding_never_needs_more_per_gpu(model: str, fields: dict, gpus: int) -> None:
    """ZeRO-3 <= ZeRO-2 <= ZeRO-1 <= DDP per GPU (Rajbhandari et al. 2020, Figure 1), for
    stacks that reshard frozen weights (see the LitGPT test below for one that did not)."""
    spec = _model(model)
    if fields["framework"] == "litgpt" and fields["method"] != "full":
        fields = {**fields, "framework": "hf-trainer"}
    if fields["method"] == "qlora" and fields["framework"] == "hf-trainer":
        # HF QLoRA is not like for like across levels: TRL skips the fp32 upcast of
        # prepare_model_for_kbit_training for sharded (ZeRO-3/FSDP) QLoRA, so activations
        # change dtype too (see test_sharded_hf_qlora_is_not_upcast).
        fields = {**fields, "framework": "torchtune"}
    # FSDP's levels (SHARD_GRAD_OP, FULL_SHARD): it has no ZeRO-1, which runs DeepSpeed's
    # engine and its fixed reduce bucket (see the model-state test below). FSDP1, one
    # precision model for every level: FSDP2 keeps fp32 shards under a mixed policy and its
    # root unit whole beside its shard, so at 2 GPUs its FULL_SHARD can hold more than
    # SHARD_GRAD_OP (see the FSDP2 test below). FSDP1's FULL_SHARD does too: its all-gather
    # streams keep the root unit and three blocks cached (`overhead.fsdp1_streams`, not model
    # state; see test_fsdp1_full_shard_streams_can_outweigh_the_shards below), so the
    # ordering is of the step without them.
    results = [
        estimate(spec, TrainingSetup(**{**fields, "n_gpus": gpus, "sharding": sharding,
                                        "sharding_engine": engine, "fsdp_version": 1}))
        for sharding, engine in (("ddp", None), ("zero2", "fsdp"), ("zero3", "fsdp"))
    ]
    peaks = [r.device_peak_bytes - _fsdp1_streams(r) for r in results]
    assert peaks[2] <= peaks[1] <= peaks[0]


def _fsdp1_streams(result: Estimate) -> int:
    return sum(i.bytes for i in result.bucket("overhead").items
               if i.key == "overhead.fsdp1_streams")


def test_fsdp1_full_shard_streams_can_outweigh_the_shards() -> None:
    """Llama 3.2 1B QLoRA in fp32 on 2 GPUs (the tied 128,256 x 2,048 embedding, 4 B):
    FULL_SHARD saves half the weights (821,694,464 B) but its all-gather stream keeps the root
    unit whole (1,050,673,152 B) and three blocks: more on each GPU than SHARD_GRAD_OP."""
    fields = {"method": "qlora", "precision": "fp32", "micro_batch": 1, "seq_len": 128,
              "framework": "torchtune", "n_gpus": 2, "fsdp_version": 1,
              "sharding_engine": "fsdp"}
    spec = load_model("llama-3.2-1b")
    zero2, zero3 = (estimate(spec, TrainingSetup(**fields, sharding=sharding))
                    for sharding in ("zero2", "zero3"))
    streams = next(i for i in zero3.bucket("overhead").items
                   if i.key == "overhead.fsdp1_streams")
    assert streams.inputs["root"] == 128_256 * 2_048 * 4
    assert zero3.device_peak_bytes > zero2.device_peak_bytes
    assert zero3.device_peak_bytes - streams.bytes <= zero2.device_peak_bytes


#: Buffers and working copies, not model state: DeepSpeed's reduce bucket is
#: reduce_bucket_size values whatever the model (stage_1_and_2.py@v0.18.4#L2239), so ZeRO-1
#: can need more than DDP for a small trainable count; ZeRO-3 keeps live parameters gathered.
_NOT_MODEL_STATE = ("gathered", "persistent", "zero_buckets", "ddp_buckets", "unsharded")


def _model_state_bytes(result: Estimate) -> int:
    return sum(item.bytes for name in ("weights", "gradients", "optimizer")
               for item in result.bucket(name).items
               if not any(part in item.key for part in _NOT_MODEL_STATE))


@settings(max_examples=100, deadline=None)
@given(model=st.sampled_from(MODELS), fields=setups, gpus=st.sampled_from([2, 4, 8, 64]))
def test_zero_stages_shrink_model_state(model: str, fields: dict, gpus: int) -> None:
    """DeepSpeed's ZeRO stages, Rajbhandari et al. 2020 Figure 1: in mixed precision (the
    paper's setting) the parameters, gradients and optimizer state a GPU keeps never grow from
    DDP to ZeRO-1, -2 and -3. (In fp32 the engine still clones an fp32 master partition,
    stage_1_and_2.py@v0.18.4#L449, which DDP does not keep: with a small optimizer state, on
    2 GPUs, ZeRO-1 then holds more than DDP.)"""
    spec = _model(model)
    mixed = "fp16-mixed" if fields["precision"] == "fp16-mixed" else "bf16-mixed"
    # The paper's Adam (K = 12), and a step small enough that the peak is the optimizer step,
    # where every level holds its whole model state (a forward peak holds no gradients yet).
    fields = {**fields, "precision": mixed, "optimizer": "adamw", "micro_batch": 1,
              "seq_len": 128}
    states = [
        _model_state_bytes(estimate(spec, TrainingSetup(**{
            **fields, "n_gpus": gpus, "sharding": sharding,
            "sharding_engine": None if sharding == "ddp" else "deepspeed"})))
        for sharding in ("ddp", "zero1", "zero2", "zero3")
    ]
    assert states[3] <= states[2] <= states[1] <= states[0]


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(MODELS), fields=setups, units=st.sampled_from([None, True, False]))
def test_fsdp2_more_gpus_never_need_more_per_gpu(model: str, fields: dict,
                                                 units: bool | None) -> None:
    """FSDP2 (`fully_shard`), the root unit's or units of their own for the embedding and
    head: sharding over more GPUs never needs more memory on each for what the step holds.
    NCCL's buffers are left out: its NVLS buffers grow with the node's GPUs (one head each,
    `vram.memory.nccl.nvls_bytes`), by more than a small model's shards shrink."""
    spec = _model(model)
    setups = [TrainingSetup(**{**fields, "n_gpus": gpus, "sharding": "zero3", "fsdp_version": 2,
                               "fsdp_embedding_units": units}) for gpus in (2, 4, 8)]
    peaks = [estimate(spec, setup).device_peak_bytes - nccl_bytes(setup) for setup in setups]
    assert peaks[2] <= peaks[1] <= peaks[0]


def test_litgpt_fsdp_lora_keeps_frozen_weights_unsharded() -> None:
    """LitGPT's published FSDP LoRA peaks (tutorials/resource-tables.md, PyTorch 2.1) are at
    or above the single-GPU peak: FSDP1 did not reshard frozen parameters in backward
    (pytorch/pytorch#95805). The estimate keeps the full frozen weights plus the shard: at
    the end of backward a GPU holds them 1 + 1/N times."""
    spec = load_model("llama-2-7b")
    setup = TrainingSetup(method="lora", lora_rank=8, lora_targets="q_proj,v_proj",
                          precision="bf16-true", micro_batch=1, seq_len=1304, grad_ckpt=True,
                          n_gpus=2, sharding="fsdp-full", framework="litgpt",
                          fsdp_version=1, torch_version="2.1.0")  # the bug's knobs, as run
    weights = estimate(spec, setup).bucket("weights")
    frozen_bf16 = 2 * 6_738_415_616
    unsharded = next(i for i in weights.items if i.key == "weights.unsharded_frozen")
    assert unsharded.bytes == frozen_bf16  # a full unsharded copy beside the shard
    assert weights.bytes >= frozen_bf16 + frozen_bf16 // 2


def test_sharded_hf_qlora_is_not_upcast() -> None:
    """trl's SFTTrainer calls prepare_model_for_kbit_training (fp32 embeddings, norms and head)
    except for sharded QLoRA, where the 4-bit base is sharded and stays 16-bit."""
    spec = load_model("llama-3.2-1b")
    common = {"method": "qlora", "precision": "bf16-true", "n_gpus": 2}
    zero2 = estimate(spec, TrainingSetup(**common, sharding="zero2"))
    zero3 = estimate(spec, TrainingSetup(**common, sharding="zero3"))
    embedding = 128_256 * 2048
    assert next(i.bytes for i in zero2.bucket("weights").items
                if i.key == "weights.embedding") == 4 * embedding
    assert next(i.bytes for i in zero3.bucket("weights").items
                if i.key == "weights.embedding") == 2 * embedding // 2


#: The issue 25 case: DeepSeek-V3 full, 8-bit AdamW, eager, LitGPT, ZeRO-3 with activation
#: offload and accumulation: seq 512 -> 576 dropped activations from 15.7 to 1.9 GB, as the
#: first layer's backward was taken at its attention (larger transients) and the MLP's moment,
#: writing a 15 GB expert-bank gradient beside the accumulated one, was no longer counted.
DEEPSEEK_ACCUMULATING = {
    "method": "full", "optimizer": "adamw-8bit", "precision": "bf16-mixed", "micro_batch": 1,
    "seq_len": 512, "grad_ckpt": False, "attention": "eager", "framework": "litgpt",
    "lora_targets": "all-linear", "grad_accum": 2, "n_gpus": 1, "sharding": "zero3",
    "offload": "activations"}

longer = st.fixed_dictionaries({
    **SETUP_FIELDS,
    "seq_len": st.sampled_from([128, 256, 512, 576, 768, 1024, 2048, 4096]),
    "grad_accum": st.sampled_from([1, 2, 8]),
    "n_gpus": st.sampled_from([1, 2, 8]),
    "sharding": st.sampled_from(["none", "zero2", "zero3"]),
    "offload": st.sampled_from(["none", "activations"]),
})


@settings(max_examples=300, deadline=None)
@given(model=st.sampled_from([*MODELS, "deepseek-v3", "qwen3-30b-a3b", "olmoe-1b-7b-0924"]),
       fields=longer, factor=st.sampled_from([9 / 8, 3 / 2, 2]))
@example(model="deepseek-v3", fields=DEEPSEEK_ACCUMULATING, factor=9 / 8)
@example(model="deepseek-v3", fields=DEEPSEEK_ACCUMULATING, factor=3 / 2)
def test_activations_do_not_fall_as_the_sequence_grows(model: str, fields: dict,
                                                       factor: float) -> None:
    """The activations a longer sequence makes (every layer's saved tensors, the largest
    layer's, the forward's and the backward's transients, the head's) are no smaller, nothing
    alive at any moment of the step is smaller, and neither is the peak.

    The peak's activation bucket alone can move the other way: a gradient being written
    counts as activations (as the trace counts it), so when a longer sequence moves the peak
    from the embedding's backward (its gradient being built) to the first layer's (more
    gradients already done), activations fall while the peak rises (llama-3.2-1b fp32 ZeRO-2,
    seq 512 -> 576: 1.05 -> 0.93 GB, peak +4.8 MB)."""
    if fields["sharding"] != "none" and fields["n_gpus"] == 1 and fields["sharding"] != "zero3":
        fields = {**fields, "sharding": "none"}
    try:
        short = TrainingSetup(**fields)
    except ValueError:  # a combination the setup refuses (it names the field)
        return
    long = short.model_copy(update={"seq_len": int(short.seq_len * factor)})
    spec = _model(model)
    plans = [activation_plan(spec, s, profile_for(s)) for s in (short, long)]
    for name in ("stored_layers_bytes", "checkpointed_bytes", "layer_bytes_max",
                 "backward_transient_bytes", "forward_transient_bytes", "head_peak_bytes",
                 "head_saved_bytes", "offloaded_bytes"):
        assert getattr(plans[1], name) >= getattr(plans[0], name), name
    a, b = estimate(spec, short), estimate(spec, long)
    moments = {m.label: m.allocated_bytes for m in b.moments}
    for m in a.moments:
        assert moments[m.label] >= m.allocated_bytes, (m.label, m.allocated_bytes,
                                                       moments[m.label])
    assert b.allocated_peak_bytes >= a.allocated_peak_bytes
