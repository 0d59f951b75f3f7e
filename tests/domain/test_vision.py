"""Vision-language inputs (issue 22): image tokens per the processor, the tower's activations,
the knobs on every surface, and the stacks' defaults.

Golden figures are the processor's (transformers 5.24.0, `tests/trace/test_vision_tokens.py`
checks the port on random sizes) and the closed form's, itself held to the trace in
`benchmarks/trace_grid_vlm.py`.
"""

from __future__ import annotations

import pytest

import vram
from vram.errors import VramError
from vram.io.knobs import knob_for
from vram.model.processor import Processor, ProcessorKind, image_tokens, smart_resize
from vram.setup import TrainingSetup

FAMILIES = "tests/data/families"
ISSUE = {"method": "lora", "images_per_sample": 2, "image_height": 1080, "image_width": 1920,
         "max_pixels": 1_003_520, "seq_len": 4096, "precision": "bf16-true"}


def _est(model: str, **fields: object) -> vram.Estimate:
    return vram.estimate(vram.load_model(model), TrainingSetup.model_validate(fields))


def test_the_issue_target_two_1080p_images_at_max_pixels_1003520() -> None:
    """Issue 22's target: Qwen2.5-VL-7B, LoRA, 2 images of 1080x1920 at max_pixels
    1,003,520: 1,222 tokens per image (728x1316, 52x94 patches: the processor's own figure,
    docs/vlm-tokens.md), and the vision tower's share of the peak's activations."""
    est = _est("qwen2.5-vl-7b", **ISSUE)
    vision = est.vision
    assert vision is not None
    assert (vision.resized_height, vision.resized_width) == (728, 1316)
    assert vision.tower_tokens_per_image == 4888
    assert vision.tokens_per_image == 1222
    assert vision.image_tokens_per_sample == 2444
    assert vision.text_tokens_per_sample == 4096 - 2444
    # PEFT's all-linear adapts the tower and the merger too: what the trace counts
    assert est.params.trainable == 51_824_640
    # the tower's and merger's kept tensors, and the pixel values, at the peak (the loss)
    assert vision.vision_activation_bytes == 28_152_377_344
    assert est.bucket_bytes["activations"] == 77_147_353_088
    keys = {item.key for item in est.bucket("activations").items}
    assert {"activations.vision_window", "activations.vision_full",
            "activations.vision_projector", "activations.vision.pixels"} <= keys


def test_llama_factory_freezes_the_tower_and_resizes_before_the_processor() -> None:
    """LLaMA-Factory's defaults: the tower and projector frozen (no adapters, nothing kept
    but the pixels), and each image scaled to image_max_pixels before the processor, which
    then rounds each side to 28 px: 1080x1920 -> 576x1024 -> 588x1036, 777 tokens; the
    processor bounded by 589,824 itself gives 560x1008, 720."""
    lf = _est("qwen2.5-vl-7b", **{**ISSUE, "framework": "llama-factory", "max_pixels": 589_824})
    hf = _est("qwen2.5-vl-7b", **{**ISSUE, "max_pixels": 589_824})
    assert lf.vision is not None and hf.vision is not None
    assert (lf.vision.resized_height, lf.vision.resized_width, lf.vision.tokens_per_image) == (
        588, 1036, 777)
    assert (hf.vision.resized_height, hf.vision.resized_width, hf.vision.tokens_per_image) == (
        560, 1008, 720)
    assert lf.params.trainable == 40_370_176  # the language model's adapters only
    # pixel values only: 2 images x 42x74 patches x 3·2·14·14 values x 4 B
    assert lf.vision.vision_activation_bytes == 2 * (42 * 74) * 1176 * 4
    assert not any(item.key.startswith("activations.vision_") for item in
                   lf.bucket("activations").items)


def test_images_are_part_of_seq_len_and_must_fit() -> None:
    with pytest.raises(VramError, match=r"^seq_len: 2 image\(s\) x 1,222 tokens = 2,444 image "
                                        r"tokens do not fit in 2,048"):
        _est("qwen2.5-vl-7b", **{**ISSUE, "seq_len": 2048})


def test_a_text_model_takes_no_images() -> None:
    with pytest.raises(VramError, match=r"^images_per_sample: .* is not a vision-language model"):
        _est("llama-3.2-1b", images_per_sample=1)


def test_video_only_where_the_processor_takes_it() -> None:
    with pytest.raises(VramError, match=r"^video_frames: "):
        _est(f"{FAMILIES}/llava.json", video_frames=8)
    est = _est("qwen2.5-vl-7b", method="lora", video_frames=16, seq_len=8192)
    assert est.vision is not None
    # 16 frames, 8 temporal patches, each (square) frame bounded by the video processor's
    # 768·28·28 = 602,112 pixels: 756x756, 27x27 merged tokens per temporal patch
    assert est.vision.video_tokens == 8 * 27 * 27


def test_no_images_changes_nothing() -> None:
    """The new knobs at their defaults: a VLM's estimate has no vision figures, and a text
    model's is what it was (the snapshot lock holds every figure)."""
    assert _est("qwen2.5-vl-7b", method="lora").vision is None
    base = _est("llama-3.2-1b", method="lora")
    assert base.vision is None


def test_a_trained_tower_keeps_more_than_a_frozen_one() -> None:
    full = _est("qwen2.5-vl-7b", **{**ISSUE, "method": "full"})
    frozen = _est("qwen2.5-vl-7b", **{**ISSUE, "method": "full", "freeze_vision": True})
    assert full.vision is not None and frozen.vision is not None
    assert full.vision.vision_activation_bytes > 10 * frozen.vision.vision_activation_bytes
    assert full.params.trainable - frozen.params.trainable == (
        vram.load_model("qwen2.5-vl-7b").vision_params
        + vram.load_model("qwen2.5-vl-7b").projector_params)


def test_qlora_quantizes_the_tower_linears() -> None:
    est = _est("qwen2.5-vl-7b", **{**ISSUE, "method": "qlora"})
    weights = {item.key: item for item in est.bucket("weights").items}
    assert weights["weights.vision_linears"].inputs["storage"] == "nf4"
    assert "weights.vision" in weights  # norms, the patch embedding, biases: not quantized



#: The two Qwen3-VL rows of benchmarks/trace_grid_vlm.txt that once missed the trace.
QWEN3_VL_ROWS = {
    "full": {"method": "full", "precision": "bf16-true"},
    "qlora": {"method": "qlora", "precision": "bf16-mixed", "lora_targets": "all-linear",
              "freeze_vision": True},
}


@pytest.mark.parametrize(("row", "per_token"), [("full", 6), ("qlora", 4)])
def test_qwen3_vl_language_model_keeps_its_q_and_k_norms(row: str, per_token: int) -> None:
    """Qwen3-VL's text attention norms q and k per head (Qwen3VLTextAttention q_norm/k_norm,
    transformers 5.24.0 modeling_qwen3_vl.py L496-499, L513-514); each RMSNorm keeps its fp32
    input, and with its weight trained the normalized bf16 copy (Qwen3VLTextRMSNorm.forward
    L432-437): 4·(q + kv) + 2·(q + kv) a token under full bf16-true, 4·(q + kv) with the norms
    frozen. Qwen3-VL-4B: q = 32·128, kv = 8·128, 36 layers, 4,096 tokens. Without the term the
    grid's rows were -12.3 % (full) and -6.6 % (QLoRA) of the traced activations."""
    est = _est("qwen3-vl-4b", images_per_sample=1, image_height=1024, image_width=1024,
               seq_len=4096, framework="hf-trainer", **QWEN3_VL_ROWS[row])
    items = {item.key: item.bytes for item in est.bucket("activations").items}
    q, kv = 32 * 128, 8 * 128
    assert items["activations.decoder.qk_norm"] == 4096 * 36 * per_token * (q + kv)

@pytest.mark.parametrize(("model", "size", "tokens", "tiles"), [
    ("gemma-3-4b", (1080, 1920), 256, 1),  # fixed 256, pan & scan off by default
    ("paligemma2-3b-pt-448", (1080, 1920), 1024, 1),
    (f"{FAMILIES}/llava.json", (1080, 1920), 576, 1),
    (f"{FAMILIES}/internvl.json", (1080, 1920), 256 * 9, 9),  # 2x4 tiles + a thumbnail
    (f"{FAMILIES}/mllama.json", (1080, 1920), 1, 4),  # one <|image|>; 4 padded tiles
])
def test_each_processor_rule(model: str, size: tuple[int, int], tokens: int, tiles: int) -> None:
    est = _est(model, method="lora", images_per_sample=1, image_height=size[0],
               image_width=size[1], seq_len=4096)
    assert est.vision is not None
    assert (est.vision.tokens_per_image, est.vision.tiles_per_image) == (tokens, tiles)


def test_gemma3_pan_and_scan_crops_an_elongated_image() -> None:
    """1080x1920: round(1920/1080) = 2 crops of 960 px, each another 256-token image."""
    est = _est("gemma-3-4b", method="lora", images_per_sample=1, image_height=1080,
               image_width=1920, crop_images=True, seq_len=4096)
    assert est.vision is not None
    assert (est.vision.tiles_per_image, est.vision.tokens_per_image) == (3, 768)


def test_smart_resize_and_qwen_tokens() -> None:
    """The handoff's doctest, and the research table (docs/vlm-tokens.md)."""
    qwen = Processor(kind=ProcessorKind.QWEN, patch=14, merge=2, min_pixels=3136,
                     max_pixels=12_845_056)
    assert smart_resize(1080, 1920, 28, 3136, 1_003_520) == (728, 1316)
    for (h, w), tokens in {(1024, 1024): 1225, (720, 1280): 1196, (3024, 4032): 1230,
                           (448, 448): 256}.items():
        assert image_tokens(qwen, h, w, max_pixels=1_003_520).lm_tokens == tokens
    assert image_tokens(qwen, 1080, 1920).lm_tokens == 2691  # the checkpoint's 12,845,056


def test_the_knobs_have_every_surface() -> None:
    for name, flag, key in (("images_per_sample", "--images", "img"),
                            ("max_pixels", "--max-pixels", "maxpx"),
                            ("video_frames", "--video-frames", "vframes"),
                            ("freeze_vision", "--freeze-vision", "vfreeze")):
        knob = knob_for(name)
        assert (knob.flag, knob.key, knob.meta.vlm_only) == (flag, key, True)
    assert knob_for("max_pixels").parse("") is None  # empty: the stack's default
    with pytest.raises(ValueError, match="image_width"):
        TrainingSetup(image_height=1080)
