"""The processor rules of `vram.model.processor` against transformers' own processors
(5.24.0), on random image sizes: the port must give the processor's figures, not close ones.
The PIL processors are used (the torchvision ones need torchvision, not in the trace extra);
each is the same rule (`image_processing_pil_<type>.py`).
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from vram import load_model
from vram.model.processor import (
    Processor,
    ProcessorKind,
    best_canvas,
    image_tokens,
    smart_resize,
    video_tokens,
)

SIZES = [(random.Random(seed).randint(16, 5000), random.Random(seed + 1).randint(16, 5000))
         for seed in range(0, 200, 2)]
SIZES = [(h, w) for h, w in SIZES if max(h, w) / min(h, w) < 150]


@pytest.mark.parametrize("bounds", [(3136, 1_003_520), (3136, 12_845_056), (65_536, 589_824)])
def test_qwen_images(bounds: tuple[int, int]) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    low, high = bounds
    hf = Qwen2VLImageProcessorPil(min_pixels=low, max_pixels=high)
    ours = Processor(kind=ProcessorKind.QWEN, patch=14, merge=2, min_pixels=low,
                     max_pixels=high)
    for h, w in SIZES:
        assert image_tokens(ours, h, w).tower_tokens == hf.get_number_of_image_patches(h, w), (h, w)


def test_qwen_video_frames_bounded_per_frame() -> None:
    # the video processor needs torchvision; its `smart_resize` is the image processor's
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as hf_resize,
    )

    ours = Processor(kind=ProcessorKind.QWEN, patch=14, merge=2, temporal_patch=2,
                     video_min_pixels=128 * 28 * 28, video_max_pixels=768 * 28 * 28)
    for h, w in SIZES[:30]:
        rh, rw = hf_resize(h, w, factor=28, min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28)
        assert video_tokens(ours, 9, h, w).lm_tokens == 5 * (rh // 28) * (rw // 28), (h, w)
        assert smart_resize(h, w, 28, 128 * 28 * 28, 768 * 28 * 28) == (rh, rw)


def test_qwen3_video_bound_over_the_clip() -> None:
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_resize

    ours = Processor(kind=ProcessorKind.QWEN, patch=16, merge=2, temporal_patch=2,
                     video_min_pixels=128 * 32 * 32, video_max_pixels=768 * 32 * 32,
                     video_bound_is_clip=True)
    for h, w in SIZES[:30]:
        rh, rw = hf_resize(16, h, w, temporal_factor=2, factor=32, min_pixels=128 * 32 * 32,
                           max_pixels=768 * 32 * 32)
        assert video_tokens(ours, 16, h, w).lm_tokens == 8 * (rh // 32) * (rw // 32), (h, w)


def test_internvl_tiles() -> None:
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil,
    )

    hf = GotOcr2ImageProcessorPil(size={"height": 448, "width": 448}, crop_to_patches=True)
    ours = Processor(kind=ProcessorKind.CLOSEST_TILES, patch=14, size=448, tokens=256,
                     extra_tower_tokens=1, max_tiles=12, can_crop=True, crops_by_default=True)
    for h, w in SIZES:
        assert image_tokens(ours, h, w).tiles == hf.get_number_of_image_patches(h, w), (h, w)


def test_idefics3_splitting() -> None:
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    hf = Idefics3ImageProcessorPil()
    ours = Processor(kind=ProcessorKind.SPLIT, patch=14, size=364, tokens=169,
                     longest_edge=4 * 364, max_tiles=17, can_crop=True, crops_by_default=True)
    for h, w in SIZES:
        tiles, _, _ = hf.get_number_of_image_patches(h, w)
        assert image_tokens(ours, h, w).tiles == max(1, tiles), (h, w)


def test_smolvlm_splitting_over_its_checkpoints_tile() -> None:
    """SmolVLM2's processor is Idefics3's; SmolVLM2-500M's preprocessor_config.json sets the
    longest edge to 2048 and the tile to 512, which vram reads as 4 x `image_size`."""
    from transformers.models.smolvlm.image_processing_pil_smolvlm import (
        SmolVLMImageProcessorPil,
    )

    hf = SmolVLMImageProcessorPil(size={"longest_edge": 2048},
                                  max_image_size={"longest_edge": 512})
    vision = load_model("smolvlm2-500m-video-instruct").vision
    assert vision is not None
    ours = vision.processor
    assert (ours.size, ours.longest_edge, ours.tokens) == (512, 2048, 64)
    for h, w in SIZES:
        tiles, _, _ = hf.get_number_of_image_patches(h, w)
        assert image_tokens(ours, h, w).tiles == max(1, tiles), (h, w)


def test_mllama_canvas() -> None:
    """mllama's canvas; Llama 4's `get_best_fit` is the same rule (its module needs
    torchvision)."""
    from transformers.models.mllama.image_processing_pil_mllama import get_optimal_tiled_canvas

    for h, w in SIZES:
        rows, columns = best_canvas(h, w, 560, 4)
        assert (rows * 560, columns * 560) == tuple(get_optimal_tiled_canvas(h, w, 4, 560))


def test_pixtral_longest_edge() -> None:
    import numpy as np
    from transformers.models.pixtral.image_processing_pil_pixtral import (
        get_resize_output_image_size,
    )

    ours = Processor(kind=ProcessorKind.PIXTRAL, patch=14, merge=2, size=1540)
    for h, w in SIZES[:40]:
        image = np.zeros((h, w, 3), dtype=np.uint8)
        rh, rw = get_resize_output_image_size(image, size=1540, patch_size=28)
        got = image_tokens(ours, h, w)
        assert (got.height, got.width) == (rh, rw), (h, w)


def test_gemma3_pan_and_scan() -> None:
    import numpy as np
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    hf = Gemma3ImageProcessorPil()
    ours = Processor(kind=ProcessorKind.FIXED, patch=14, size=896, tokens=256, can_crop=True)
    for h, w in SIZES[:40]:
        crops = hf.pan_and_scan(np.zeros((3, h, w), dtype=np.uint8), 256, 4, 1.2)
        assert image_tokens(ours, h, w, crop=True).tiles == 1 + len(crops), (h, w)
