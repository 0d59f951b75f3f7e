"""Each setup knob is declared once (on its `TrainingSetup` field) and read the same everywhere."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import vram
from vram.io.knobs import KnobError, SetupKnob, knob_for, setup_knobs
from vram.io.validate import setup_from_row
from vram.setup import TrainingSetup

CASES = Path(__file__).resolve().parents[3] / "shared" / "validation" / "cases.csv"


def test_every_field_is_a_knob_with_unique_names() -> None:
    knobs = setup_knobs()
    assert [k.name for k in knobs] == list(TrainingSetup.model_fields)
    for surface in ("key", "flag", "column"):
        names = [getattr(k, surface) for k in knobs if getattr(k, surface)]
        assert len(names) == len(set(names)), surface


def test_ranges_and_choices_come_from_the_field() -> None:
    batch = knob_for("micro_batch")
    assert (batch.kind, batch.low, batch.high, batch.default) == ("int", 1, 4096, 1)
    assert knob_for("method").choices == ("full", "lora", "qlora")
    assert knob_for("method").default == "qlora"
    assert knob_for("compile").optional and knob_for("compile").kind == "bool"
    dropout = knob_for("lora_dropout")
    assert dropout.high_open and not dropout.within(1.0) and dropout.within(0.99)


@pytest.mark.parametrize("knob", setup_knobs(), ids=lambda k: k.name)
def test_default_round_trips_through_text(knob: SetupKnob) -> None:
    assert knob.parse(knob.text(knob.default)) == knob.default


@given(st.integers(-10, 10_000), st.sampled_from(["micro_batch", "seq_len", "n_gpus"]))
def test_numbers_in_range_parse_and_others_say_the_range(number: int, name: str) -> None:
    knob = knob_for(name)
    if knob.within(number):
        assert knob.parse(str(number)) == number
    else:
        with pytest.raises(ValueError, match=r"outside 1 to [\d,]+"):
            knob.parse(str(number))


def test_huge_numbers_are_refused_before_conversion() -> None:
    with pytest.raises(ValueError, match="not a number"):
        knob_for("seq_len").parse("9" * 5000)


def test_inverse_knob_states_the_opposite() -> None:
    once = knob_for("longest_batch_repeats")
    assert once.flag == "--longest-batch-once"
    assert once.parse("true") is False and once.text(False) == "true"


def _row(**cells: str) -> dict[str, str]:
    base = {"method": "lora", "optimizer": "adamw", "precision": "bf16-mixed",
            "micro_batch": "2", "seq_len": "512", "grad_ckpt": "true", "attention": "sdpa",
            "n_gpus": "1", "sharding": "none", "offload": "none", "framework": "hf-trainer",
            "lora_rank": "", "lora_targets": "", "quant": "", "notes": "x"}
    return {**base, **cells}


def test_case_rows_read_columns_with_library_defaults() -> None:
    setup = setup_from_row(_row())
    assert (setup.method.value, setup.micro_batch, setup.seq_len, setup.grad_ckpt) == (
        "lora", 2, 512, True)
    assert setup.lora_rank == TrainingSetup().lora_rank  # empty cell: the library's default


@pytest.mark.parametrize(("cells", "column"), [
    ({"framework": "nope"}, "framework"),
    ({"micro_batch": "0"}, "micro_batch"),
    ({"grad_ckpt": "maybe"}, "grad_ckpt"),
    ({"n_gpus": "8"}, "sharding"),  # a cross-field rule names the column it is about
])
def test_a_bad_cell_names_its_column(cells: dict[str, str], column: str) -> None:
    with pytest.raises(KnobError) as info:
        setup_from_row(_row(**cells))
    assert str(info.value).startswith(f"{column}: ")


#: The project's own case files (`benchmarks/*/cases.csv`): a new knob's column is the schema's
#: (design.md: "Case-file columns are added for new knobs ... empty means the default") before
#: the shared file carries it: `benchmarks/experts/cases.csv` holds `lora_experts` (issue 22),
#: `benchmarks/parallel/cases.csv` holds `tp, pp, cp, ep, fp8` (issue 23) and `compile_loss`,
#: `benchmarks/hybrid/cases.csv` holds `mixer_kernels` (issue 22; no published hybrid run yet).
PROJECT_CASES = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*/cases.csv"))


@pytest.mark.skipif(not CASES.exists(), reason="needs the shared case file")
def test_every_declared_column_is_in_the_case_file() -> None:
    header: set[str] = set()
    for path in (CASES, *PROJECT_CASES):
        with path.open(newline="", encoding="utf-8") as handle:
            header.update(next(csv.reader(handle)))
    for knob in setup_knobs():
        if knob.column:
            assert knob.column in header, knob.column


# The physics that follows the new knobs -------------------------------------------------------

MODEL = "llama-3.1-8b"


def _est(**fields: object) -> vram.Estimate:
    return vram.estimate(vram.load_model(MODEL), TrainingSetup.model_validate(fields))


def test_reentrant_checkpointing_keeps_no_bitsandbytes_inputs() -> None:
    """QLoRA with checkpointing on bitsandbytes <= 0.43.0: non-reentrant keeps every layer's
    MatMul4Bit inputs (ctx attributes), reentrant runs the checkpointed forward under no_grad
    and keeps none. The knob's None is the stack's default: non-reentrant on one GPU
    (Transformers 5), reentrant for PEFT's sharded QLoRA recipes."""
    base = {"method": "qlora", "grad_ckpt": True, "seq_len": 4096,
            "bitsandbytes_version": "0.43.0"}
    kept, dropped = _est(**base, ckpt_reentrant=False), _est(**base, ckpt_reentrant=True)
    assert dropped.allocated_peak_bytes < kept.allocated_peak_bytes
    assert _est(**base).allocated_peak_bytes == kept.allocated_peak_bytes
    sharded = {**base, "n_gpus": 2, "sharding": "zero3"}
    assert _est(**sharded).allocated_peak_bytes == _est(
        **sharded, ckpt_reentrant=True).allocated_peak_bytes
    # Without bitsandbytes there is nothing kept as a ctx attribute: the knob changes nothing.
    lora = {**base, "method": "lora"}
    assert _est(**lora, ckpt_reentrant=True).allocated_peak_bytes == _est(
        **lora, ckpt_reentrant=False).allocated_peak_bytes


def test_current_bitsandbytes_keeps_no_input_so_reentrancy_changes_nothing() -> None:
    """bitsandbytes >= 0.43.3 keeps only the packed weight (`ctx.tensors = (None, B)`): the
    H200 measured identical peaks for reentrant and non-reentrant QLoRA (GPU_H200.md §1). The
    input it kept before costs exactly what the estimate drops: old > current."""
    base = {"method": "qlora", "grad_ckpt": True, "seq_len": 4096}
    assert _est(**base, ckpt_reentrant=True).allocated_peak_bytes == _est(
        **base, ckpt_reentrant=False).allocated_peak_bytes
    old = _est(**base, bitsandbytes_version="0.41.1").allocated_peak_bytes
    assert old > _est(**base).allocated_peak_bytes
    assert _est(**base, bitsandbytes_version="0.43.3").allocated_peak_bytes == _est(
        **base).allocated_peak_bytes
    # No version given: a run on PyTorch 2.1 used a bitsandbytes of its time (<= 0.42).
    assert _est(**base, torch_version="2.1.0").allocated_peak_bytes == old
    # LitGPT pins bitsandbytes==0.42.0 (pyproject.toml@v0.4.0).
    litgpt = {**base, "framework": "litgpt"}
    assert _est(**litgpt).allocated_peak_bytes == _est(
        **litgpt, bitsandbytes_version="0.42.0").allocated_peak_bytes


def test_deepspeed_zero3_keeps_its_gradient_partition_and_bucket() -> None:
    """DeepSpeed ZeRO-3 allocates the flat gradient partition at init and one reduce bucket
    (stage3.py@v0.16.0); FSDP (the same `zero3` sharding on another stack) does not."""
    base = {"method": "full", "sharding": "zero3", "n_gpus": 4, "optimizer": "adamw",
            "seq_len": 512}
    ds = _est(**base, framework="deepspeed")
    buckets = [i for i in ds.bucket("gradients").items if i.key == "gradients.zero_buckets"]
    assert buckets[0].bytes == 50_000_000 * 2  # the example's 5e7 values, bf16
    assert _est(**base, framework="deepspeed",
                zero_reduce_bucket_values=500_000_000).allocated_peak_bytes == (
        ds.allocated_peak_bytes + 450_000_000 * 2)
    fsdp = _est(**base, framework="hf-trainer")
    assert not [i for i in fsdp.bucket("gradients").items if i.key == "gradients.zero_buckets"]


def _unsharded_frozen(**fields: object) -> int:
    est = _est(method="lora", n_gpus=2, sharding="zero3", **fields)
    return sum(i.bytes for i in est.bucket("weights").items
               if i.key == "weights.unsharded_frozen")


def test_fsdp1_frozen_parameter_bug_follows_fsdp_version_and_torch() -> None:
    """FSDP1 in PyTorch <= 2.1 kept frozen parameters unsharded in backward (pytorch#95805):
    the rule follows `fsdp_version` and `torch_version`, whatever the stack."""
    for framework in ("litgpt", "hf-trainer"):
        assert _unsharded_frozen(framework=framework, fsdp_version=1, torch_version="2.1.0") > 0
        assert _unsharded_frozen(framework=framework, fsdp_version=1, torch_version="2.2") == 0
        assert _unsharded_frozen(framework=framework, fsdp_version=2, torch_version="2.1") == 0
        assert _unsharded_frozen(framework=framework) == 0  # a current PyTorch
    # LitGPT's default is FSDP1 (Fabric's FSDPStrategy); torchtune's is FSDP2.
    assert _unsharded_frozen(framework="litgpt", torch_version="2.1") > 0
    assert _unsharded_frozen(framework="torchtune", torch_version="2.1") == 0


def test_torch_version_is_read_leniently() -> None:
    assert TrainingSetup(torch_version="2.6.0a0 nightly (pytorch 1963fc8)").torch_version == "2.6"
    assert TrainingSetup(torch_version="not stated (Aug 2024)").torch_version is None
    with pytest.raises(ValueError, match="PyTorch version"):
        TrainingSetup(torch_version="banana")


def test_fit_uses_each_gpus_own_cuda_context() -> None:
    """data/gpus.csv's measured context (H200: 760 MiB while training) replaces the 1 GiB
    constant in the fit; a setup's own `context_mib` (measured on the run's machine) wins over
    both."""
    model = vram.load_model("llama-3.2-1b")
    setup = TrainingSetup(method="full")
    peak = vram.estimate(model, setup).device_peak_bytes
    by_id = {o.gpu.id: o for o in vram.fit(model, setup).fits}
    assert by_id["h200"].device_peak_bytes == peak - (1024 - 760) * 2**20
    assert by_id["h100-sxm"].device_peak_bytes == peak  # not measured: the constant
    own = setup.model_copy(update={"context_mib": 500})
    own_peak = vram.estimate(model, own).device_peak_bytes
    assert own_peak == peak - (1024 - 500) * 2**20
    assert {o.device_peak_bytes for o in vram.fit(model, own).fits if o.count == 1} == {own_peak}


def test_the_docs_table_is_the_declarations() -> None:
    """docs/knobs.md lists every knob as declared (regenerate it with `markdown_table()`)."""
    from vram.io.knobs import markdown_table

    docs = Path(__file__).resolve().parents[2] / "docs" / "knobs.md"
    assert markdown_table() in docs.read_text(encoding="utf-8")


def test_fused_linear_loss_never_holds_whole_logits() -> None:
    """Liger's fused linear cross-entropy keeps the hidden gradient, an fp32 loss per token and
    one chunk of next_power_of_2(ceil(tokens / ceil(V / H))) tokens' logits, never all logits;
    HF Trainer's chunked loss is Liger's (use_liger_kernel), torchtune's keeps every chunk."""
    base = {"method": "full", "optimizer": "adamw", "micro_batch": 8, "seq_len": 2048}
    fused = _est(**base, loss="fused-linear")
    assert fused.activation_bytes_max < _est(**base, loss="standard").activation_bytes_max
    assert _est(**base, loss="chunked").allocated_peak_bytes == fused.allocated_peak_bytes
    tt = {**base, "framework": "torchtune"}
    assert _est(**tt, loss="chunked").allocated_peak_bytes > _est(
        **tt, loss="fused-linear").allocated_peak_bytes
    # llama-3.1-8b: V 128256, H 4096 -> ceil(V/H) = 32; 16384 tokens -> 512-token chunks
    loss = [i for i in fused.bucket("activations").items if i.key == "activations.loss"]
    if loss:  # the peak may be elsewhere; when the loss is the peak, one chunk is in it
        assert loss[0].bytes >= 512 * 128_256 * 2


def test_paged_optimizer_keeps_small_tensors_on_the_device() -> None:
    """bitsandbytes pages a state only for tensors of 1e5 values or more (get_state_buffer):
    LoRA's rank-16 matrices (16 x 4096 = 65,536 values) keep 32-bit PagedAdamW state as ordinary
    device memory, two fp32 states each; a full fine-tune's large matrices are paged."""
    lora = _est(method="lora", optimizer="paged-adamw", lora_targets="q_proj")
    trainable = lora.params.trainable
    states = next(i for i in lora.bucket("optimizer").items if i.key == "optimizer.states")
    assert states.bytes == 2 * 4 * trainable
    assert lora.paged_bytes == 0
    full = _est(method="full", optimizer="paged-adamw", precision="bf16-true")
    assert full.paged_bytes > 0.99 * 2 * 4 * full.params.trainable


def test_lora_base_loaded_in_16_bits_halves_the_frozen_weights() -> None:
    """LoRA under bf16 autocast: Transformers 5 loads the checkpoint's bf16 (`dtype="auto"`), so
    the hf-trainer default keeps the frozen base at 2 B/param and casts no weight; an fp32 base
    (`lora_base_16bit=False`, e.g. `from_config` at the fp32 default) keeps 4 B/param and
    autocast's 16-bit copies. LitGPT's bf16-mixed keeps the fp32 module. On the fake-tensor
    trace (Llama 3.2 1B, seq 512) the 16-bit base peaks at 4.23 GiB, the estimate 4.21 GiB (4.22
    before layer 0's input norm kept nothing: `vram.memory.activations.lead`; one layer alone
    traces within +1.8 MB, each further layer 1.4 MB above the estimate's)."""
    base = {"method": "lora", "precision": "bf16-mixed", "seq_len": 512}
    model = vram.load_model("llama-3.2-1b")

    def linears(est: vram.Estimate) -> int:
        return next(i.bytes for b in est.buckets for i in b.items if i.key == "weights.linears")

    default = vram.estimate(model, TrainingSetup.model_validate(base))
    fp32 = vram.estimate(model, TrainingSetup.model_validate({**base, "lora_base_16bit": False}))
    assert 2 * linears(default) == linears(fp32)
    assert round(default.allocated_peak_bytes / 2**30, 2) == 4.21
    assert round(fp32.allocated_peak_bytes / 2**30, 2) == 8.81  # the trace: 8.82 GiB
    litgpt = TrainingSetup.model_validate({**base, "framework": "litgpt"})
    assert linears(vram.estimate(model, litgpt)) == linears(fp32)
    # Pure bf16 and full fine-tuning do not read the knob.
    full = {**base, "method": "full"}
    assert vram.estimate(model, TrainingSetup.model_validate(full)).allocated_peak_bytes == \
        vram.estimate(model, TrainingSetup.model_validate(
            {**full, "lora_base_16bit": True})).allocated_peak_bytes


def test_unsloth_offloads_checkpoints_and_fuses_its_loss() -> None:
    """Unsloth's `use_gradient_checkpointing="unsloth"` copies each layer's input to the CPU
    (unsloth_zoo gradient_checkpointing.py@ce232d6c#L269) and its loss is cut cross-entropy
    (fused linear): the checkpointed inputs leave the GPU for host memory, and the logits are
    never whole. `ckpt_offload=False` with the standard loss is the hf-trainer figure."""
    base = {"method": "qlora", "grad_ckpt": True, "seq_len": 8192}
    hf, unsloth = _est(**base), _est(**base, framework="unsloth")
    checkpoints = next(i.bytes for b in hf.buckets for i in b.items
                       if i.key == "activations.checkpoints")
    assert checkpoints == 32 * 8192 * 4096 * 4  # layers × tokens × h × fp32 (kbit upcast)
    assert unsloth.host_bytes == hf.host_bytes + checkpoints
    assert unsloth.allocated_peak_bytes < hf.allocated_peak_bytes - checkpoints
    plain = _est(**base, framework="unsloth", ckpt_offload=False, loss="standard",
                 ckpt_reentrant=False)
    assert plain.allocated_peak_bytes == hf.allocated_peak_bytes
    # Any stack offloads them when asked, and activation offload implies it.
    assert _est(**base, ckpt_offload=True).host_bytes == unsloth.host_bytes
    assert _est(**base, offload="activations").host_bytes == unsloth.host_bytes
