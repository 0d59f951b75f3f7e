"""Expert parallelism (issue 22, item 3): a rank holds `E / ep` experts of every routed bank,
ZeRO shards the banks over the ranks that hold the same experts, and the routing's imbalance is
the explicit `capacity_factor` (vram/sharding/expert_parallel.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vram import TrainingSetup, estimate, load_model
from vram.errors import VramError
from vram.memory.activations.context import layer_context
from vram.memory.activations.transients import ep_dispatch_per_token
from vram.sharding.expert_parallel import ep_local, state_model
from vram.stacks.profile import profile_for

MIXTRAL = "mixtral-8x7b-v0.1"  # h 4096, I 14336, 8 experts, top-2, 32 layers, vocab 32000
QWEN3_MOE = "qwen3-30b-a3b"  # h 2048, moe I 768, 128 experts, top-8, 48 layers


def _run(**fields: object) -> TrainingSetup:
    base: dict[str, object] = {"method": "full", "optimizer": "adamw", "n_gpus": 8,
                               "framework": "deepspeed", "seq_len": 1024}
    return TrainingSetup.model_validate({**base, **fields})


def _item(model: str, run: TrainingSetup, key: str) -> int:
    found = estimate(load_model(model), run)
    return next(i.bytes for b in found.buckets for i in b.items if i.key == key)


def test_a_rank_holds_its_share_of_the_experts() -> None:
    """Mixtral under DDP, ep 8: one expert per rank. Per layer: attention 4096·(4096 + 1024 +
    1024 + 4096) = 41,943,040, router 4096·8 = 32,768, one expert 4096·28672 + 14336·4096 =
    176,160,768; 32 layers = 6,980,370,432 Linear weights, in bf16 twice that."""
    run = _run(precision="bf16-true", sharding="ddp", ep=8)
    assert _item(MIXTRAL, run, "weights.linears") == 2 * 6_980_370_432
    # the DDP buckets are the rank's trainable parameters, embedding and head included:
    # 6,980,370,432 + 2·131,072,000 + 266,240 norm values
    assert _item(MIXTRAL, run, "gradients.ddp_buckets") == 2 * 7_242_780_672
    whole = _run(precision="bf16-true", sharding="ddp")
    assert _item(MIXTRAL, whole, "weights.linears") == 2 * (
        6_980_370_432 + 32 * 7 * 176_160_768)
    # the reported counts stay the whole model's
    assert estimate(load_model(MIXTRAL), run).params.total == 46_702_792_704


def test_sharded_state_is_split_over_the_ranks_of_the_same_experts() -> None:
    """ZeRO-3 over 8 GPUs, ep 8: the banks are FSDP-sharded over 8 / 8 = 1 rank of the same
    experts, a rank's share bank / 8, as without EP: the optimizer state does not move, the
    layer ZeRO-3 gathers holds 16 experts instead of 128."""
    model = load_model(QWEN3_MOE)
    plain = _run(framework="torchtitan", sharding="zero3", precision="bf16-mixed")
    ep8 = plain.model_copy(update={"ep": 8})
    assert estimate(model, ep8).bucket_bytes["optimizer"] == \
        estimate(model, plain).bucket_bytes["optimizer"]
    local = ep_local(model, 8)
    assert [ln.copies for ln in local.stacks[0].linears if ln.is_bank] == [16, 16]
    assert state_model(local, sharded=True).stacks == model.stacks
    assert state_model(local, sharded=False) is local
    # ZeRO-1: weights and gradients whole on each rank, so bank / 8 there
    zero1 = _run(sharding="zero1", precision="bf16-true")
    banks = 48 * 128 * 3 * 2048 * 768  # 28,991,029,248 expert values
    assert _item(QWEN3_MOE, zero1, "weights.linears") - _item(
        QWEN3_MOE, zero1.model_copy(update={"ep": 8}), "weights.linears") == 2 * banks * 7 // 8


def test_the_dispatch_buffer_and_the_capacity_factor() -> None:
    """The all-to-all's receive buffer per token: hidden · top-k · capacity factor rows, in the
    activations' dtype: Qwen3-30B-A3B in bf16, 2·2048·8 = 32,768 B balanced, 65,536 B at 2."""
    model = load_model(QWEN3_MOE)
    for factor, expected in ((1.0, 32_768), (2.0, 65_536)):
        run = _run(framework="torchtitan", sharding="zero3", precision="bf16-true", ep=8,
                   capacity_factor=factor)
        local = ep_local(model, 8)
        c = layer_context(local, local.stacks[0], run, profile_for(run))
        assert ep_dispatch_per_token(c) == expected
    one = _run(framework="torchtitan", sharding="zero3", precision="bf16-true", ep=8)
    two = one.model_copy(update={"capacity_factor": 2.0})
    assert estimate(model, two).activation_bytes_max > estimate(model, one).activation_bytes_max


def test_the_knobs_refuse_what_cannot_run() -> None:
    with pytest.raises(ValidationError, match="capacity_factor: routing imbalance"):
        TrainingSetup(capacity_factor=2.0)
    with pytest.raises(VramError, match=r"ep: Llama 3\.1 8B has no routed experts"):
        estimate(load_model("llama-3.1-8b"), _run(sharding="zero3", ep=8))
    with pytest.raises(VramError, match="ep: 16 must divide the 8 experts"):
        estimate(load_model(MIXTRAL), _run(n_gpus=16, sharding="zero3", ep=16))
    with pytest.raises(VramError, match="ep: hf-trainer runs no expert parallel"):
        estimate(load_model(MIXTRAL), _run(framework="hf-trainer", sharding="zero3", ep=8))


# LoRA on the expert banks (PEFT `target_parameters`) -------------------------------------------

@pytest.mark.parametrize(("choice", "banks"), [
    ("none", 0),
    ("gate_up", 16 * 128 * (2048 + 1536) * 48),  # [E, 2I, h] bank: r·E·(h + 2I) per layer
    ("down", 16 * 128 * (768 + 2048) * 48),  # [E, h, I] bank: r·E·(I + h)
    ("all", 16 * 128 * (2048 + 1536 + 768 + 2048) * 48),
])
def test_expert_lora_counts_by_hand(choice: str, banks: int) -> None:
    """Qwen3-30B-A3B at r 16: PEFT's `ParamWrapper` gives each bank lora_A = Linear(in, r·E)
    and lora_B = Linear(r·E, out) (peft/tuners/lora/layer.py@v0.21.2 #L2455-L2456); q and v
    adapters beside: 48·16·((2048 + 4096) + (2048 + 512)) = 6,684,672 (the same counts come
    from PEFT itself: tests/trace/test_expert_lora_count.py, and 635,830,272 on the full
    config, measured once on the meta device)."""
    run = TrainingSetup(method="lora", lora_rank=16, lora_targets="q_proj,v_proj",
                        lora_experts=choice, precision="bf16-true", framework="axolotl")
    assert estimate(load_model(QWEN3_MOE), run).params.trainable == 6_684_672 + banks


def test_expert_lora_and_ep_are_knobs_on_every_surface() -> None:
    """Field, CLI flag, URL key and case-file column (the app's control is built from them)."""
    from vram.io.knobs import knob_for, setup_from_texts

    for name, flag, key, column in (("lora_experts", "--lora-experts", "lexp", "lora_experts"),
                                    ("ep", "--ep", "ep", "ep"),
                                    ("capacity_factor", "--capacity-factor", "cf",
                                     "capacity_factor")):
        knob = knob_for(name)
        assert (knob.flag, knob.key, knob.column) == (flag, key, column)
    texts = {"method": "lora", "lora_experts": "all", "n_gpus": "8", "sharding": "zero3",
             "ep": "8", "capacity_factor": "1.5"}
    run = setup_from_texts(texts, lambda k: k.name, lambda k: k.column)
    assert (run.lora_experts.value, run.ep, run.capacity_factor) == ("all", 8, 1.5)
