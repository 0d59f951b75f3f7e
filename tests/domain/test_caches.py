"""The per-model caches change no figure: a cached estimate equals one computed afresh."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from vram import TrainingSetup, estimate, load_model
from vram.step.estimate import _state_part, state_part

MODELS = ["llama-3.1-8b", "mixtral-8x7b-v0.1", "t0_3b", "gemma-2-9b", "bert-large-uncased",
          "falcon-7b", "phi-2"]

structures = st.fixed_dictionaries({
    "method": st.sampled_from(["full", "lora", "qlora"]),
    "optimizer": st.sampled_from(["adamw", "adamw-8bit", "paged-adamw", "adafactor", "sgd",
                                  "adamw-in-backward"]),
    "precision": st.sampled_from(["fp32", "bf16-mixed", "bf16-true"]),
    "grad_ckpt": st.booleans(),
    "framework": st.sampled_from(["hf-trainer", "litgpt", "torchtune"]),
    "n_gpus": st.sampled_from([1, 8]),
    "lora_rank": st.sampled_from([8, 64]),
    "attention": st.sampled_from(["eager", "sdpa", "flash"]),
})
shapes = st.tuples(st.sampled_from([1, 2, 7]), st.sampled_from([128, 1024, 8192]))


FALCON_EAGER = {"method": "lora", "optimizer": "adamw", "precision": "bf16-mixed",
                "grad_ckpt": False, "framework": "hf-trainer", "n_gpus": 1, "lora_rank": 8,
                "attention": "eager"}


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(MODELS), fields=structures, first=shapes, second=shapes)
# Falcon's eager attention broadcasts K/V for one sequence and expands it for more.
@example(name="falcon-7b", fields=FALCON_EAGER, first=(2, 1024), second=(1, 1024))
@example(name="falcon-7b", fields=FALCON_EAGER, first=(1, 1024), second=(2, 1024))
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


def _fit_reference(model, setup, catalog):  # type: ignore[no-untyped-def]
    """fit() as first written: a fresh estimate for every GPU and count (GPUs that cannot
    compute in the setup's precision are neither fits nor misses); a sure fit where the
    band's high bound is within the memory, on the GPU's own CUDA context (the context term
    out of the band where the GPU's is measured), borderline where the band straddles it and
    the estimate itself fits."""
    from vram.gpus import _counts, context_difference, runs_precision, setup_on
    fits, misses, borderline = [], [], []
    for gpu in catalog:
        if not runs_precision(gpu, setup.precision):
            continue
        first = best = straddles = None
        known = setup.context_mib is None and gpu.cuda_context_mib is not None
        for count in _counts(gpu, setup):
            run = setup_on(setup, count)
            est = estimate(model.model_copy(), run)
            shift = context_difference(gpu, setup)
            peak = est.device_peak_bytes + shift
            high = est.bounds.device_high_bytes + shift - (
                est.bounds.context_high_bytes if known else 0)
            option = (gpu.id, count, run.sharding, peak)
            first = first or option
            if high <= gpu.memory_bytes:
                best = option
                break
            if straddles is None and peak <= gpu.memory_bytes:
                straddles = option
        if best is not None:
            fits.append(best)
        elif first is not None:
            misses.append(first)
        if straddles is not None:
            borderline.append(straddles)
    return sorted(fits), sorted(misses), sorted(borderline)


@settings(max_examples=8, deadline=None)
@given(name=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b-v0.1"]),
       method=st.sampled_from(["full", "lora", "qlora"]), n_gpus=st.sampled_from([1, 4]),
       seq_len=st.sampled_from([2048, 32768]))
def test_fit_equals_a_fresh_estimate_per_gpu_and_count(name: str, method: str, n_gpus: int,
                                                       seq_len: int) -> None:
    from vram import fit, load_gpus
    model = load_model(name)
    setup = TrainingSetup(method=method, n_gpus=n_gpus, seq_len=seq_len,
                          sharding="zero3" if n_gpus > 1 else "none")
    catalog = load_gpus()
    fit(model, setup, catalog)  # warm the caches
    report = fit(model, setup, catalog)
    got = (sorted((o.gpu.id, o.count, o.sharding, o.device_peak_bytes) for o in report.fits),
           sorted((o.gpu.id, o.count, o.sharding, o.device_peak_bytes) for o in report.misses),
           sorted((o.gpu.id, o.count, o.sharding, o.device_peak_bytes)
                  for o in report.borderline))
    assert got == _fit_reference(model, setup, catalog)


def test_remembered_parameter_counts_follow_the_model_object() -> None:
    model = load_model("llama-3.1-8b")
    assert model.n_params == 8_030_261_248  # the published count, remembered after this
    wider = model.model_copy(update={"vocab_size": model.vocab_size + 1,
                                     "embedding_params": model.embedding_params
                                     + model.hidden_size})
    assert wider.n_params == model.n_params + 2 * model.hidden_size  # embedding + head rows
    assert model.n_params == 8_030_261_248


def test_the_remembered_setup_key_belongs_to_the_setup_asked_about() -> None:
    """`setup_key` remembers its last answer by the setup's identity and the ignored fields."""
    from vram.memo import TOKEN_FIELDS, setup_key

    qlora, full = TrainingSetup(), TrainingSetup(method="full")
    everything = frozenset({"seq_len"})
    for setup in (qlora, full, qlora, qlora, full):
        assert setup_key(setup, TOKEN_FIELDS) == tuple(
            value for name, value in setup if name not in TOKEN_FIELDS)
        assert setup_key(setup, everything) == tuple(
            value for name, value in setup if name != "seq_len")
    assert setup_key(qlora, TOKEN_FIELDS) != setup_key(full, TOKEN_FIELDS)
