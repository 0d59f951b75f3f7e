"""The stack table, the optimizer rows and the precision policy: complete, cited, and exact."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import MappingProxyType

import pytest

from tests.conftest import ROOT
from vram import Estimate, TrainingSetup, estimate, model_from_config
from vram.errors import VramError
from vram.memory.optimizer import (
    OPTIMIZERS,
    blockwise_8bit_bytes,
    bnb_8bit_tensor_bytes,
    factored_bytes,
    optimizer_spec,
    optimizer_state,
    projection_rank,
    torchao_4bit_tensor_bytes,
)
from vram.model.params import Matrices, ParamGroup, Storage, param_groups
from vram.model.params import allocated_bytes as allocated
from vram.setup import Framework, Loss, Optimizer
from vram.sharding.deepspeed_zero import runs_deepspeed_zero
from vram.stacks.docs import stacks_markdown
from vram.stacks.precision import precision_policy, runs_half_model
from vram.stacks.profile import profile_for, runs_transformers_code
from vram.stacks.resolve import resolve
from vram.stacks.table import BEHAVIOURS, OVERLAYS, stack_row, stacks
from vram.units import GIB, format_gb, format_gib, size_text

HF_LIKE = (Framework.HF_TRAINER, Framework.PEFT_ACCELERATE, Framework.FSDP_QLORA,
           Framework.UNSLOTH, Framework.AXOLOTL, Framework.LLAMA_FACTORY, Framework.MS_SWIFT,
           Framework.OTHER)


_TINY: dict[str, object] = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
    "tie_word_embeddings": False}


# --- stacks --------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", list(Framework))
def test_every_framework_has_a_row_with_a_versioned_source_per_field(
        framework: Framework) -> None:
    row = stack_row(framework)
    stated = set(BEHAVIOURS) | {f"defaults.{name}" for name in row.defaults} | {
        f"{part}.{name}" for part in OVERLAYS for name in getattr(row, part)}
    assert set(row.sources) == stated, framework
    for name, source in row.sources.items():
        assert "@" in source, f"{framework.value}.{name}: {source!r} names no version"


def test_every_stack_states_a_default_for_each_knob_that_defers_to_it() -> None:
    """The same knobs in every row, each a TrainingSetup field whose None means "the
    stack's" (a knob added to one row and not the others is refused at load)."""
    knobs = set(stack_row(Framework.HF_TRAINER).defaults)
    assert knobs == {"loss", "compile", "compile_loss", "ckpt_reentrant", "ckpt_offload",
                     "fsdp_version", "fsdp_embedding_units", "bitsandbytes_version",
                     "lora_base_16bit",
                     "zero_reduce_bucket_values", "zero_param_persistence_threshold",
                     "zero3_linear_wrapper", "alloc_conf", "max_pixels", "min_pixels",
                     "crop_images", "video_max_pixels", "freeze_vision", "sequence_parallel",
                     "pp_schedule", "cp_kind", "mixer_kernels"}
    for row in stacks().values():
        assert set(row.defaults) == knobs
        assert all(TrainingSetup.model_fields[name].default is None for name in knobs)


def test_a_stack_table_entry_without_a_source_or_of_the_wrong_type_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are data, validated as the GPU list is: an error names the stack and entry."""
    original = (ROOT / "data" / "stacks.toml").read_text()
    for broken, message in (
            (original.replace('[litgpt.defaults]\nloss = { value = "chunked"',
                              '[litgpt.defaults]\nloss = { value = "sideways"'),
             r"\[litgpt.defaults\] loss"),
            (original.replace("unties_head = { value = true, source",
                              "unties_head = { value = 1, source"),
             r"\[litgpt\] unties_head"),
            (original.replace('[torchtitan.defaults]\nloss = { value = "standard", source',
                              '[torchtitan.defaults]\nloss = { value = "standard", sauce'),
             r"\[torchtitan.defaults\] loss: give")):
        assert broken != original
        (tmp_path / "stacks.toml").write_text(broken)
        monkeypatch.setattr("vram.stacks.table.data_dir", lambda: tmp_path)
        stacks.cache_clear()
        try:
            with pytest.raises(VramError, match=message):
                stacks()
        finally:
            stacks.cache_clear()


def test_docs_stacks_md_is_generated_from_the_table() -> None:
    """docs/stacks.md is `stacks_markdown()` verbatim; regenerate it when a row changes."""
    docs = (ROOT / "docs" / "stacks.md").read_text(encoding="utf-8")
    assert docs == stacks_markdown(), "regenerate docs/stacks.md (see its first lines)"
    assert "| axolotl | standard [1] | no [2] | yes [" in docs


def test_a_framework_without_a_row_is_an_error_not_hugging_face(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {k: v for k, v in stacks().items() if k is not Framework.UNSLOTH}
    monkeypatch.setattr("vram.stacks.table.stacks", lambda: MappingProxyType(rows))
    resolve.cache_clear()
    try:
        with pytest.raises(VramError, match="framework: no stack profile for 'unsloth'"):
            profile_for(TrainingSetup(framework="unsloth"))
    finally:
        resolve.cache_clear()


def test_model_code_follows_the_stack() -> None:
    """Transformers' attention dispatch and masks apply to the HF-based stacks only."""
    for framework in Framework:
        profile = profile_for(TrainingSetup(framework=framework))
        assert runs_transformers_code(profile) is (framework in HF_LIKE), framework


def test_stack_defaults_come_from_the_table() -> None:
    def run(**fields: object) -> TrainingSetup:
        return resolve(TrainingSetup(**fields)).run  # type: ignore[arg-type]

    assert run(framework="torchtune").compile is True
    assert run(framework="torchtune", compile=False).compile is False
    assert run(framework="litgpt").loss is Loss.CHUNKED
    assert run(framework="hf-trainer").loss is Loss.STANDARD
    assert run(framework="hf-trainer", loss="chunked").loss is Loss.CHUNKED
    assert run(framework="litgpt").bitsandbytes_version == "0.42.0"
    assert run(framework="deepspeed").zero_reduce_bucket_values == 50_000_000
    assert run(framework="hf-trainer").zero_reduce_bucket_values is None  # DeepSpeed's own


def test_checkpoint_reentrancy_defaults_from_source() -> None:
    """axolotl and LLaMA-Factory default to reentrant checkpointing, Transformers 5 and the
    PyTorch-native stacks to non-reentrant; DeepSpeed's own checkpointing is reentrant, and so is
    Unsloth's offloading checkpointer (an autograd.Function whose forward runs under no_grad);
    ms-swift is reentrant but under plain DDP (one GPU: reentrant)."""
    reentrant = {f for f in Framework if stack_row(f).defaults["ckpt_reentrant"]}
    assert reentrant == {Framework.AXOLOTL, Framework.LLAMA_FACTORY, Framework.DEEPSPEED,
                         Framework.UNSLOTH, Framework.MS_SWIFT}
    ckpt = TrainingSetup(method="qlora", grad_ckpt=True, framework="axolotl")
    assert not profile_for(ckpt).checkpoint_keeps_ctx_attributes


def test_fsdp_generation_per_stack() -> None:
    fsdp2 = {f for f in Framework if stack_row(f).defaults["fsdp_version"] == 2}
    assert fsdp2 == {Framework.TORCHTUNE, Framework.TORCHTITAN}
    assert stack_row(Framework.DEEPSPEED).defaults["fsdp_version"] is None


def test_fsdp2_embedding_units_per_stack() -> None:
    """torchtitan's apply_fsdp always wraps tok_embeddings and [norm, output] as units;
    torchtune's full fine-tune configs list them in custom_sharded_layers, its LoRA recipe
    wraps the layers only; every other stack (Accelerate's FSDP2) leaves them in the root."""
    def fsdp_embedding_units(setup: TrainingSetup) -> bool:
        return bool(resolve(setup).run.fsdp_embedding_units)

    full = {f for f in Framework if stack_row(f).defaults["fsdp_embedding_units"]}
    adapters = {f for f in Framework if stack_row(f).when_adapters["fsdp_embedding_units"]}
    assert full == {Framework.TORCHTUNE, Framework.TORCHTITAN}
    assert adapters == {Framework.TORCHTITAN}
    tune = {"framework": "torchtune", "sharding": "zero3", "n_gpus": 8}
    assert fsdp_embedding_units(TrainingSetup(**tune, method="full"))
    assert not fsdp_embedding_units(TrainingSetup(**tune, method="lora"))
    assert not fsdp_embedding_units(TrainingSetup(**tune, method="qlora"))
    assert fsdp_embedding_units(TrainingSetup(**tune, method="lora", fsdp_embedding_units=True))
    assert not fsdp_embedding_units(TrainingSetup(**tune, method="full",
                                                  fsdp_embedding_units=False))
    assert not fsdp_embedding_units(TrainingSetup(framework="hf-trainer", method="full",
                                                  fsdp_version=2))


def test_embedding_units_change_only_what_fsdp2_holds_in_flight() -> None:
    """The same FSDP2 run with the embedding and head as units: the model state is the same,
    the root's whole copy of the embedding and head (bf16) is gone from the peak; a tied head
    stays in the root, so the knob changes nothing there."""
    from vram import load_model

    def run(model: str, units: bool) -> Estimate:
        return estimate(load_model(model), TrainingSetup(
            framework="torchtune", method="full", sharding="zero3", fsdp_version=2, n_gpus=8,
            precision="bf16-true", grad_ckpt=True, fsdp_embedding_units=units))

    def state(run: Estimate) -> dict[str, int]:
        step = next(m for m in run.moments if m.label == "the optimizer step")
        return {"gradients": step.gradient_bytes} | {
            item.key: item.bytes for name in ("weights", "optimizer")
            for item in run.bucket(name).items if ".fsdp2_" not in item.key}

    root, own = run("llama-3.1-8b", False), run("llama-3.1-8b", True)
    assert state(own) == state(root)
    vocab, hidden = 128_256, 4096
    assert root.allocated_peak_bytes - own.allocated_peak_bytes >= vocab * hidden * 2
    tied = [run("llama-3.2-1b", units).allocated_peak_bytes for units in (False, True)]
    assert tied[0] == tied[1]


def test_llama_factory_keeps_a_16_bit_qlora_base_with_fp32_adapters() -> None:
    """No kbit upcast (its own prepare_model_for_training), trainable params cast to fp32."""
    p = profile_for(TrainingSetup(method="qlora", framework="llama-factory")).precision
    assert (p.frozen_weights, p.adapters, p.master, p.states) == (2, 4, 0, 4)


def test_sharded_qlora_follows_the_stacks_recipe() -> None:
    """PEFT's sharded-QLoRA recipes: reentrant checkpointing and no kbit upcast (TRL)."""
    sharded = TrainingSetup(method="qlora", n_gpus=2, sharding="zero3")
    single = TrainingSetup(method="qlora")
    assert not profile_for(sharded).checkpoint_keeps_ctx_attributes
    assert not profile_for(sharded).upcasts_frozen_to_fp32
    assert profile_for(single).checkpoint_keeps_ctx_attributes
    assert profile_for(single).upcasts_frozen_to_fp32
    litgpt = sharded.model_copy(update={"framework": Framework.LITGPT})
    assert profile_for(litgpt).checkpoint_keeps_ctx_attributes


# --- precision -----------------------------------------------------------------------------

_SETUPS = [
    TrainingSetup(method=method, precision=precision, n_gpus=n, sharding=sharding,
                  framework=framework)
    for method, precision, (n, sharding), framework in itertools.product(
        ("full", "lora", "qlora"), ("fp32", "fp16-mixed", "bf16-mixed", "bf16-true"),
        ((1, "none"), (1, "zero3"), (2, "ddp"), (2, "zero1"), (4, "zero2"), (4, "zero3")),
        list(Framework))
]


@pytest.mark.parametrize("setup", _SETUPS, ids=lambda s: "-".join(
    (s.method, s.precision, s.sharding, s.framework)))
def test_precision_record_is_consistent(setup: TrainingSetup) -> None:
    """Gradients and states follow the trained parameters; a master copy (fp32 of 16-bit
    parameters, or DeepSpeed ZeRO's clone in the trained dtype) keeps the states in its dtype;
    only DeepSpeed's engine clones; a 16-bit engine has no autocast over a 16-bit base unless
    asked; activations read the same record."""
    profile = profile_for(setup)
    p = profile.precision
    trained = p.adapters if setup.method != "full" else p.weights
    assert p.gradients == trained
    deepspeed = runs_deepspeed_zero(setup)  # the engine: the knob, ZeRO-1, or the stack's
    assert p.master in ({4, trained} if deepspeed else {0, 4} if trained == 2 else {0})
    assert p.master or not deepspeed
    assert p.states == (p.master or trained)
    if not profile.upcasts_frozen_to_fp32:  # (an upcast QLoRA base keeps autocast under ZeRO)
        assert not (p.half_model and p.autocast)
    assert p.half_model is runs_half_model(setup)


def test_activation_dtypes_by_recipe() -> None:
    """(compute, residual, attention, autocast) per recipe, as the trace measures them."""
    def dtypes(**fields: object) -> tuple[int, int, int, bool]:
        p = profile_for(TrainingSetup(**fields)).precision  # type: ignore[arg-type]
        return p.compute, p.residual, p.attention, p.autocast

    assert dtypes(method="full", precision="fp32") == (4, 4, 4, False)
    assert dtypes(method="full", precision="bf16-mixed") == (2, 4, 2, True)
    assert dtypes(method="full", precision="bf16-true") == (2, 2, 2, False)
    assert dtypes(method="full", precision="bf16-mixed", n_gpus=2, sharding="zero3") == (
        2, 2, 2, False)
    assert dtypes(method="qlora", precision="bf16-mixed") == (4, 4, 2, True)  # HF upcast
    # a QLoRA base left in the 16 bits it was loaded in (no upcast, or axolotl's cast back):
    # the bf16 embedding starts a bf16 residual stream (the trace loads it so too)
    for framework in ("torchtune", "llama-factory", "ms-swift", "axolotl"):
        assert dtypes(method="qlora", precision="bf16-mixed", framework=framework) == (
            2, 2, 2, True), framework


def test_zero_with_a_mixed_recipe_runs_a_16_bit_model() -> None:
    """DeepSpeed bf16: 2-byte weights and gradients, fp32 master and fp32 states."""
    p = profile_for(TrainingSetup(method="full", precision="bf16-mixed", n_gpus=4,
                                  sharding="zero2")).precision
    assert (p.weights, p.gradients, p.master, p.states, p.compute, p.residual) == (
        2, 2, 4, 4, 2, 2)
    assert not p.autocast


def test_autocast_over_fp32_weights() -> None:
    p = profile_for(TrainingSetup(method="full", precision="bf16-mixed")).precision
    assert (p.weights, p.gradients, p.master, p.states, p.compute, p.residual) == (
        4, 4, 0, 4, 2, 4)
    assert p.autocast


def test_qlora_dtypes_follow_the_stack() -> None:
    """HF + PEFT upcast the frozen base and the adapters to fp32; LitGPT keeps the base in
    16 bits and the adapters beside it, with an fp32 master copy under a mixed recipe."""
    hf = profile_for(TrainingSetup(method="qlora")).precision
    assert (hf.frozen_weights, hf.adapters, hf.master, hf.states, hf.compute) == (4, 4, 0, 4, 4)
    lit = profile_for(TrainingSetup(method="qlora", framework="litgpt")).precision
    assert (lit.frozen_weights, lit.adapters, lit.adapter_inputs, lit.master, lit.states) == (
        2, 2, 4, 4, 4)
    true16 = profile_for(TrainingSetup(method="lora", precision="bf16-true",
                                       framework="torchtune")).precision
    assert (true16.frozen_weights, true16.adapters, true16.master, true16.states) == (2, 2, 0, 2)


def test_policy_is_independent_of_the_stack_without_adapters_or_qlora() -> None:
    setup = TrainingSetup(method="full", precision="fp16-mixed")
    assert precision_policy(setup, fp32_adapters=True, upcasts_frozen=False).weights == 4


# --- optimizers ----------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", list(Optimizer))
def test_every_optimizer_has_a_row(optimizer: Optimizer) -> None:
    spec = optimizer_spec(optimizer)
    assert "@" in spec.source and spec.formula


def test_in_backward_optimizers() -> None:
    """torchtune's optimizer-in-backward and GaLore's per-layer updates free each gradient."""
    assert {o for o, s in OPTIMIZERS.items() if s.steps_in_backward} == {
        Optimizer.ADAMW_IN_BACKWARD, Optimizer.GALORE_ADAMW8BIT_PER_LAYER}


def _group(n: int, *, matrices: tuple[Matrices, ...] = (),
           tensors: tuple[tuple[int, int], ...] = ()) -> ParamGroup:
    return ParamGroup("g", "g", n, Storage.FP32, True, 4 * n, matrices, tensors)


def test_bitsandbytes_8bit_state_of_one_tensor_by_hand() -> None:
    # 4096 × 4096: 16,777,216 uint8 + 65,536 absmax × 4 B = 262,144 B (both 512-aligned).
    assert bnb_8bit_tensor_bytes(4096 * 4096) == 16_777_216 + 262_144
    # 16 × 4544 = 72,704 values: 72,704 B + ⌈284 × 4 / 512⌉ blocks = 1,536 B of absmax.
    assert bnb_8bit_tensor_bytes(16 * 4544) == 72_704 + 1_536
    # under 4096 values: one fp32 state, in 512-byte blocks (1000 × 4 = 4000 -> 4096).
    assert bnb_8bit_tensor_bytes(1000) == 4096


def test_8bit_groups_pool_large_matrices_and_size_listed_tensors_one_by_one() -> None:
    assert blockwise_8bit_bytes(_group(1000)) == 1000 + 4 * 4  # ⌈1000/256⌉ = 4 blocks
    listed = _group(2 * 1000 + 8192, tensors=((1000, 2), (8192, 1)))
    assert blockwise_8bit_bytes(listed) == 2 * 4096 + (8192 + 512)
    state = optimizer_state([listed], TrainingSetup(optimizer="adamw-8bit"), fused=False)
    assert state.state_bytes == 2 * (2 * 4096 + 8192 + 512)
    assert state.step_temp_bytes == 0


def test_adafactor_factors_matrices_and_keeps_vectors_whole() -> None:
    # A 1000 × 300 matrix: fp32 rows (4000 -> 4096 B) and columns (1200 -> 1536 B), plus a
    # 1000-value bias kept whole (4000 B).
    group = _group(300_000 + 1000, matrices=(Matrices(1000, 300),))
    assert factored_bytes(group) == 4096 + 1536 + 4000
    state = optimizer_state([group], TrainingSetup(optimizer="adafactor"), fused=True,
                            state_dtype_bytes=2, largest_param=300_000)
    # 16-bit parameters: 4 fp32 copies of the largest (grad, param, grad², update).
    assert state.step_temp_bytes == 4 * 4 * 300_000


def test_foreach_temporaries_unless_fused() -> None:
    group = _group(1000)
    adamw = TrainingSetup(optimizer="adamw")
    assert optimizer_state([group], adamw, fused=False).step_temp_bytes == 4000
    assert optimizer_state([group], adamw, fused=True).step_temp_bytes == 0
    assert optimizer_state([group], adamw, fused=False).state_bytes == 8000


def test_torchao_4bit_state_by_hand() -> None:
    # 4096 × 4096 values: 8,388,608 B of packed codes + 131,072 fp32 scales (524,288 B) + a
    # 16-entry fp32 lookup table (64 B -> 512 B).
    assert torchao_4bit_tensor_bytes(4096 * 4096, 2) == 8_388_608 + 524_288 + 512
    # 4,000 values (under 4096): a bf16 state like the parameter, 8,000 B -> 8,192 B.
    assert torchao_4bit_tensor_bytes(4000, 2) == 8192
    # 4,160 values, not a multiple of 128: plain state too.
    assert torchao_4bit_tensor_bytes(4160, 4) == allocated(4 * 4160)


def test_adamw_4bit_on_a_tiny_llama_by_hand() -> None:
    """Full fine-tune, pure bf16: the 2 × 64 × 256 embedding/head and the 2 × 256 × 64 MLP
    and 64 × 64 attention matrices of one layer, and the norms."""
    spec = model_from_config(_TINY, name="tiny")
    setup = TrainingSetup(method="full", precision="bf16-true", optimizer="adamw-4bit")
    groups = param_groups(spec, setup, profile_for(setup))
    state = optimizer_state(groups, setup, fused=False, state_dtype_bytes=2)
    # Matrices one by one: n/2 B of codes + 4·n/128 B of scales + the 64 B table, each in
    # 512-byte blocks. 16,384 values (embedding, head, gate, up, down): 8,192 + 512 + 512;
    # 4,096 values (q, k, v, o): 2,048 + 512 + 512.
    matrices = 5 * (8_192 + 512 + 512) + 4 * (2_048 + 512 + 512)
    # Norms: three 64-value vectors (2 per layer + the final one), bf16 states of 128 B -> 512 B.
    norms = 3 * 512
    assert state.state_bytes == 2 * (matrices + norms) == 119_808
    assert state.step_temp_bytes == 0


def test_galore_on_a_tiny_llama_by_hand() -> None:
    """rank = hidden / 4 = 16. Each Linear: two 8-bit states of 16 × max side + a bf16
    16 × min side projection; embedding, head and norms step with 8-bit Adam."""
    spec = model_from_config(_TINY, name="tiny")
    setup = TrainingSetup(method="full", precision="bf16-true",
                          optimizer="galore-adamw8bit-per-layer")
    groups = param_groups(spec, setup, profile_for(setup))
    state = optimizer_state(groups, setup, fused=False, state_dtype_bytes=2,
                            galore_rank=projection_rank(spec.hidden_size))
    # q, k, v, o: 16 × 64 = 1,024 values, under 4096: fp32 states (4,096 B each)
    attention = 4 * (2 * 4_096 + 2_048)
    # gate, up, down: 16 × 256 = 4,096 values: 4,096 B of codes + 16 absmax (64 B -> 512 B)
    mlp = 3 * (2 * (4_096 + 512) + 2_048)
    pooled = 2 * 2 * (16_384 + 4 * 64)  # embedding and head: 8 bits + absmax per 256
    norms = 3 * 2 * allocated(4 * 64)  # under 4096 values: fp32 states
    assert state.state_bytes == attention + mlp + pooled + norms == 144_384
    assert optimizer_spec(Optimizer.GALORE_ADAMW8BIT_PER_LAYER).steps_in_backward


def test_galore_frees_gradients_in_backward() -> None:
    spec = model_from_config(_TINY, name="tiny")
    galore = estimate(spec, TrainingSetup(method="full", precision="bf16-true",
                                          optimizer="galore-adamw8bit-per-layer"))
    adam8 = estimate(spec, TrainingSetup(method="full", precision="bf16-true",
                                         optimizer="adamw-8bit"))
    def at_step(result: Estimate) -> int:
        return next(m.gradient_bytes for m in result.moments if m.label == "the optimizer step")

    assert at_step(galore) == 0
    assert at_step(adam8) == 2 * spec.n_params  # every bf16 gradient waits for the step


# --- units ---------------------------------------------------------------------------------


def test_sizes_are_labelled() -> None:
    assert format_gib(3 * GIB) == "3.00 GiB"
    assert format_gb(10**9, digits=1) == "1.0 GB"
    assert size_text(GIB) == "     1.00 GiB      1.07 GB"
