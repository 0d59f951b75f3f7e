"""Vision towers and projectors of the vision-language families: their parameters.

Each function mirrors one transformers module (transformers/models/<type>/modeling_<type>.py
@v5.24.0) and returns (tower, projector) parameter counts; the totals equal
`model.num_parameters()` of the image-text-to-text class (`tests/domain/test_family_defaults.py`).
"""

from __future__ import annotations

from vram.model.config_reader import ConfigReader


def _vit_layer(h: int, inter: int, *, qkv_bias: bool = True, gated: bool = False,
               norms: int = 2, norm_bias: bool = True) -> int:
    """One pre-norm ViT block: q, k, v, o (biased or not), an MLP, `norms` norms."""
    attention = 4 * h * h + (4 * h if qkv_bias else 0)
    ffn = 3 * h * inter if gated else 2 * h * inter + inter + h
    return attention + ffn + norms * h * (2 if norm_bias else 1)


def _image(v: ConfigReader) -> tuple[int, int, int]:
    """(image size, patch size, channels); InternVL writes sizes as [h, w] pairs."""
    image, patch = v.config.get("image_size"), v.config.get("patch_size")
    image = image[0] if isinstance(image, list) else image
    patch = patch[0] if isinstance(patch, list) else patch
    r = ConfigReader({"image_size": image, "patch_size": patch})
    return (r.int("image_size"), r.int("patch_size"),
            v.int("num_channels", "in_channels", "in_chans", default=3))


def siglip(v: ConfigReader) -> int:
    """SiglipVisionTransformer (Gemma 3, PaliGemma; the head when `vision_use_head`)."""
    h, inter, n = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_hidden_layers")
    image, patch, c = _image(v)
    total = c * patch * patch * h + h + (image // patch) ** 2 * h
    total += n * _vit_layer(h, inter) + 2 * h
    if v.bool("vision_use_head", True):  # SiglipMultiheadAttentionPoolingHead
        total += h + 4 * h * h + 4 * h + 2 * h + 2 * h * inter + inter + h
    return total


def clip(v: ConfigReader) -> int:
    """CLIPVisionTransformer (LLaVA): a class token, pre- and post-LayerNorms."""
    h, inter, n = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_hidden_layers")
    image, patch, c = _image(v)
    positions = (image // patch) ** 2 + 1
    return h + c * patch * patch * h + positions * h + 4 * h + n * _vit_layer(h, inter)


def qwen2_5_vl(v: ConfigReader) -> tuple[int, int]:
    """Qwen2_5_VisionTransformerPretrainedModel: a bias-free Conv3d patch embedding, RMSNorm
    blocks with a fused biased qkv and a gated biased MLP; the merger (RMSNorm, 4h -> 4h ->
    out)."""
    h, inter, n = v.int("hidden_size"), v.int("intermediate_size"), v.int("depth")
    patch, t = v.int("patch_size"), v.int("temporal_patch_size")
    c = v.int("in_chans", "in_channels", default=3)
    block = 2 * h + 4 * h * h + 4 * h + 3 * h * inter + 2 * inter + h
    wide = h * v.int("spatial_merge_size") ** 2
    out = v.int("out_hidden_size")
    return c * t * patch * patch * h + n * block, h + wide * wide + wide + wide * out + out


def qwen3_vl(v: ConfigReader) -> tuple[int, int]:
    """Qwen3VLVisionModel (also Qwen3.5's): a biased Conv3d, learned positions, LayerNorm
    blocks with a plain biased MLP; the merger and one `deepstack_merger_list` entry per
    `deepstack_visual_indexes` entry (the latter normed over 4h)."""
    h, inter, n = v.int("hidden_size"), v.int("intermediate_size"), v.int("depth")
    patch, t = v.int("patch_size"), v.int("temporal_patch_size")
    c = v.int("in_channels", default=3)
    tower = c * t * patch * patch * h + h + v.int("num_position_embeddings") * h
    tower += n * _vit_layer(h, inter)
    wide = h * v.int("spatial_merge_size") ** 2
    out = v.int("out_hidden_size")
    fcs = wide * wide + wide + wide * out + out
    deep = len(v.config.get("deepstack_visual_indexes") or [])
    return tower, 2 * h + fcs + deep * (2 * wide + fcs)


def internvit(v: ConfigReader) -> int:
    """InternVLVisionModel: class token, positions, biased patch conv; blocks with layer-scale
    vectors (`lambda_1`, `lambda_2`), q/k/v biased per `attention_bias`, a biased output, and
    full-width q/k RMSNorms per `use_qk_norm` (InternViT-6B; modeling_internvl.py@v5.24.0
    InternVLVisionAttention `q_norm`, `k_norm`)."""
    h, inter, n = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_hidden_layers")
    image, patch, c = _image(v)
    bias = v.bool("attention_bias", False)
    norm = 2 * h if v.str("norm_type", "layer_norm") == "layer_norm" else h
    qk_norms = 2 * h if v.bool("use_qk_norm", False) else 0
    block = 2 * h + 3 * h * h + (3 * h if bias else 0) + h * h + h + 2 * h * inter + inter + h
    block += qk_norms
    total = h + ((image // patch) ** 2 + 1) * h + c * patch * patch * h + h
    total += n * (block + 2 * norm)
    return total + (0 if v.bool("use_mean_pooling", True) else norm)


def pixtral(v: ConfigReader) -> int:
    """PixtralVisionModel (Mistral 3): bias-free patch conv and RMSNorm blocks, gated MLP."""
    h, inter, n = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_hidden_layers")
    _, patch, c = _image(v)
    return c * patch * patch * h + h + n * _vit_layer(h, inter, qkv_bias=False, gated=True,
                                                        norm_bias=False)


def llama4(v: ConfigReader) -> int:
    """Llama4VisionModel: class token, positions, a bias-free patch Linear, pre/post
    LayerNorms, biased blocks, and the pixel-shuffle MLP (`Llama4VisionMLP2`: intermediate ->
    projector_input_dim -> projector_output_dim, no biases)."""
    h, inter, n = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_hidden_layers")
    image, patch, c = _image(v)
    adapter = inter * v.int("projector_input_dim") + v.int("projector_output_dim") ** 2
    return (h + ((image // patch) ** 2 + 1) * h + c * patch * patch * h + 4 * h
            + n * _vit_layer(h, inter) + adapter)


def _aspect_ratios(v: ConfigReader, tiles: int) -> int:
    """MllamaVisionConfig.supported_aspect_ratios, by default every (w, h) with w·h <= tiles
    (mllama/image_processing_mllama.py get_all_supported_aspect_ratios)."""
    given = v.config.get("supported_aspect_ratios")
    if isinstance(given, list) and given:
        return len(given)
    return sum(1 for w in range(1, tiles + 1) for hh in range(1, tiles + 1) if w * hh <= tiles)


def mllama(v: ConfigReader) -> int:
    """MllamaVisionModel: gated positional and tile embeddings (one row per aspect ratio, plus
    the padding row), a local and a gated global transformer (bias-free q/k/v/o)."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    image, patch, c = _image(v)
    tiles = v.int("max_num_tiles")
    rows = _aspect_ratios(v, tiles) + 1
    positions = (image // patch) ** 2 + 1
    layer = _vit_layer(h, inter, qkv_bias=False)
    embeddings = h + c * patch * patch * h + 1 + positions * h + rows * tiles * positions * h
    embeddings += 2 * (1 + rows * tiles * h)  # pre- and post-tile gated embeddings
    return (embeddings + 4 * h + v.int("num_hidden_layers") * layer
            + v.int("num_global_layers") * (layer + 2))


def idefics3(v: ConfigReader) -> int:
    """Idefics3VisionTransformer: SigLIP's embeddings and blocks, a post-LayerNorm, no head."""
    h, inter, n = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_hidden_layers")
    image, patch, c = _image(v)
    return c * patch * patch * h + h + (image // patch) ** 2 * h + n * _vit_layer(h, inter) + 2 * h
