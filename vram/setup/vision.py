"""The knobs of a vision-language model's inputs (issue 22), declared once as field types.

`TrainingSetup` names each as a field (`vram.setup.training`); these types carry the range and
the `Knob` (CLI flag, app control, URL key, case-file column). Every one defaults to today's
behaviour: no images, no video, the stack's and the processor's own pixel bounds.

Each has a case-file column named like its field (design.md: "Case-file columns are added for
new knobs ... empty means the default"); the shared case file has none yet, the project's case
file of vision-language runs does (`benchmarks/vlm/cases.csv`).

How the sequence relates (`docs/vlm-tokens.md`): `seq_len` is the language model's whole
sequence, image and video tokens included (what `cutoff_len`, `max_length` and
`sequence_len` bound); the image tokens must fit in it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from vram.setup.knob import Knob

MAX_IMAGES = 256
MAX_IMAGE_SIDE = 32_768
MAX_PIXELS = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE
MAX_VIDEO_FRAMES = 4096

_AUTO_PROCESSOR = (("auto", "the stack's, else the model's processor"),)
_SIDES = (224, 336, 448, 720, 896, 1024, 1080, 1344, 1920, 2048, 3024, 4032)
_PIXELS = (65_536, 200_704, 401_408, 589_824, 802_816, 1_003_520, 2_007_040, 4_014_080,
           12_845_056, 16_777_216)

ImagesPerSample = Annotated[int, Field(strict=True, ge=0, le=MAX_IMAGES), Knob(
    "Images per sample", key="img", flag="--images", column="images_per_sample",
    app_options=(0, 1, 2, 3, 4, 6, 8, 16), vlm_only=True,
    help="images in each sequence of a vision-language model (0: text only); their tokens "
         "count in --seq",
)]
ImageSide = Annotated[int | None, Field(strict=True, ge=1, le=MAX_IMAGE_SIDE)]
ImageHeight = Annotated[ImageSide, Knob(
    "Image height (px)", key="imgh", flag="--image-height", column="image_height",
    labels=(("auto", "the largest the processor keeps"),), app_options=_SIDES, vlm_only=True,
    help="height of each image and video frame before the processor (default: a square "
         "image as large as the processor keeps)",
)]
ImageWidth = Annotated[ImageSide, Knob(
    "Image width (px)", key="imgw", flag="--image-width", column="image_width",
    labels=(("auto", "the largest the processor keeps"),), app_options=_SIDES, vlm_only=True,
    help="width of each image and video frame before the processor (default: a square image "
         "as large as the processor keeps)",
)]
PixelBound = Annotated[int | None, Field(strict=True, ge=1, le=MAX_PIXELS)]
MaxPixels = Annotated[PixelBound, Knob(
    "Max pixels per image", key="maxpx", flag="--max-pixels", column="max_pixels",
    labels=_AUTO_PROCESSOR, app_options=_PIXELS, vlm_only=True,
    help="Qwen-VL processors: an image above this many pixels is scaled down (default: the "
         "stack's, else the checkpoint's processor: 12,845,056 for Qwen2.5-VL)",
)]
MinPixels = Annotated[PixelBound, Knob(
    "Min pixels per image", key="minpx", flag="--min-pixels", column="min_pixels",
    labels=_AUTO_PROCESSOR, app_options=(1024, 3136, 65_536, 200_704), vlm_only=True,
    help="Qwen-VL processors: an image below this many pixels is scaled up (default: the "
         "stack's, else the checkpoint's processor)",
)]
CropImages = Annotated[bool | None, Field(strict=True), Knob(
    "Crop images into tiles", key="crop", flag="--crop-images", column="crop_images",
    labels=(("auto", "the stack's, else the processor's"), ("true", "crop into tiles"),
            ("false", "one image each")), vlm_only=True,
    help="cut large or elongated images into tiles or crops where the processor can "
         "(InternVL crop_to_patches, Idefics3 do_image_splitting, Gemma 3 pan & scan; default: "
         "the stack's, else the processor's)",
)]
VideoFrames = Annotated[int, Field(strict=True, ge=0, le=MAX_VIDEO_FRAMES), Knob(
    "Video frames per sample", key="vframes", flag="--video-frames", column="video_frames",
    app_options=(0, 4, 8, 16, 32, 64, 128, 256), vlm_only=True,
    help="frames of one video in each sequence, as sampled (fps x seconds, at most the "
         "stack's video_maxlen / max_frames; 0: no video)",
)]
VideoMaxPixels = Annotated[PixelBound, Knob(
    "Max pixels per video frame", key="vmaxpx", flag="--video-max-pixels",
    column="video_max_pixels",
    labels=_AUTO_PROCESSOR,
    app_options=(16_384, 65_536, 200_704, 602_112, 786_432), vlm_only=True,
    help="Qwen-VL video processors' bound on a frame's pixels (Qwen3-VL: on the whole clip's; "
         "default: the stack's, else the processor's)",
)]
FreezeVision = Annotated[bool | None, Field(strict=True), Knob(
    "Freeze the vision tower", key="vfreeze", flag="--freeze-vision", column="freeze_vision",
    labels=(("auto", "stack default"), ("true", "frozen: no gradients, no LoRA"),
            ("false", "trained with the rest")), vlm_only=True,
    help="the vision tower and projector get neither gradients nor LoRA adapters (default: "
         "the stack's; LLaMA-Factory freezes them, PEFT's all-linear adapts them)",
)]
