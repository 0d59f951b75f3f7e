"""Result objects the estimate assembles without validation (`vram.result`, `assemble`) are
the objects validation would build: the same values, of the same types, the same JSON."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from vram import TrainingSetup, estimate, load_model
from vram.result import Bucket, BucketName, LineItem, MomentBytes, MomentId, Phase

MODELS = ["llama-3.1-8b", "mixtral-8x7b-v0.1", "t0_3b", "gemma-2-9b", "bert-large-uncased",
          "qwen3-30b-a3b", "phi-2"]

setups = st.fixed_dictionaries({
    "method": st.sampled_from(["full", "lora", "qlora"]),
    "optimizer": st.sampled_from(["adamw", "paged-adamw-8bit", "adafactor", "adamw-in-backward"]),
    "precision": st.sampled_from(["fp32", "bf16-mixed", "bf16-true"]),
    "grad_ckpt": st.booleans(),
    "framework": st.sampled_from(["hf-trainer", "litgpt", "torchtune", "deepspeed"]),
    "gpus": st.sampled_from([(1, "none"), (2, "ddp"), (8, "zero3"), (4, "fsdp")]),
    "fsdp_version": st.sampled_from([1, 2]),
    "attention": st.sampled_from(["eager", "sdpa", "flash"]),
    "micro_batch": st.sampled_from([1, 3]),
    "seq_len": st.sampled_from([128, 4096]),
})


def assert_same_object(built: object, validated: object, where: str = "estimate") -> None:
    """Equal values of identical types, all the way down (1 == 1.0 == True would pass `==`)."""
    assert type(built) is type(validated), where
    if isinstance(built, BaseModel):
        assert isinstance(validated, BaseModel)
        assert built.__pydantic_extra__ == validated.__pydantic_extra__, where
        assert built.__pydantic_private__ == validated.__pydantic_private__, where
        assert list(type(built).model_fields) == list(type(validated).model_fields)
        for name in type(built).model_fields:
            assert_same_object(getattr(built, name), getattr(validated, name), f"{where}.{name}")
    elif isinstance(built, dict):
        assert isinstance(validated, dict)
        assert list(built) == list(validated), where
        for key in built:
            assert_same_object(built[key], validated[key], f"{where}[{key!r}]")
    elif isinstance(built, tuple | list):
        assert isinstance(validated, tuple | list)
        assert len(built) == len(validated), where
        for index, (one, other) in enumerate(zip(built, validated, strict=True)):
            assert_same_object(one, other, f"{where}[{index}]")
    else:
        assert built == validated, where


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(MODELS), fields=setups)
def test_an_assembled_estimate_is_the_validated_one(name: str, fields: dict) -> None:
    n_gpus, sharding = fields.pop("gpus")
    if sharding == "fsdp":
        sharding = "zero3"
        fields["framework"] = "hf-trainer"
    setup = TrainingSetup(**fields, n_gpus=n_gpus, sharding=sharding)
    result = estimate(load_model(name), setup)
    validated = type(result).model_validate(result.model_dump())
    assert_same_object(result, validated)
    assert result == validated
    assert result.model_dump_json() == validated.model_dump_json()


def test_assembled_parts_equal_validated_ones() -> None:
    item = LineItem.assemble("activations.x", "x", "tokens × 2 B", {"tokens": 8}, 16, "s")
    assert_same_object(item, LineItem(key="activations.x", label="x", formula="tokens × 2 B",
                                      inputs={"tokens": 8}, bytes=16, source="s"))
    bucket = Bucket.assemble(BucketName.ACTIVATIONS, (item,))
    assert_same_object(bucket, Bucket(name="activations", items=(item,)))
    moment = MomentBytes.assemble(Phase.BACKWARD, MomentId.LOSS, 10, 2, 3, 0)
    assert_same_object(moment, MomentBytes(phase="backward", label="the loss",
                                           allocated_bytes=10, gradient_bytes=2,
                                           activation_bytes=3))


def test_assembled_parts_stay_frozen() -> None:
    item = LineItem.assemble("activations.x", "x", "f", {}, 16)
    with pytest.raises(ValueError, match="frozen"):
        item.bytes = 3  # type: ignore[misc]


def test_negative_bytes_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"activations\.x: bytes must be >= 0, got -1"):
        LineItem.assemble("activations.x", "x", "f", {}, -1)
    with pytest.raises(ValueError, match="the loss: bytes must be >= 0"):
        MomentBytes.assemble(Phase.BACKWARD, MomentId.LOSS, 10, -2, 3, 0)


def test_without_pydantics_slot_setters_the_public_model_construct_builds_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a pydantic release moves the slots `_assembled` writes, it falls back to
    `model_construct`: the same estimate, field by field."""
    import vram.result

    model = load_model("llama-3.1-8b")
    setup = TrainingSetup(method="qlora", grad_ckpt=True, seq_len=4096)
    fast = estimate(model, setup).model_dump()
    monkeypatch.setattr(vram.result, "_SETTERS", None)
    assert estimate(model.model_copy(), setup).model_dump() == fast
