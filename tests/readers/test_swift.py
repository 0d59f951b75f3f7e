"""ms-swift: its launch scripts and its config file (tests/data/configs/SOURCES.md, ms-swift
@3602360a) map to the setup their authors meant, with ms-swift's defaults from its source; a
script is read as text and never run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vram.errors import TrainingConfigError, VramError
from vram.io.readers import LoadedTrainingConfig, infer_format, load_training_config
from vram.io.readers.safe_yaml import parse_mapping
from vram.io.readers.swift_command import looks_like_command, parse_command

SWIFT = Path(__file__).resolve().parents[1] / "data" / "configs" / "ms-swift"
QWEN = "swift sft --model Qwen/Qwen2.5-7B-Instruct"

#: Every training example copied from ms-swift@3602360a, and the setup it stands for.
EXAMPLES: dict[str, dict[str, Any]] = {
    # examples/train/lora_sft.sh ("# 22GB"): one GPU, every ms-swift default for the rest.
    "lora_sft.sh": dict(
        method="lora", quant=None, lora_rank=8, lora_targets="all-linear", lora_dropout=0.05,
        precision="bf16-true", micro_batch=1, grad_accum=16, seq_len=2048, grad_ckpt=True,
        ckpt_reentrant=True, attention="sdpa", n_gpus=1, sharding="none",
        framework="ms-swift", freeze_vision=True, loss="standard", optimizer="adamw"),
    # examples/train/qlora/bnb/train.sh ("# 10GB"): 4-bit nf4, double quantization.
    "qlora-bnb-train.sh": dict(
        method="qlora", quant="nf4-dq", lora_rank=8, lora_targets="all-linear",
        precision="bf16-mixed", micro_batch=1, grad_accum=16, seq_len=2048, grad_ckpt=True,
        n_gpus=1),
    # examples/train/full/train.sh ("# 76GiB").
    "full-train.sh": dict(
        method="full", precision="bf16-true", micro_batch=1, grad_accum=16, seq_len=2048,
        grad_ckpt=True, ckpt_reentrant=True, n_gpus=1, sharding="none"),
    # examples/train/multi-gpu/deepspeed/train_zero3.sh ("# 16GiB * 2"): the GPU count is a
    # literal `nproc_per_node=2` the script names as `$nproc_per_node`.
    "multi-gpu-deepspeed-train_zero3.sh": dict(
        method="lora", n_gpus=2, sharding="zero3", sharding_engine="deepspeed", offload="none",
        ckpt_reentrant=True, grad_accum=8, seq_len=2048),
    # examples/train/packing/qwen2_5_vl.sh ("# 4 * 36GB"): MAX_PIXELS bounds every image.
    "packing-qwen2_5_vl.sh": dict(
        method="lora", n_gpus=4, sharding="zero2", attention="flash", max_pixels=1_003_520,
        seq_len=8192, grad_accum=1, freeze_vision=True),
    # examples/train/multimodal/lora_llm_full_vit/sft.sh ("# 4 * 22GiB").
    "multimodal-lora_llm_full_vit-sft.sh": dict(
        method="lora", lora_rank=16, n_gpus=4, sharding="zero2", max_pixels=1_003_520,
        seq_len=8192, grad_accum=4, freeze_vision=False),
    # examples/train/sequence_parallel/sequence_parallel.sh ("8 * 40GiB"): plain DDP, so
    # ms-swift's checkpointing is non-reentrant.
    "sequence_parallel.sh": dict(
        method="lora", micro_batch=4, grad_accum=8, seq_len=65_536, n_gpus=8, sharding="ddp",
        cp=8, cp_kind="ulysses", attention="flash", ckpt_reentrant=False),
    # examples/yaml/deepspeed/sft.yaml: ms-swift's own config file (`swift sft sft.yaml`); no
    # ENV, so one GPU, and zero2 waits for the GPU count.
    "yaml-deepspeed-sft.yaml": dict(
        method="lora", lora_rank=8, lora_targets="all-linear", precision="bf16-true",
        micro_batch=1, grad_accum=8, seq_len=2048, n_gpus=1, sharding="none"),
}


def load(name: str, **kwargs: Any) -> LoadedTrainingConfig:
    return load_training_config(SWIFT / name, **kwargs)


def check(loaded: LoadedTrainingConfig, expected: dict[str, Any]) -> None:
    got = loaded.setup.model_dump(mode="json")
    for field, value in expected.items():
        assert got[field] == value, f"{field}: {got[field]!r} != {value!r}"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_real_examples_map_to_the_setup_meant(name: str) -> None:
    loaded = load(name)
    assert loaded.format == "ms-swift"
    check(loaded, EXAMPLES[name])
    assert loaded.report.tool_version.startswith("ms-swift@3602360a")
    misspelt = [i.key for i in loaded.report.ignored if "check its spelling" in i.reason]
    assert misspelt == [], misspelt


def test_catalog_models_resolve() -> None:
    assert load("lora_sft.sh").model_slug == "qwen2.5-7b-instruct"
    assert load("packing-qwen2_5_vl.sh").model_slug == "qwen2.5-vl-7b"


def test_defaults_cite_ms_swift_at_its_version() -> None:
    loaded = load("lora_sft.sh")
    sources = {d.field: d.source for d in loaded.report.defaults}
    assert "swift/trainers/arguments.py@3602360a" in sources["grad_ckpt"]
    assert "swift/arguments/tuner_args.py@3602360a" in sources["freeze_vision"]
    assert "_fix_gradient_checkpointing" in sources["ckpt_reentrant"]
    assert "@3602360a" in sources["lora_dropout"]


def test_the_scripts_shell_expansion_is_reported_not_run() -> None:
    loaded = load("multi-gpu-deepspeed-train_zero3.sh")
    reason = next(i.reason for i in loaded.report.ignored
                  if i.key == "gradient_accumulation_steps")
    assert "$(expr 16 / $nproc_per_node)" in reason and "runs nothing" in reason
    assert any("$nproc_per_node read as 2" in note for note in loaded.report.notes)
    # ms-swift's own default then applies: ceil(16 / 1 / 2 GPUs).
    assert "ceil(16 / 1 / 2 GPUs) = 8" in next(
        d.source for d in loaded.report.defaults if d.field == "grad_accum")


def test_environment_is_read_from_the_prefixes() -> None:
    loaded = load("packing-qwen2_5_vl.sh")
    mapped = {row.key: row.sets for row in loaded.report.mapped}
    assert mapped["MAX_PIXELS"].startswith("max_pixels=1003520")
    assert mapped["NPROC_PER_NODE"].startswith("n_gpus=4")
    assert "4 GPU(s) visible" in mapped["CUDA_VISIBLE_DEVICES"]
    assert mapped["packing"] == "samples fill max_length"


def test_config_file_env_mapping() -> None:
    text = (SWIFT / "yaml-deepspeed-sft.yaml").read_text()
    text += "ENV:\n  NPROC_PER_NODE: 2\n  MAX_PIXELS: '602112'\n  VIDEO_MAX_PIXELS: 50176\n"
    setup = load_training_config(text).setup
    assert (setup.n_gpus, setup.sharding, setup.sharding_engine) == (2, "zero2", "deepspeed")
    assert (setup.max_pixels, setup.video_max_pixels) == (602_112, 50_176)


def test_detection() -> None:
    for name in [*EXAMPLES, "multi-gpu-fsdp2_lora-train.sh"]:
        text = (SWIFT / name).read_text()
        assert looks_like_command(text) == name.endswith(".sh"), name
    yaml = parse_mapping((SWIFT / "yaml-deepspeed-sft.yaml").read_text())
    assert infer_format(yaml) == "ms-swift"
    # A YAML config whose comment shows the command is still a YAML config.
    assert not looks_like_command("# swift sft config.yaml\nmodel: Qwen/Qwen2.5-7B\n")
    assert looks_like_command("NPROC_PER_NODE=2 nohup swift rlhf --rlhf_type dpo\n")


def test_flags_and_defaults_in_one_command() -> None:
    setup = load_training_config(
        "NPROC_PER_NODE=4 swift sft --model Qwen/Qwen2.5-7B-Instruct --tuner_type lora "
        "--quant_method bnb --quant_bits 4 --bnb_4bit_use_double_quant false --lora_rank 64 "
        "--target_modules q_proj v_proj --torch_dtype float16 --attn_impl flash_attention_2 "
        "--deepspeed zero3_offload --use_liger_kernel true --per_device_train_batch_size 2 "
        "--max_length 4096 --optim adamw_8bit --gradient_checkpointing_kwargs "
        "'{\"use_reentrant\": false}'").setup
    assert (setup.method, setup.quant, setup.lora_rank) == ("qlora", "nf4", 64)
    assert setup.lora_targets == ("q_proj", "v_proj")
    assert (setup.precision, setup.attention, setup.loss) == ("fp16-mixed", "flash",
                                                              "fused-linear")
    assert (setup.n_gpus, setup.sharding, setup.offload) == (4, "zero3", "params+optimizer")
    assert (setup.micro_batch, setup.seq_len, setup.grad_accum) == (2, 4096, 2)
    assert setup.optimizer == "adamw-8bit" and setup.ckpt_reentrant is False


def test_ms_swift_3_train_type_and_bare_flags() -> None:
    loaded = load_training_config(f"{QWEN} --train_type full --gradient_checkpointing false "
                                  "--freeze_vit false --fsdp fsdp2")
    setup = loaded.setup
    assert (setup.method, setup.grad_ckpt, setup.freeze_vision) == ("full", True, False)
    assert (setup.sharding_engine, setup.fsdp_version) == ("fsdp", 2)  # the fsdp2 preset
    bare = load_training_config(f"{QWEN} --use_liger_kernel --torch_compile").setup
    assert bare.compile is True and bare.loss == "fused-linear"


def test_max_pixels_flag_and_env_the_smaller_holds() -> None:
    both = "MAX_PIXELS=1003520 swift sft --model Qwen/Qwen2.5-VL-7B-Instruct --max_pixels "
    assert load_training_config(both + "602112").setup.max_pixels == 602_112
    assert load_training_config(both + "2007040").setup.max_pixels == 1_003_520


def test_only_the_first_training_command_is_read() -> None:
    text = (f"nproc=2\nNPROC_PER_NODE=$nproc {QWEN} --lora_rank 4 > log 2>&1\n"
            f"swift infer --adapters output\n{QWEN} --lora_rank 32\n")
    command = parse_command(text)
    assert command.data["lora_rank"] == 4 and command.data["ENV"]["NPROC_PER_NODE"] == 2
    assert any("1 more swift training command" in n for n in command.notes)


# ---- hostile and broken input ----------------------------------------------------------------

def refused(text: str, key: str, fragment: str) -> None:
    with pytest.raises(TrainingConfigError) as info:
        load_training_config(text)
    message = str(info.value)
    assert message.startswith(f"{key}: ") and fragment in message, message
    assert "\n" not in message


@pytest.mark.parametrize(("text", "key", "fragment"), [
    (f"{QWEN} --system 'You are", "file", "quote is never closed"),
    (f'{QWEN} --system "You are', "file", "quote is never closed"),
    (f"{QWEN} --max_length {'9' * 5000}", "max_length", "5,000 digits"),
    (f"{QWEN} --per_device_train_batch_size 99999999999", "per_device_train_batch_size",
     "between 1 and 10,000,000"),
    ("NPROC_PER_NODE=" + "9" * 40 + f" {QWEN}", "NPROC_PER_NODE", "between 1 and"),
    ("NPROC_PER_NODE=64 NNODES=4096 " + QWEN, "NNODES", "at most"),
    (f"{QWEN} --tuner_type vera", "tuner_type", "full, lora and lora_llm"),
    (f"{QWEN} --quant_method bnb --quant_bits 3", "quant_bits", "4 or 8"),
    (f"{QWEN} --quant_method gguf --quant_bits 4", "quant_method", "bnb, hqq"),
    (f"{QWEN} --tuner_type full --quant_method bnb --quant_bits 4", "quant_method",
     "tuner_type lora"),
    (f"{QWEN} --torch_dtype int4", "torch_dtype", "bfloat16, float16 or float32"),
    (f"{QWEN} --packing true", "packing", "flash_attn"),
    (f"{QWEN} --deepspeed zero2 --fsdp fsdp2", "fsdp", "contradicts deepspeed"),
    (f"{QWEN} --deepspeed '{{\"zero_optimization\": '", "deepspeed", "not valid JSON"),
    (f"{QWEN} --deepspeed '{{\"x\": NaN}}'", "deepspeed", "not valid JSON"),
    (f"{QWEN} --lora_rank 4.5", "lora_rank", "whole number"),
    (f"{QWEN} --bf16 true --fp16 true", "fp16", "contradicts bf16"),
    ("MAX_PIXELS=lots " + QWEN, "MAX_PIXELS", "whole number"),
    ("swift sft config.yaml", "swift", "read that file instead"),
    (f"{QWEN} --lora_rank \x00", "file", "control character"),
    (f"{QWEN} --system '" + "a " * 40_000 + "'", "file", "longer than 64,000"),
    ("accelerate launch train.py --model Qwen/Qwen2.5-7B-Instruct", "file", "mapping"),
])
def test_bad_input_is_one_line_naming_the_key(text: str, key: str, fragment: str) -> None:
    refused(text, key, fragment)


def test_command_substitution_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    loaded = load_training_config(
        f"MAX_PIXELS=$(touch {marker}) swift sft --model $(touch {marker}) "
        f"--lora_rank `touch {marker}` --max_length 1024; touch {marker}")
    assert not marker.exists()
    ignored = {i.key: i.reason for i in loaded.report.ignored}
    assert {"model", "lora_rank", "MAX_PIXELS"} <= set(ignored)
    assert "runs nothing" in ignored["model"]
    assert loaded.model is None and "names no model" in (loaded.model_problem or "")
    assert loaded.setup.seq_len == 1024 and loaded.setup.max_pixels is None


def test_unknown_flags_and_variables_are_reported() -> None:
    loaded = load_training_config(f"FOO_BAR=1 {QWEN} --tuner_typo lora --frobnicate")
    ignored = {i.key: i.reason for i in loaded.report.ignored}
    assert "check its spelling" in ignored["tuner_typo"]
    assert "check its spelling" in ignored["frobnicate"]
    assert "not an environment variable vram reads" in ignored["FOO_BAR"]


def test_unexpanded_gpu_count_asks_for_gpus() -> None:
    loaded = load_training_config(f"NPROC_PER_NODE=$N {QWEN}")
    assert loaded.setup.n_gpus == 1
    assert "--gpus N" in next(i.reason for i in loaded.report.ignored
                              if i.key == "NPROC_PER_NODE")
    assert load_training_config(f"NPROC_PER_NODE=$N {QWEN}", gpus=4).setup.n_gpus == 4


def test_a_launcher_running_ms_swifts_script() -> None:
    """examples/train/multi-gpu/fsdp2_lora/train.sh: `accelerate launch --config_file X
    swift/cli/sft.py ...`; accelerate's own config (the process count, FSDP) is not read."""
    loaded = load("multi-gpu-fsdp2_lora-train.sh")
    check(loaded, dict(method="lora", n_gpus=1, grad_ckpt=False, sharding="none",
                       seq_len=2048, lora_rank=8))
    assert any("its config file is not read" in note for note in loaded.report.notes)
    assert any("--gpus N" in note for note in loaded.report.notes)
    assert not any("device_map" in note for note in loaded.report.notes)
    torchrun = load_training_config(
        "NPROC_PER_NODE=2 torchrun --nproc_per_node=4 --nnodes 2 swift/cli/sft.py "
        "--model Qwen/Qwen2.5-7B-Instruct --deepspeed zero3")
    assert (torchrun.setup.n_gpus, torchrun.setup.sharding) == (8, "zero3")
    assert any("instead of NPROC_PER_NODE=2" in n for n in torchrun.report.notes)
    single = load_training_config("CUDA_VISIBLE_DEVICES=0,1 python swift/cli/sft.py "
                                  "--model Qwen/Qwen2.5-7B-Instruct")
    assert single.setup.n_gpus == 1
    assert any("device_map" in note for note in single.report.notes)


def test_rlhf_grpo_step_sees_prompt_and_completion() -> None:
    loaded = load_training_config(
        "swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-7B-Instruct --max_length 1024 "
        "--num_generations 8 --use_vllm true")
    assert loaded.setup.seq_len == 1024 + 512  # max_completion_length default 512
    recorded = {row.key for row in loaded.report.mapped}
    assert {"rlhf_type", "num_generations", "use_vllm"} <= recorded
    dpo = load_training_config("swift rlhf --rlhf_type dpo --model Qwen/Qwen2.5-7B-Instruct "
                               "--max_length 2048 --max_completion_length 256")
    assert dpo.setup.seq_len == 2048
    assert "max_completion_length" in {row.key for row in dpo.report.mapped}
    assert not any("spelling" in i.reason for i in dpo.report.ignored)


_PIECES = st.sampled_from([
    "swift sft", " ", "\n", "\\\n", "--model", "Qwen/Qwen2.5-7B-Instruct", "--lora_rank",
    "--tuner_type", "lora", "full", "'", '"', "$(", ")", "`", "$x", "x=2", "NPROC_PER_NODE=",
    "MAX_PIXELS=", "4", "#", ";", "|", "&", "2>&1", "--max_length", "99999999999", "=", "{",
    "}", "--deepspeed", "zero3", "export ", "torchrun --nproc_per_node", "swift/cli/sft.py",
    "\t", "\r\n", "é", "--",
])


@given(st.lists(_PIECES, max_size=40).map("".join))
@settings(max_examples=300, deadline=None)
def test_any_script_text_reads_or_says_why_in_one_line(text: str) -> None:
    try:
        loaded = load_training_config("swift sft " + text)
    except VramError as exc:
        assert "\n" not in str(exc)
        return
    assert loaded.format == "ms-swift"
