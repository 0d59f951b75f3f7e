"""How a vision-language model's processor turns an image into tokens (no torch).

Each rule is ported from the processor's source in transformers 5.24.0
(`transformers/models/<type>/...`) and checked against those classes on random sizes
(`tests/trace/test_vision_tokens.py`). A `Processor` describes one checkpoint's processor (its
family reads it from the config); `image_tokens` applies it to one image.

    >>> qwen = Processor(kind="qwen", patch=14, merge=2, min_pixels=3136, max_pixels=12845056)
    >>> image_tokens(qwen, 1080, 1920, max_pixels=1_003_520)
    ImageTokens(height=728, width=1316, tiles=1, tower_tokens=4888, lm_tokens=1222)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from pydantic import BaseModel, ConfigDict

#: `smart_resize` refuses images more elongated than this (qwen2_vl/image_processing_qwen2_vl.py).
MAX_ASPECT_RATIO = 200
#: Idefics3's image processor never resizes beyond this side (idefics3/image_processing_
#: idefics3.py@v5.24.0 MAX_IMAGE_SIZE).
IDEFICS3_MAX_SIDE = 4096


class ProcessorKind(StrEnum):
    """The rule a processor follows; each is one function below."""

    #: Qwen2-VL / 2.5-VL / 3-VL / 3.5: `smart_resize` between min and max pixels.
    QWEN = "qwen"
    #: One image resized to a fixed square (LLaVA, PaliGemma, Gemma 3 with pan & scan crops).
    FIXED = "fixed"
    #: InternVL: tiles of the closest aspect ratio, and a thumbnail.
    CLOSEST_TILES = "closest tiles"
    #: Idefics3 / SmolVLM: the longest edge resized, then split into tiles, and a global image.
    SPLIT = "split"
    #: Llama 3.2 Vision (mllama): the best-fit canvas of tiles, padded to the most tiles.
    MLLAMA = "mllama"
    #: Llama 4: the best-fit canvas of tiles, and a global tile.
    CANVAS = "canvas"
    #: Pixtral (Mistral 3): the longest edge capped, patches merged 2x2.
    PIXTRAL = "pixtral"


class Processor(BaseModel):
    """One checkpoint's image processor, as the rule for its kind reads it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ProcessorKind
    #: The vision tower's patch side in pixels.
    patch: int
    #: Patches merged per side into one language-model token (Qwen's spatial merge, a pixel
    #: shuffle's 1/ratio, Pixtral's patch merger); 1: none.
    merge: int = 1
    #: The side of the fixed image, of one tile, or (Pixtral) the longest edge kept.
    size: int = 0
    #: Language-model tokens of one image or tile, where the rule fixes them (0: from patches).
    tokens: int = 0
    #: Vision-tower tokens per image or tile beyond its patches (a class token), and the
    #: tile's padding to a multiple (mllama pads 1,601 to 1,608).
    extra_tower_tokens: int = 0
    pad_tower_tokens_to: int = 1
    #: The most tiles of one image (InternVL 12, Idefics3 from its longest edge, mllama 4).
    max_tiles: int = 1
    #: Idefics3: the longest edge an image is resized to before splitting.
    longest_edge: int = 0
    #: Qwen: the checkpoint processor's pixel bounds (its preprocessor_config.json).
    min_pixels: int = 0
    max_pixels: int = 0
    #: Qwen video: frames per temporal patch, per-frame pixel bounds, and whether the bound
    #: is the whole clip's (Qwen3-VL) rather than each frame's (Qwen2/2.5-VL). 0: no video.
    temporal_patch: int = 1
    video_min_pixels: int = 0
    video_max_pixels: int = 0
    video_bound_is_clip: bool = False
    #: The rule can cut an image into crops or tiles (Gemma 3's pan & scan, InternVL's
    #: crop_to_patches, Idefics3's splitting), and does unless told otherwise.
    can_crop: bool = False
    crops_by_default: bool = False

    @property
    def takes_video(self) -> bool:
        return self.video_max_pixels > 0

    @property
    def has_pixel_bounds(self) -> bool:
        """The rule reads min/max pixels (the `max_pixels` and `min_pixels` knobs)."""
        return self.kind is ProcessorKind.QWEN


@dataclass(frozen=True, slots=True)
class ImageTokens:
    """One image (or one video) after the processor.

    `height` x `width` is the resized image (one tile's size for tiled rules); the vision tower
    runs `tiles` sequences of `tower_tokens` each; the language model's sequence holds
    `lm_tokens` placeholder tokens for it (markers such as `<|vision_start|>` are text).
    """

    height: int
    width: int
    tiles: int
    tower_tokens: int
    lm_tokens: int


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """Each side rounded to a multiple of `factor`, the area brought within the bounds
    (transformers/models/qwen2_vl/image_processing_qwen2_vl.py@v5.24.0 `smart_resize`)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"image: aspect ratio must be smaller than {MAX_ASPECT_RATIO}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _qwen(p: Processor, height: int, width: int, min_pixels: int,
          max_pixels: int) -> ImageTokens:
    """`grid_thw.prod() // merge**2` LM tokens (qwen2_5_vl/processing_qwen2_5_vl.py@v5.24.0);
    the tower sees every patch (one temporal patch: the image repeated)."""
    h, w = smart_resize(height, width, p.patch * p.merge, min_pixels, max_pixels)
    patches = (h // p.patch) * (w // p.patch)
    return ImageTokens(h, w, 1, patches, patches // (p.merge * p.merge))


def _gemma3_crops(height: int, width: int) -> int:
    """Gemma 3's pan & scan (gemma3/image_processing_gemma3.py@v5.24.0 `pan_and_scan_batched`,
    the processor's defaults in processing_gemma3.py: min crop 256, at most 4 crops, from an
    aspect ratio of 1.2): how many crops join the image."""
    min_crop, max_crops, min_ratio = 256, 4, 1.2
    long, short = max(height, width), min(height, width)
    if long / short < min_ratio:
        return 0
    crops = min(math.floor(long / min_crop), math.floor(long / short + 0.5))
    crops = min(max_crops, max(2, crops))
    crop_long, crop_short = math.ceil(long / crops), short
    if min(crop_long, crop_short) < min_crop:
        return 0
    return crops


def _fixed(p: Processor, height: int, width: int, crop: bool) -> ImageTokens:
    """One image resized to `size` x `size` (LLaVA, PaliGemma, Gemma 3): a fixed number of
    LM tokens; Gemma 3's pan & scan adds crops, each another image (processing_gemma3.py)."""
    tiles = 1 + (_gemma3_crops(height, width) if crop else 0)
    patches = (p.size // p.patch) ** 2
    return ImageTokens(p.size, p.size, tiles, patches + p.extra_tower_tokens, p.tokens * tiles)


@lru_cache(maxsize=256)
def _closest_grid(height: int, width: int, tile: int, max_tiles: int) -> tuple[int, int]:
    """InternVL's canvas: the (columns, rows) of 1..max_tiles tiles whose aspect ratio is
    closest to the image's; on a tie, more tiles while the image covers over half of them
    (got_ocr2/image_processing_got_ocr2.py@v5.24.0 `get_optimal_tiled_canvas`)."""
    grids = sorted(((w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1)
                    if w * h <= max_tiles), key=lambda g: g[0] * g[1])
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for grid in grids:
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best, best_diff = grid, diff
        elif diff == best_diff and area > 0.5 * tile * tile * grid[0] * grid[1]:
            best = grid
    return best


def _closest_tiles(p: Processor, height: int, width: int, crop: bool) -> ImageTokens:
    """InternVL: `crop_to_patches` (on in InternVLProcessor's defaults) cuts the image into the
    closest grid of `size` tiles, plus a thumbnail when there is more than one; each tile is
    `image_seq_length` LM tokens (internvl/processing_internvl.py@v5.24.0)."""
    columns, rows = _closest_grid(height, width, p.size, p.max_tiles) if crop else (1, 1)
    tiles = columns * rows + (1 if columns * rows > 1 else 0)
    patches = (p.size // p.patch) ** 2
    return ImageTokens(p.size, p.size, tiles, patches + p.extra_tower_tokens, p.tokens * tiles)


def _rescale_to_longest(height: int, width: int, longest: int) -> tuple[int, int]:
    """Idefics3: the longest edge set to `longest`, the other kept in proportion and made even,
    then both capped at 4,096 (image_processing_idefics3.py@v5.24.0
    `_resize_output_size_rescale_to_max_len`, `_resize_output_size_scale_below_upper_bound`)."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > IDEFICS3_MAX_SIDE:
        width, height = IDEFICS3_MAX_SIDE, int(IDEFICS3_MAX_SIDE / aspect)
    elif height > width and height > IDEFICS3_MAX_SIDE:
        height, width = IDEFICS3_MAX_SIDE, int(IDEFICS3_MAX_SIDE * aspect)
    return max(height, 1), max(width, 1)


def _split(p: Processor, height: int, width: int, crop: bool) -> ImageTokens:
    """Idefics3 / SmolVLM: resized to the longest edge, split into ceil(h/size) x ceil(w/size)
    tiles plus the global image when larger than one tile; each is `image_seq_len` LM tokens
    (idefics3/image_processing_idefics3.py@v5.24.0 `get_number_of_image_patches`,
    processing_idefics3.py); without splitting, one image squared to `size`."""
    h, w = _rescale_to_longest(height, width, p.longest_edge)
    rows, columns = math.ceil(h / p.size), math.ceil(w / p.size)
    tiles = rows * columns + 1 if rows * columns > 1 and crop else 1
    patches = (p.size // p.patch) ** 2
    return ImageTokens(p.size, p.size, tiles, patches + p.extra_tower_tokens, p.tokens * tiles)


@lru_cache(maxsize=256)
def best_canvas(height: int, width: int, tile: int, max_tiles: int) -> tuple[int, int]:
    """The (rows, columns) of tiles an image is resized into without distortion: the smallest
    upscale, else the least downscale; on a tie the smaller area
    (mllama/image_processing_mllama.py@v5.24.0 `get_optimal_tiled_canvas`;
    llama4/image_processing_llama4.py@v5.24.0 `get_best_fit`, the same rule)."""
    grids = [(h, w) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1)
             if w * h <= max_tiles]
    scales = [min(h * tile / height, w * tile / width) for h, w in grids]
    up = [s for s in scales if s >= 1]
    chosen = min(up) if up else max(scales)
    candidates = [g for g, s in zip(grids, scales, strict=True) if s == chosen]
    return min(candidates, key=lambda g: g[0] * g[1])


def _mllama(p: Processor, height: int, width: int, crop: bool) -> ImageTokens:
    """Llama 3.2 Vision: the image is one `<|image|>` token in the text; its tiles are padded
    to `max_image_tiles`, and the tower runs every tile (mllama/image_processing_mllama.py
    `pad_batches_and_tiles`; modeling_mllama.py MllamaVisionModel pads each tile's 1,601
    tokens to a multiple of 8)."""
    del height, width, crop  # the tower runs every padded tile, whatever the canvas
    tokens = (p.size // p.patch) ** 2 + p.extra_tower_tokens
    tokens = -(-tokens // p.pad_tower_tokens_to) * p.pad_tower_tokens_to
    return ImageTokens(p.size, p.size, p.max_tiles, tokens, p.tokens)


def _canvas(p: Processor, height: int, width: int, crop: bool) -> ImageTokens:
    """Llama 4: the best-fit canvas of `size` tiles, plus a global tile when there is more than
    one; each tile is (size/patch)² / merge² LM tokens (llama4/processing_llama4.py@v5.24.0
    `_prompt_split_image`)."""
    del crop
    rows, columns = best_canvas(height, width, p.size, p.max_tiles)
    tiles = rows * columns + (1 if rows * columns > 1 else 0)
    patches = (p.size // p.patch) ** 2
    return ImageTokens(p.size, p.size, tiles, patches + p.extra_tower_tokens,
                       tiles * patches // (p.merge * p.merge))


def _pixtral(p: Processor, height: int, width: int, crop: bool) -> ImageTokens:
    """Pixtral (Mistral 3): the longest edge capped at `size`, each side rounded up to whole
    merged patches; the LM holds one token per merged patch (its `[IMG_BREAK]` row ends are
    text) (pixtral/image_processing_pixtral.py@v5.24.0 `get_resize_output_image_size`,
    pixtral/processing_pixtral.py: patch_size x spatial_merge_size)."""
    del crop
    ratio = max(height / p.size, width / p.size)
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    step = p.patch * p.merge
    h, w = ((height - 1) // step + 1) * step, ((width - 1) // step + 1) * step
    patches = (h // p.patch) * (w // p.patch)
    return ImageTokens(h, w, 1, patches, patches // (p.merge * p.merge))


def image_tokens(p: Processor, height: int, width: int, *, min_pixels: int | None = None,
                 max_pixels: int | None = None, crop: bool | None = None) -> ImageTokens:
    """One image of `height` x `width` pixels through the processor `p` (Qwen's pixel bounds:
    the given ones, else the processor's; cropping: as asked where the rule can, else the
    processor's own)."""
    if p.kind is ProcessorKind.QWEN:
        return _qwen(p, height, width, min_pixels or p.min_pixels, max_pixels or p.max_pixels)
    rule = {ProcessorKind.FIXED: _fixed, ProcessorKind.CLOSEST_TILES: _closest_tiles,
            ProcessorKind.SPLIT: _split, ProcessorKind.MLLAMA: _mllama,
            ProcessorKind.CANVAS: _canvas, ProcessorKind.PIXTRAL: _pixtral}[p.kind]
    crops = p.crops_by_default if crop is None or not p.can_crop else crop
    return rule(p, height, width, crops)


def largest_side(p: Processor, max_pixels: int | None = None) -> int:
    """The side of the square image the estimate assumes when no size is given: the largest
    the processor keeps whole (Qwen: √max_pixels; a tiled rule: enough for every tile)."""
    if p.kind is ProcessorKind.QWEN:
        return max(1, math.isqrt(max_pixels or p.max_pixels))
    if p.kind is ProcessorKind.SPLIT:
        return p.longest_edge
    if p.kind in (ProcessorKind.CLOSEST_TILES, ProcessorKind.MLLAMA, ProcessorKind.CANVAS):
        return p.size * p.max_tiles
    return p.size


def video_tokens(p: Processor, frames: int, height: int, width: int, *,
                 min_pixels: int | None = None, max_pixels: int | None = None) -> ImageTokens:
    """One video of `frames` sampled frames: frames padded to whole temporal patches (the last
    repeated), each frame resized by `smart_resize` with the video bounds, per frame (Qwen2 /
    2.5-VL: qwen2_vl/video_processing_qwen2_vl.py@v5.24.0) or over the clip (Qwen3-VL:
    qwen3_vl/video_processing_qwen3_vl.py@v5.24.0 `smart_resize(num_frames, ...)`);
    `(t/temporal) x (h/p) x (w/p) / merge²` LM tokens."""
    low, high = min_pixels or p.video_min_pixels, max_pixels or p.video_max_pixels
    step = p.patch * p.merge
    t = -(-frames // p.temporal_patch) * p.temporal_patch
    if p.video_bound_is_clip:
        h, w = _clip_resize(frames, height, width, step, p.temporal_patch, low, high)
    else:
        h, w = smart_resize(height, width, step, low, high)
    patches = (t // p.temporal_patch) * (h // p.patch) * (w // p.patch)
    return ImageTokens(h, w, 1, patches, patches // (p.merge * p.merge))


def _clip_resize(frames: int, height: int, width: int, factor: int, temporal: int,
                 min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen3-VL's video `smart_resize`: the bounds hold for frames x height x width
    (qwen3_vl/video_processing_qwen3_vl.py@v5.24.0)."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"image: aspect ratio must be smaller than {MAX_ASPECT_RATIO}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
