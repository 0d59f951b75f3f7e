"""Real configs from the projects' repositories (tests/data/configs/SOURCES.md) map to the
setup their authors meant, with each tool's defaults filled in from its source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import vram
from vram import TrainingSetup
from vram.io.readers import LoadedTrainingConfig, load_training_config
from vram.io.readers.mapper import FALLBACKS, accepts

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def load(rel: str, **kwargs: Any) -> LoadedTrainingConfig:
    return load_training_config(CONFIGS / rel, **kwargs)


def mapped(loaded: LoadedTrainingConfig, key: str) -> str:
    return next(row.sets for row in loaded.report.mapped if row.key == key)


def default_source(loaded: LoadedTrainingConfig, field: str) -> str:
    return next(d.source for d in loaded.report.defaults if d.field == field)


def in_setup(field: str, value: Any) -> Any:
    """What the current TrainingSetup holds for a reader's value: the value itself once the
    setup takes it (other branches add fused-linear loss, new frameworks), else its fallback."""
    if accepts(field, value):
        return value
    return FALLBACKS[(field, value)][0]


def waits(loaded: LoadedTrainingConfig, field: str) -> bool:
    """Whether a field is reported as read but not modelled (only while the setup lacks it)."""
    listed = any(n.field == field for n in loaded.report.not_modelled)
    holds = field in TrainingSetup.model_fields and accepts(field, loaded.fields[field])
    return listed != holds


def check(loaded: LoadedTrainingConfig, **expected: Any) -> None:
    got = loaded.setup.model_dump(mode="json")
    for field, value in expected.items():
        if isinstance(value, tuple):
            value = list(value)
        assert got[field] == value, f"{field}: {got[field]!r} != {value!r}"


# ---- axolotl ---------------------------------------------------------------------------------

def test_axolotl_qlora() -> None:
    loaded = load("axolotl/llama3-qlora.yml")
    assert loaded.format == "axolotl"
    assert loaded.model is not None and loaded.model.name == "Llama 3 8B"  # NousResearch mirror
    check(loaded, method="qlora", quant="nf4-dq", lora_rank=32, lora_targets="all-linear",
          micro_batch=2, grad_accum=4, seq_len=4096, grad_ckpt=True, optimizer="paged-adamw",
          precision="bf16-mixed", attention="flash", sharding="none",
          framework=in_setup("framework", "axolotl"))
    assert loaded.fields["framework"] == "axolotl"
    assert loaded.fields["ckpt_reentrant"] is True
    assert "utils/config/__init__.py@067b021" in default_source(loaded, "ckpt_reentrant")


def test_axolotl_lora_on_8bit_base() -> None:
    loaded = load("axolotl/llama3-lora-8b.yml")
    check(loaded, method="qlora", quant="int8", lora_rank=32, optimizer="adamw-8bit",
          seq_len=4096, micro_batch=2)


def test_axolotl_full_liger_fsdp() -> None:
    loaded = load("axolotl/llama3-fft-8b-liger-fsdp.yaml", gpus=8)
    check(loaded, method="full", precision="bf16-true", sharding="zero3", n_gpus=8,
          offload="params+optimizer", attention="flash", optimizer="adamw",
          loss=in_setup("loss", "fused-linear"))
    assert loaded.fields["loss"] == "fused-linear"
    assert loaded.fields["fsdp_version"] == 1
    assert "accelerate" in default_source(loaded, "fsdp_version")
    assert waits(loaded, "loss") and waits(loaded, "fsdp_version")


def test_axolotl_qlora_fsdp_70b_is_reentrant() -> None:
    loaded = load("axolotl/llama3-qlora-fsdp-70b.yaml")
    assert loaded.model is not None and loaded.model.name == "Llama 3.1 70B"  # same shape
    check(loaded, method="qlora", lora_rank=8, seq_len=512, micro_batch=1, sharding="zero3",
          offload="params+optimizer", optimizer="adamw")
    assert loaded.fields["ckpt_reentrant"] is True
    assert mapped(loaded, "gradient_checkpointing_kwargs.use_reentrant") == "ckpt_reentrant=True"


def test_axolotl_dpo_is_recorded() -> None:
    loaded = load("axolotl/llama3-instruct-dpo-lora-8b.yml")
    assert "RL algorithm dpo" in mapped(loaded, "rl")
    assert loaded.fields["ckpt_reentrant"] is False  # RL runs keep the builder's False
    assert "core/builders/base.py" in default_source(loaded, "ckpt_reentrant")
    check(loaded, method="qlora", quant="int8", micro_batch=2)


def test_axolotl_full_paged_8bit() -> None:
    loaded = load("axolotl/llama3-fft-8b.yaml")
    check(loaded, method="full", micro_batch=1, grad_accum=8, seq_len=8192,
          optimizer="paged-adamw-8bit", precision="bf16-true", grad_ckpt=True)


def test_axolotl_deepspeed_file_beside_is_read(tmp_path: Path) -> None:
    source = CONFIGS / "axolotl/zero3_bf16.json"
    (tmp_path / "zero3_bf16.json").write_bytes(source.read_bytes())
    text = (CONFIGS / "axolotl/llama3-qlora.yml").read_text()
    config = tmp_path / "run.yml"
    config.write_text(text + "\ndeepspeed: deepspeed_configs/zero3_bf16.json\n")
    loaded = load_training_config(config, gpus=2)
    assert loaded.setup.sharding.value == "zero3"
    assert "DeepSpeed config" in mapped(loaded, "deepspeed zero_optimization.stage")
    off = load_training_config(config, gpus=2, allow_file_reads=False)
    assert off.setup.sharding.value == "zero3"  # from the name only, and the report says so
    assert "not read" in mapped(off, "deepspeed")


# ---- torchtune -------------------------------------------------------------------------------

LORA_TARGETS = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_torchtune_lora_single_device() -> None:
    loaded = load("torchtune/llama3_1-8B_lora_single_device.yaml")
    assert loaded.format == "torchtune"
    assert loaded.model is not None and loaded.model.name == "Llama 3.1 8B Instruct"
    check(loaded, method="lora", lora_rank=8, lora_dropout=0.0, lora_targets=LORA_TARGETS,
          micro_batch=2, grad_accum=8, precision="bf16-true", grad_ckpt=True, compile=False,
          loss=in_setup("loss", "fused-linear"), framework="torchtune", sharding="none",
          seq_len=2048)
    assert "PURE bf16" in mapped(loaded, "dtype")
    assert "max_seq_len is null" in default_source(loaded, "seq_len")


def test_torchtune_qlora_is_nf4_double_quantized() -> None:
    check(load("torchtune/llama3_1-8B_qlora_single_device.yaml"), method="qlora",
          quant="nf4-dq", lora_rank=8)


def test_torchtune_distributed_full() -> None:
    loaded = load("torchtune/llama3_1-8B_full.yaml", gpus=8)
    check(loaded, method="full", sharding="zero3", n_gpus=8, micro_batch=2, grad_ckpt=True,
          fsdp_embedding_units=True)
    assert loaded.fields["fsdp_version"] == 2
    assert "own" in mapped(loaded, "custom_sharded_layers")


def test_torchtune_70b_lora_and_qwen_without_checkpointing() -> None:
    lora = load("torchtune/llama3_1-70B_lora.yaml", gpus=8)
    # custom_sharded_layers is commented out: the embedding and output stay in the root unit
    check(lora, lora_rank=16, sharding="zero3", fsdp_embedding_units=False)
    assert "shard_model" in default_source(lora, "fsdp_embedding_units")
    qwen = load("torchtune/qwen2_5-7B_lora.yaml", gpus=2)
    assert qwen.model is not None and qwen.model.name == "Qwen2.5 7B Instruct"
    check(qwen, grad_ckpt=False, grad_accum=8)


def test_torchtune_grpo_is_recorded() -> None:
    loaded = load("torchtune/dev-3B_full_grpo.yaml")
    assert loaded.model is not None and loaded.model.name == "Llama 3.2 3B"  # from the builder
    assert mapped(loaded, "grpo_samples").startswith("RL generation")
    assert any(i.key == "ref_checkpointer" for i in loaded.report.ignored)


def test_torchtune_overrides_like_tune_run() -> None:
    loaded = load("torchtune/llama3_1-8B_lora_single_device.yaml",
                  overrides=["batch_size=8", "model.lora_rank=64", "dtype=fp32",
                             "enable_activation_checkpointing=False",
                             "tokenizer.max_seq_len=4096", "~compile"])
    check(loaded, micro_batch=8, lora_rank=64, precision="fp32", grad_ckpt=False, seq_len=4096,
          compile=False)
    assert any("override applied: batch_size=8" in note for note in loaded.report.notes)


# ---- LLaMA-Factory ---------------------------------------------------------------------------

def test_llamafactory_checkpoints_unless_told_not_to() -> None:
    loaded = load("llamafactory/qwen3_lora_sft.yaml")
    assert loaded.format == "llamafactory"
    check(loaded, method="lora", lora_rank=8, lora_targets="all-linear", grad_ckpt=True,
          micro_batch=1, grad_accum=8, seq_len=2048, precision="bf16-true")
    assert "checkpoints unless told not to" in default_source(loaded, "grad_ckpt")
    assert loaded.fields["ckpt_reentrant"] is True  # use_reentrant_gc defaults to True
    # Qwen/Qwen3-4B-Instruct-2507 resolves offline since issue 22 (a hub_ids.csv row)
    assert loaded.model_slug == "qwen3-4b" and loaded.model_problem is None


def test_llamafactory_deepspeed_json_beside_it() -> None:
    loaded = load("llamafactory/qwen3_lora_sft_ds3.yaml", gpus=4)
    check(loaded, sharding="zero3", n_gpus=4, grad_accum=2)
    assert "DeepSpeed config" in mapped(loaded, "deepspeed zero_optimization.stage")


def test_llamafactory_qlora_full_and_dpo() -> None:
    check(load("llamafactory/qwen3_lora_sft_otfq.yaml"), method="qlora", quant="nf4-dq",
          precision="bf16-mixed")
    check(load("llamafactory/qwen3_full_sft.yaml", gpus=2), method="full",
          precision="bf16-mixed", sharding="zero3")
    dpo = load("llamafactory/qwen3_lora_dpo.yaml")
    assert "DPO" in mapped(dpo, "stage")
    fsdp_qlora = load("llamafactory/llama3_fsdp_qlora_sft.yaml")
    assert fsdp_qlora.model is not None and fsdp_qlora.model.name == "Llama 3 8B"


def test_llamafactory_disable_checkpointing(tmp_path: Path) -> None:
    text = (CONFIGS / "llamafactory/qwen3_lora_sft.yaml").read_text()
    config = tmp_path / "x.yaml"
    config.write_text(text + "\ndisable_gradient_checkpointing: true\n")
    check(load_training_config(config), grad_ckpt=False)


# ---- TRL -------------------------------------------------------------------------------------

def test_trl_example_takes_trl_defaults() -> None:
    loaded = load("trl/trl-example_config.yaml")
    assert loaded.format == "trl"
    assert loaded.model is not None and loaded.model.name == "Qwen2.5 0.5B Instruct"
    check(loaded, method="full", micro_batch=8, seq_len=1024, grad_ckpt=True,
          precision="bf16-mixed", loss="chunked")
    assert "trl/trainer/base_config.py@f2cd577" in default_source(loaded, "grad_ckpt")
    assert "sft_config.py" in default_source(loaded, "loss")


def test_trl_versus_training_arguments_trap() -> None:
    text = "model_name_or_path: meta-llama/Llama-3.1-8B\nper_device_train_batch_size: 2\n"
    trl = vram.load_training_config(text, format="trl")
    assert trl.setup.grad_ckpt is True and trl.setup.precision.value == "bf16-mixed"
    from vram.io.readers import trl as trl_reader
    from vram.io.readers.safe_yaml import parse_mapping
    plain = trl_reader.read(parse_mapping(text), trainer="training-arguments")
    assert plain.setup_fields["grad_ckpt"] is False
    assert plain.setup_fields["precision"] == "fp32"


def test_trl_zephyr_qlora_and_full() -> None:
    qlora = load("trl/zephyr-7b-beta-sft-qlora.yaml")
    assert qlora.model is not None and qlora.model.name == "Mistral 7B v0.1"
    check(qlora, method="qlora", quant="nf4", lora_rank=16, micro_batch=4, grad_accum=2,
          seq_len=2048, attention="flash", precision="bf16-mixed",
          lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"))
    assert qlora.fields["ckpt_reentrant"] is False
    check(load("trl/zephyr-7b-beta-sft-full.yaml"), method="full", precision="bf16-true",
          micro_batch=16)


def test_trl_dpo_and_liger() -> None:
    dpo = load("trl/zephyr-7b-beta-dpo-qlora.yaml")
    check(dpo, lora_rank=128, optimizer="paged-adamw", micro_batch=4, grad_accum=4, seq_len=1024)
    assert "DPO" in mapped(dpo, "(trainer)")
    smol = load("trl/smollm3-sft.yaml")
    assert smol.fields["loss"] == "fused-linear" and smol.fields["ckpt_reentrant"] is True
    check(smol, seq_len=65536, micro_batch=1, precision="bf16-true")


def test_trl_grpo_open_r1() -> None:
    loaded = load("trl/open-r1-qwen2.5-1.5b-grpo.yaml")
    assert loaded.model is not None and loaded.model.name == "Qwen2.5 1.5B Instruct"
    check(loaded, method="full", micro_batch=16, grad_accum=4, seq_len=512 + 1024,
          precision="bf16-true", attention="flash", loss="standard")
    assert "GRPO" in mapped(loaded, "(trainer)")
    assert mapped(loaded, "num_generations").startswith("RL generation")
    assert mapped(loaded, "use_vllm").startswith("RL generation")


@pytest.mark.parametrize("rel", sorted(p.relative_to(CONFIGS).as_posix()
                                       for p in CONFIGS.glob("*/*.y*ml")))
def test_every_real_file_is_inferred_and_estimated(rel: str) -> None:
    loaded = load(rel, gpus=2)
    assert loaded.format == rel.split("/")[0]
    if loaded.model is not None:
        result = vram.estimate(loaded.model, loaded.setup)
        assert result.device_peak_bytes > 0
    assert loaded.report.lines()[0].startswith(f"Read as {loaded.format}")


def test_trl_dpo_peft_under_zero3_is_reentrant(tmp_path: Path) -> None:
    text = (CONFIGS / "trl/zephyr-7b-beta-dpo-qlora.yaml").read_text()
    text = text.replace("gradient_checkpointing_kwargs:\n  use_reentrant: false\n", "")
    plain = load_training_config(text, format="trl")
    assert plain.fields["ckpt_reentrant"] is False
    zero3 = load_training_config(text + "\ndeepspeed: {zero_optimization: {stage: 3}}\n",
                                 format="trl", gpus=4)
    assert zero3.fields["ckpt_reentrant"] is True
    assert "dpo_trainer.py@f2cd577" in default_source(zero3, "ckpt_reentrant")
