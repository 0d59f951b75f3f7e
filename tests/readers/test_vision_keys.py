"""The training configs' own keys for a vision-language model's inputs (issue 22): LLaMA-
Factory's ProcessorArguments and freezing, axolotl's processor_kwargs, image_size and
freeze_mm_modules, the pixel bounds of the VLM scripts built on TRL
(`vram/io/readers/vision.py`)."""

from __future__ import annotations

import pytest

from vram.errors import TrainingConfigError
from vram.io.readers import load_training_config

LLAMA_FACTORY = """
model_name_or_path: Qwen/Qwen2.5-VL-7B-Instruct
stage: sft
finetuning_type: lora
template: qwen2_vl
cutoff_len: 4096
image_max_pixels: 1003520
image_min_pixels: 3136
video_max_pixels: 65536
video_maxlen: 64
video_fps: 2.0
freeze_vision_tower: false
crop_to_patches: true
"""

AXOLOTL = """
base_model: Qwen/Qwen2.5-VL-7B-Instruct
adapter: lora
lora_r: 16
lora_target_linear: true
sequence_len: 4096
processor_kwargs:
  max_pixels: 1003520
  min_pixels: 3136
image_size: [1920, 1080]
freeze_mm_modules: true
"""


def test_llama_factory_processor_arguments() -> None:
    loaded = load_training_config(LLAMA_FACTORY, format="llamafactory")
    setup = loaded.setup
    assert (setup.max_pixels, setup.min_pixels, setup.video_max_pixels) == (
        1_003_520, 3136, 65_536)
    assert setup.freeze_vision is False and setup.crop_images is True
    recorded = {key.key for key in loaded.report.mapped}
    assert {"video_maxlen", "video_fps"} <= recorded
    assert not any(i.key in ("image_max_pixels", "video_max_pixels")
                   for i in loaded.report.ignored)


def test_llama_factory_leaves_its_defaults_to_the_stack() -> None:
    """A file without the keys: LLaMA-Factory's own defaults come from its stack row."""
    from vram.stacks.resolve import resolve

    text = "\n".join(line for line in LLAMA_FACTORY.splitlines()
                     if not line.startswith(("image_", "video_", "freeze_", "crop_")))
    setup = load_training_config(text, format="llamafactory").setup
    assert setup.max_pixels is None
    run = resolve(setup).run
    assert (run.max_pixels, run.min_pixels, run.freeze_vision, run.crop_images) == (
        589_824, 1024, True, False)


def test_axolotl_processor_kwargs_image_size_and_freezing() -> None:
    setup = load_training_config(AXOLOTL, format="axolotl").setup
    assert (setup.max_pixels, setup.min_pixels) == (1_003_520, 3136)
    assert (setup.image_height, setup.image_width) == (1080, 1920)  # [width, height]
    assert setup.freeze_vision is True


@pytest.mark.parametrize("size", ["big", [0, 10], True])
def test_axolotl_bad_image_size_names_the_key(size: object) -> None:
    text = AXOLOTL.replace("image_size: [1920, 1080]", f"image_size: {size}")
    with pytest.raises(TrainingConfigError, match=r"^image_size: "):
        load_training_config(text, format="axolotl")


#: R1-V's GRPO recipe for Qwen2-VL as one TrlParser YAML: GRPOConfig, ModelConfig and its
#: GRPOScriptArguments (max_pixels, min_pixels) in one file.
TRL_GRPO = """
model_name_or_path: Qwen/Qwen2.5-VL-7B-Instruct
num_generations: 4
max_completion_length: 512
per_device_train_batch_size: 1
gradient_checkpointing: true
bf16: true
max_pixels: 401408
min_pixels: 3136
"""


def test_trl_vlm_script_pixel_bounds() -> None:
    loaded = load_training_config(TRL_GRPO, format="trl")
    assert (loaded.setup.max_pixels, loaded.setup.min_pixels) == (401_408, 3136)
    assert not any(i.key in ("max_pixels", "min_pixels") for i in loaded.report.ignored)


def test_trl_without_the_bounds_leaves_the_processors() -> None:
    text = "\n".join(line for line in TRL_GRPO.splitlines() if "pixels" not in line)
    setup = load_training_config(text, format="trl").setup
    assert (setup.max_pixels, setup.min_pixels) == (None, None)


def test_trl_bad_max_pixels_names_the_key() -> None:
    with pytest.raises(TrainingConfigError, match=r"^max_pixels: "):
        load_training_config(TRL_GRPO.replace("401408", "lots"), format="trl")
