"""Export then read gives the same setup: axolotl YAML and TRL config, on every setup each tool
can express (hypothesis), plus the notes for what it cannot."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from vram import TrainingSetup, estimate
from vram.io.export import to_axolotl_yaml, to_trl_yaml
from vram.io.readers import load_training_config
from vram.stacks.resolve import resolve

MODEL = "llama-3.1-8b"
TARGETS = st.one_of(st.just("all-linear"), st.lists(
    st.sampled_from(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj"]), min_size=1, max_size=7, unique=True).map(tuple))


@st.composite
def setups(draw: st.DrawFn, *, tool: str) -> TrainingSetup:
    method = draw(st.sampled_from(["full", "lora", "qlora"]))
    fields: dict[str, Any] = {"method": method, "framework": "hf-trainer"}
    if method != "full":
        fields["lora_rank"] = draw(st.integers(1, 512))
        fields["lora_targets"] = draw(TARGETS)
        fields["lora_dropout"] = draw(st.sampled_from([0.0, 0.05, 0.1]))
    fields["quant"] = draw(st.sampled_from(["nf4", "nf4-dq", "int8"])) if method == "qlora" \
        else "none"
    fields["optimizer"] = draw(st.sampled_from(
        ["adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "sgd", "adafactor", "lion"]))
    precisions = ["fp32", "fp16-mixed", "bf16-mixed", "bf16-true"]
    if method == "qlora":
        precisions.remove("bf16-true")  # PEFT upcasts the non-quantized parameters
    elif tool == "axolotl":
        precisions.remove("bf16-mixed")  # axolotl loads the model in bf16: pure bf16
    fields["precision"] = draw(st.sampled_from(precisions))
    fields["micro_batch"] = draw(st.integers(1, 64))
    fields["seq_len"] = draw(st.integers(1, 131072))
    fields["grad_accum"] = draw(st.integers(1, 64))
    fields["grad_ckpt"] = draw(st.booleans())
    fields["attention"] = draw(st.sampled_from(["sdpa", "eager", "flash"]))
    fields["loss"] = draw(st.sampled_from(["standard", "chunked"]))
    fields["compile"] = draw(st.booleans())
    gpus = draw(st.sampled_from([1, 2, 8]))
    fields["n_gpus"] = gpus
    sharding = draw(st.sampled_from(["zero3"] if gpus == 1 else ["ddp", "zero1", "zero2",
                                                                 "zero3"]))
    fields["sharding"] = sharding
    offloads = ["none"]
    if sharding in ("zero1", "zero2", "zero3"):
        offloads.append("optimizer")
    if sharding == "zero3":
        offloads.append("params+optimizer")
    fields["offload"] = draw(st.sampled_from(offloads))
    return TrainingSetup.model_validate(fields)


def canonical(setup: TrainingSetup) -> dict[str, Any]:
    """The setup as the estimate sees it: stack defaults resolved, LoRA knobs only for LoRA."""
    out = setup.model_dump(mode="json")
    run = resolve(setup).run
    out.update(quant=setup.effective_quant.value, loss=run.loss.value if run.loss else None,
               compile=run.compile)
    if setup.method.value == "full":
        for field in ("lora_rank", "lora_targets", "lora_dropout"):
            out.pop(field)
    # The file names its tool (axolotl once the setup knows it), and the stack's own default
    # for knobs the drawn setup leaves unset: compared by the dedicated test below.
    for field in ("framework", "ckpt_reentrant", "fsdp_version", "sharding_engine"):
        out.pop(field, None)
    return out


def _same(original: TrainingSetup, text: str, fmt: str) -> None:
    back = load_training_config(text, format=fmt, gpus=original.n_gpus)  # type: ignore[arg-type]
    assert canonical(back.setup) == canonical(original), text
    assert back.model is not None and back.model.name == "Llama 3.1 8B"
    if back.setup.framework == original.framework:
        assert estimate(back.model, back.setup).device_peak_bytes == estimate(
            back.model, original).device_peak_bytes


@settings(max_examples=60, deadline=None)
@given(setups(tool="trl"))
def test_trl_round_trip(setup: TrainingSetup) -> None:
    text, _ = to_trl_yaml(setup, MODEL)
    _same(setup, text, "trl")


@settings(max_examples=60, deadline=None)
@given(setups(tool="axolotl"))
def test_axolotl_round_trip(setup: TrainingSetup) -> None:
    text, _ = to_axolotl_yaml(setup, MODEL)
    _same(setup, text, "axolotl")


def test_export_writes_the_checkpointing_fsdp_and_loss_knobs() -> None:
    setup = TrainingSetup(method="qlora", quant="nf4-dq", grad_ckpt=True, n_gpus=2,
                          sharding="zero3", loss="fused-linear", ckpt_reentrant=True,
                          fsdp_version=2)
    text, notes = to_axolotl_yaml(setup, MODEL)
    back = load_training_config(text, format="axolotl", gpus=2)
    assert back.fields["ckpt_reentrant"] is True
    assert back.fields["fsdp_version"] == 2
    assert back.fields["loss"] == "fused-linear"
    assert "fsdp_config" in text and "deepspeed" not in text
    assert any("2 GPUs" in note for note in notes)


def test_export_notes_what_axolotl_cannot_say() -> None:
    _, notes = to_axolotl_yaml(TrainingSetup(method="full", precision="bf16-mixed"), MODEL)
    assert any("bf16-true" in note for note in notes)
    _, notes = to_trl_yaml(TrainingSetup(method="full", optimizer="adamw-in-backward"), MODEL)
    assert any("adamw-in-backward" in note for note in notes)


def test_export_of_a_real_file_reads_back_the_same() -> None:
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "data/configs/axolotl/llama3-qlora.yml"
    loaded = load_training_config(path)
    text, _ = to_trl_yaml(loaded.setup, "meta-llama-3-8b")
    assert canonical(load_training_config(text, format="trl").setup) == canonical(loaded.setup)
