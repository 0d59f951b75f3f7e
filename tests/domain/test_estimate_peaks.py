"""`estimate_peaks` returns the peaks `estimate` reports, exactly, for every setup."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.estimate_snapshot import sample_setups
from vram import Estimate, PeakBytes, TrainingSetup, estimate, estimate_peaks, load_model
from vram.errors import VramError

MODELS = ["llama-3.1-8b", "mixtral-8x7b-v0.1", "t0_3b", "gemma-2-9b", "bert-large-uncased",
          "qwen3-30b-a3b", "falcon-7b", "phi-2", "llama-3.1-70b"]

setups = st.fixed_dictionaries({
    "method": st.sampled_from(["full", "lora", "qlora"]),
    "optimizer": st.sampled_from(["adamw", "adamw-8bit", "paged-adamw-8bit", "adafactor", "sgd",
                                  "adamw-in-backward"]),
    "precision": st.sampled_from(["fp32", "fp16-mixed", "bf16-mixed", "bf16-true"]),
    "grad_ckpt": st.booleans(),
    "grad_accum": st.sampled_from([1, 4]),
    "framework": st.sampled_from(["hf-trainer", "litgpt", "torchtune", "deepspeed", "unsloth",
                                  "fsdp-qlora"]),
    "gpus": st.sampled_from([(1, "none"), (1, "zero3"), (2, "ddp"), (4, "zero2"), (8, "zero3")]),
    "offload": st.sampled_from(["none", "activations", "optimizer"]),
    "attention": st.sampled_from(["eager", "sdpa", "flash"]),
    "loss": st.sampled_from([None, "chunked", "fused-linear"]),
    "micro_batch": st.integers(1, 16),
    "seq_len": st.sampled_from([128, 1000, 4096, 32768]),
})


def peaks_of(result: Estimate) -> PeakBytes:
    return PeakBytes(phase=result.phase, allocated_peak_bytes=result.allocated_peak_bytes,
                     reserved_peak_bytes=result.reserved_peak_bytes,
                     device_peak_bytes=result.device_peak_bytes, bounds=result.bounds)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(MODELS), fields=setups, fresh=st.booleans())
def test_the_peaks_are_the_estimates(name: str, fields: dict, fresh: bool) -> None:
    n_gpus, sharding = fields.pop("gpus")
    if fields["offload"] == "optimizer" and sharding not in ("zero2", "zero3"):
        fields["offload"] = "none"
    setup = TrainingSetup(**fields, n_gpus=n_gpus, sharding=sharding)
    model = load_model(name)
    peaks = estimate_peaks(model.model_copy() if fresh else model, setup)
    assert peaks == peaks_of(estimate(model, setup))
    assert peaks.model_dump_json() == PeakBytes.model_validate(peaks.model_dump()).model_dump_json()


def test_the_peaks_are_the_estimates_over_the_snapshot_sample() -> None:
    """Every setup of `benchmarks/estimate_snapshot.py` (each model, each knob): the same
    peaks, or the same refusal."""
    checked = 0
    for slug, fields in sample_setups(3000, 20261130):
        try:
            setup = TrainingSetup(**fields)
        except ValueError:
            continue
        model = load_model(slug)
        try:
            expected = peaks_of(estimate(model, setup))
        except VramError as error:
            try:
                estimate_peaks(model, setup)
            except VramError as same:
                assert str(same) == str(error)
                continue
            raise AssertionError(f"{slug}: estimate refused, estimate_peaks did not") from error
        assert estimate_peaks(model, setup) == expected, (slug, fields)
        checked += 1
    assert checked > 2800
