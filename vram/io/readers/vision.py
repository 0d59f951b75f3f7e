"""A vision-language model's inputs as each training config states them (issue 22).

What the file leaves out is the stack's default (`data/stacks.toml`: LLaMA-Factory's own
bounds; for the others, the checkpoint's processor). How many images a sample holds is in the
data, not the config: `--images` gives it.

- LLaMA-Factory@ff6d4d12 `src/llamafactory/hparams/model_args.py` ProcessorArguments:
  `image_max_pixels`, `image_min_pixels`, `video_max_pixels`, `video_fps`, `video_maxlen`,
  `crop_to_patches`, `image_do_pan_and_scan`; `finetuning_args.py` `freeze_vision_tower`,
  `freeze_multi_modal_projector`.
- axolotl@067b021c `src/axolotl/utils/schemas/model.py` `processor_kwargs` (forwarded to the
  processor's `from_pretrained`: `min_pixels`, `max_pixels`); `schemas/multimodal.py`
  `image_size` (axolotl resizes each image to it first); `schemas/config.py`
  `freeze_mm_modules`.
- TRL@f2cd577 loads the processor with no kwargs (`trl/trainer/sft_trainer.py` line 980): its
  own config classes have none. The VLM scripts built on it add them as script arguments that
  the same YAML carries (`TrlParser` reads one file into every dataclass): R1-V's
  `GRPOScriptArguments.max_pixels` / `min_pixels` (Deep-Agent/R1-V@8fe656f3
  `src/r1-v/src/open_r1/grpo.py`, defaults 12,845,056 and 3,136, handed to its trainer's
  processor), the script its many forks (Video-R1, VLM-R1, ...) keep.
- ms-swift's `MAX_PIXELS` environment variable becomes a token budget,
  `IMAGE_MAX_TOKEN_NUM = MAX_PIXELS // (patch · merge)²` (`swift/model/models/qwen.py@3602360a`
  `compat_qwen_vl_utils`), the same pixels: the ms-swift reader takes it, `MIN_PIXELS` and
  `VIDEO_MAX_PIXELS` from a launch script's prefixes or its config file's `ENV`
  (`swift_env`), and its `--max_pixels` flag (`swift`).
"""

from __future__ import annotations

from typing import Any

from vram.errors import TrainingConfigError
from vram.io.readers.mapper import Mapper, shown
from vram.setup.vision import MAX_IMAGE_SIDE, MAX_PIXELS

LF_MODEL_ARGS = "LLaMA-Factory src/llamafactory/hparams/model_args.py@ff6d4d12"
#: LLaMA-Factory's keys for the pixel bounds -> the setup's field.
_LF_BOUNDS = (("image_max_pixels", "max_pixels"), ("image_min_pixels", "min_pixels"),
              ("video_max_pixels", "video_max_pixels"))


def map_llamafactory(m: Mapper) -> None:
    """LLaMA-Factory's ProcessorArguments and vision freezing."""
    for key, field in _LF_BOUNDS:
        if m.has(key):
            m.set(field, m.int_key(key, high=MAX_PIXELS), key)
    crops = [key for key in ("crop_to_patches", "image_do_pan_and_scan") if m.has(key)]
    if crops:
        on = any(m.bool_key(key) for key in crops)
        m.set("crop_images", on, crops[0], m.get(crops[0]),
              "InternVL's crop_to_patches / Gemma 3's pan & scan")
    tower, projector = m.bool_key("freeze_vision_tower"), m.bool_key(
        "freeze_multi_modal_projector")
    if tower is not None or projector is not None:
        frozen = tower if tower is not None else True
        m.set("freeze_vision", frozen, "freeze_vision_tower", tower,
              "the tower and projector" + ("" if projector in (None, frozen) else
                                           "; vram freezes the projector with the tower"))
    if m.has("video_maxlen"):
        m.record("video_maxlen", m.int_key("video_maxlen"), "the most frames sampled per "
                 "video: give --video-frames (fps x seconds, at most this)")
    for key in ("video_fps", "video_min_pixels"):
        if m.has(key):
            m.record(key, m.get(key), "video sampling (frames come from --video-frames)")


def map_axolotl(m: Mapper) -> None:
    """axolotl's `processor_kwargs`, `image_size` and `freeze_mm_modules`."""
    kwargs = m.get("processor_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise TrainingConfigError("processor_kwargs", f"must be a mapping, got {shown(kwargs)}")
        for field in ("max_pixels", "min_pixels"):
            if kwargs.get(field) is not None:
                key = f"processor_kwargs.{field}"
                m.set(field, m.int_key(key, kwargs[field], high=MAX_PIXELS), key)
    size = m.get("image_size")
    if size is not None:
        height, width = _axolotl_size(size)
        m.set("image_height", height, "image_size", size, "axolotl resizes each image to it")
        m.set("image_width", width, "image_size", size)
    frozen = m.bool_key("freeze_mm_modules")
    if frozen is not None:
        m.set("freeze_vision", frozen, "freeze_mm_modules", frozen)


def map_trl(m: Mapper) -> None:
    """The `max_pixels` / `min_pixels` script arguments of the VLM scripts built on TRL."""
    for field in ("max_pixels", "min_pixels"):
        if m.get(field) is not None:
            m.set(field, m.int_key(field, high=MAX_PIXELS), field, m.get(field),
                  "a VLM script's argument (R1-V's GRPOScriptArguments)")


def _axolotl_size(size: Any) -> tuple[int, int]:
    """`image_size`: an int (a padded square) or (width, height)."""
    if isinstance(size, list | tuple) and len(size) == 2:
        width, height = size
    else:
        width = height = size
    for value in (width, height):
        if (isinstance(value, bool) or not isinstance(value, int)
                or not 1 <= value <= MAX_IMAGE_SIDE):
            raise TrainingConfigError("image_size", f"an int or [width, height] of 1 to "
                                      f"{MAX_IMAGE_SIDE:,}, got {shown(size)}")
    return int(height), int(width)
