"""The stack table, the optimizer rows and the precision policy: complete, cited, and exact."""

from __future__ import annotations

import itertools
from types import MappingProxyType

import pytest

from vram import TrainingSetup
from vram.activations import numerics, zero_half_model
from vram.errors import VramError
from vram.optimizer import (
    OPTIMIZERS,
    blockwise_8bit_bytes,
    bnb_8bit_tensor_bytes,
    factored_bytes,
    optimizer_spec,
    optimizer_state,
)
from vram.params import Matrices, ParamGroup, Storage
from vram.precision import precision_policy
from vram.setup import Framework, Loss, Optimizer
from vram.stack import ROW_FIELDS, STACKS, profile_for, runs_transformers_code, stack_row
from vram.units import GIB, format_gb, format_gib, size_text

HF_LIKE = (Framework.HF_TRAINER, Framework.PEFT_ACCELERATE, Framework.FSDP_QLORA,
           Framework.UNSLOTH, Framework.OTHER)


# --- stacks --------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", list(Framework))
def test_every_framework_has_a_row_with_a_versioned_source_per_field(
        framework: Framework) -> None:
    row = stack_row(framework)
    assert set(row.sources) == set(ROW_FIELDS), framework
    for name, source in row.sources.items():
        assert "@" in source, f"{framework.value}.{name}: {source!r} names no version"


def test_a_framework_without_a_row_is_an_error_not_hugging_face(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {k: v for k, v in STACKS.items() if k is not Framework.UNSLOTH}
    monkeypatch.setattr("vram.stack.STACKS", MappingProxyType(rows))
    with pytest.raises(VramError, match="framework: no stack profile for 'unsloth'"):
        profile_for(TrainingSetup(framework="unsloth"))


def test_model_code_follows_the_stack() -> None:
    """Transformers' attention dispatch and masks apply to the HF-based stacks only."""
    for framework in Framework:
        profile = profile_for(TrainingSetup(framework=framework))
        assert runs_transformers_code(profile) is (framework in HF_LIKE), framework


def test_stack_defaults_come_from_the_table() -> None:
    assert TrainingSetup(framework="torchtune").effective_compile is True
    assert TrainingSetup(framework="torchtune", compile=False).effective_compile is False
    assert TrainingSetup(framework="litgpt").effective_loss is Loss.CHUNKED
    assert TrainingSetup(framework="hf-trainer").effective_loss is Loss.STANDARD
    assert TrainingSetup(framework="hf-trainer", loss="chunked").effective_loss is Loss.CHUNKED


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
def test_precision_record_agrees_with_the_activation_numerics(setup: TrainingSetup) -> None:
    """The record's activation dtypes are those `vram.activations` computes on its own (until
    it reads the record)."""
    profile = profile_for(setup)
    n = numerics(setup, profile)
    p = profile.precision
    assert (p.compute, p.residual, p.attention, p.autocast, p.input_copy_per_linear) == (
        n.compute, n.residual, n.attention, n.autocast, n.input_copy_per_linear)
    assert p.half_model is zero_half_model(setup)


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


def test_only_the_in_backward_optimizer_steps_in_backward() -> None:
    assert {o for o, s in OPTIMIZERS.items() if s.steps_in_backward} == {
        Optimizer.ADAMW_IN_BACKWARD}


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


# --- units ---------------------------------------------------------------------------------


def test_sizes_are_labelled() -> None:
    assert format_gib(3 * GIB) == "3.00 GiB"
    assert format_gb(10**9, digits=1) == "1.0 GB"
    assert size_text(GIB) == "     1.00 GiB      1.07 GB"
