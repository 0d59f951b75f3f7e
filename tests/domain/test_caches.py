"""The per-model caches change no figure: a cached estimate equals one computed afresh."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vram import TrainingSetup, estimate, load_model
from vram.estimate import _state_part, state_part

MODELS = ["llama-3.1-8b", "mixtral-8x7b-v0.1", "t0_3b", "gemma-2-9b", "bert-large-uncased"]

structures = st.fixed_dictionaries({
    "method": st.sampled_from(["full", "lora", "qlora"]),
    "optimizer": st.sampled_from(["adamw", "adamw-8bit", "paged-adamw", "adafactor", "sgd",
                                  "adamw-in-backward"]),
    "precision": st.sampled_from(["fp32", "bf16-mixed", "bf16-true"]),
    "grad_ckpt": st.booleans(),
    "framework": st.sampled_from(["hf-trainer", "litgpt", "torchtune"]),
    "n_gpus": st.sampled_from([1, 8]),
    "lora_rank": st.sampled_from([8, 64]),
})
shapes = st.tuples(st.integers(1, 16), st.sampled_from([128, 1024, 8192]))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(MODELS), fields=structures, first=shapes, second=shapes)
def test_a_cached_estimate_equals_a_fresh_one(name: str, fields: dict,
                                              first: tuple[int, int],
                                              second: tuple[int, int]) -> None:
    if fields["n_gpus"] > 1:
        fields = {**fields, "sharding": "zero3"}
    model = load_model(name)
    warm = TrainingSetup(**fields, micro_batch=first[0], seq_len=first[1])
    setup = TrainingSetup(**fields, micro_batch=second[0], seq_len=second[1])
    estimate(model, warm)  # fills the cache with the same structure, another batch shape
    cached = estimate(model, setup)
    fresh = estimate(model.model_copy(), setup)  # a new object: an empty cache
    assert cached.model_dump() == fresh.model_dump()
    assert state_part(model, setup) == _state_part(model, setup)


def test_a_copy_of_a_model_gets_its_own_cache() -> None:
    model = load_model("llama-3.1-8b")
    setup = TrainingSetup(method="full")
    bigger = model.model_copy(update={"hidden_size": model.hidden_size * 2})
    assert state_part(model, setup) == _state_part(model, setup)
    assert state_part(bigger, setup) == _state_part(bigger, setup)
    assert state_part(bigger, setup) != state_part(model, setup)
