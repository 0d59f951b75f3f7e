"""The structure of each vision-language type's tower, projector and processor (issue 22).

`vision.py` counts the parameters; this module says what a training step runs on an image:
the tower's blocks as `LayerStack`s (bidirectional, over one image, tile or window), the
projector's Linears and the processor's rule (`vram.model.processor`). Each builder names the
transformers 5.24.0 modules it mirrors (transformers/models/<type>/modeling_<type>.py) and the
processor defaults it reads: the checkpoint's `preprocessor_config.json` where the Hub copy is
cited, else the processor class's own.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from vram.model.config_reader import ConfigReader
from vram.model.families.base import act_saved
from vram.model.processor import Processor, ProcessorKind
from vram.model.spec import LayerStack, Linear, Mixer, MlpKind, NormKind, Role, VisionSpec

#: Qwen2.5-VL checkpoints' preprocessor_config.json (Qwen/Qwen2.5-VL-7B-Instruct@main:
#: min_pixels 3136, max_pixels 12845056); the video processor's class defaults
#: (qwen2_vl/video_processing_qwen2_vl.py@v5.24.0: 128·28·28 to 768·28·28 per frame).
QWEN2_5_PIXELS = (3136, 12_845_056)
QWEN2_5_VIDEO_PIXELS = (128 * 28 * 28, 768 * 28 * 28)
#: Qwen3-VL checkpoints' preprocessor_config.json (Qwen/Qwen3-VL-4B-Instruct@main: size
#: shortest_edge 65536, longest_edge 16777216); the video processor's class defaults over the
#: whole clip (qwen3_vl/video_processing_qwen3_vl.py@v5.24.0: 128·32·32 to 768·32·32).
QWEN3_PIXELS = (65_536, 16_777_216)
QWEN3_VIDEO_PIXELS = (128 * 32 * 32, 768 * 32 * 32)


def _block(name: str, count: int, linears: tuple[Linear, ...], *, h: int, heads: int,
           inter: int, mlp: MlpKind, norm: NormKind, act: int = 1, extra: int = 0,
           qk_norm: bool = False) -> LayerStack:
    """One stack of tower blocks: pre-norm attention and MLP, two norms, no causal mask; a
    fused `qkv` is split into views (`LayerStack.qkv_view_kept`), and Qwen's blocks attend per
    image or window and concatenate (`attention_output_copied`)."""
    norm_params = 2 * h * (2 if norm is NormKind.LAYER else 1)
    fused = any(ln.role is Role.QKV for ln in linears)  # Qwen's blocks, which also chunk
    return LayerStack(
        name=name, count=count, linears=linears, other_params=norm_params + extra, n_norms=2,
        norm_kind=norm, n_heads=heads, n_kv_heads=heads, head_dim=h // heads, mlp_kind=mlp,
        intermediate_size=inter, causal=False, act_saved=act,
        qkv_view_kept=fused, attention_output_copied=fused, qk_norm=qk_norm)


def _qkvo(h: int, names: tuple[str, str, str, str], bias: bool, o_bias: bool,
          ) -> tuple[Linear, ...]:
    q, k, v, o = names
    return (Linear(name=q, role=Role.Q, d_in=h, d_out=h, bias=bias),
            Linear(name=k, role=Role.K, d_in=h, d_out=h, bias=bias),
            Linear(name=v, role=Role.V, d_in=h, d_out=h, bias=bias),
            Linear(name=o, role=Role.O, d_in=h, d_out=h, bias=o_bias))


def _plain(h: int, inter: int, names: tuple[str, str] = ("fc1", "fc2")) -> tuple[Linear, ...]:
    return (Linear(name=names[0], role=Role.UP, d_in=h, d_out=inter, bias=True),
            Linear(name=names[1], role=Role.DOWN, d_in=inter, d_out=h, bias=True))


def _gated(h: int, inter: int, bias: bool) -> tuple[Linear, ...]:
    return (Linear(name="gate_proj", role=Role.GATE, d_in=h, d_out=inter, bias=bias),
            Linear(name="up_proj", role=Role.UP, d_in=h, d_out=inter, bias=bias),
            Linear(name="down_proj", role=Role.DOWN, d_in=inter, d_out=h, bias=bias))


def _mlp2(d_in: int, mid: int, out: int, bias: bool = True,
          names: tuple[str, str] = ("linear_1", "linear_2")) -> tuple[Linear, ...]:
    """A projector's two Linears around a GELU."""
    return (Linear(name=names[0], role=Role.UP, d_in=d_in, d_out=mid, bias=bias),
            Linear(name=names[1], role=Role.DOWN, d_in=mid, d_out=out, bias=bias))


def _projector(linears: tuple[Linear, ...], *, norm: NormKind | None = None,
               act_width: int = 0, count: int = 1) -> LayerStack:
    """The projector as one layer without attention: a norm over each image token's values
    (or none), its Linears, a GELU of `act_width` between them (or none); `count` alike, each
    over every image token (Qwen3-VL's deepstack mergers beside its merger)."""
    return LayerStack(
        name="projector", count=count, linears=linears, other_params=0,
        n_norms=0 if norm is None else 1, norm_kind=norm or NormKind.LAYER, n_heads=1,
        n_kv_heads=1, head_dim=1, mlp_kind=MlpKind.PLAIN, intermediate_size=act_width,
        causal=False, mixer=Mixer.NONE)


def _image(v: ConfigReader) -> tuple[int, int]:
    """(image size, patch size); InternVL writes them as [h, w] pairs."""
    image, patch = v.config.get("image_size"), v.config.get("patch_size")
    image = image[0] if isinstance(image, list) else image
    patch = patch[0] if isinstance(patch, list) else patch
    r = ConfigReader({"image_size": image, "patch_size": patch})
    return r.int("image_size"), r.int("patch_size")


def qwen2_5_vl(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """Qwen2_5_VisionTransformerPretrainedModel: RMSNorm blocks with a fused biased `qkv`, a
    biased `proj` and a gated biased MLP; windowed attention (window_size px = 8x8 patches at
    patch 14, `get_window_index`) but in `fullatt_block_indexes`; the merger (ln_q over each
    patch, then Linear 4h -> 4h, GELU, Linear 4h -> out over merged tokens)."""
    h, inter, depth = v.int("hidden_size"), v.int("intermediate_size"), v.int("depth")
    heads, patch, merge = v.int("num_heads"), v.int("patch_size"), v.int("spatial_merge_size")
    temporal = v.int("temporal_patch_size")
    full = len(v.config.get("fullatt_block_indexes") or [])
    linears = (Linear(name="qkv", role=Role.QKV, d_in=h, d_out=3 * h, bias=True, parts=(h, h, h)),
               Linear(name="proj", role=Role.O, d_in=h, d_out=h, bias=True),
               *_gated(h, inter, bias=True))
    window = (v.int("window_size", default=112) // patch) ** 2
    block = partial(_block, linears=linears, h=h, heads=heads, inter=inter, mlp=MlpKind.GATED,
                    norm=NormKind.RMS)
    blocks = [block("vision window", depth - full)] if depth > full else []
    windows = [window] if depth > full else []
    if full:
        blocks.append(block("vision full", full))
        windows.append(0)
    wide = h * merge * merge
    return VisionSpec(
        processor=Processor(kind=ProcessorKind.QWEN, patch=patch, merge=merge,
                            min_pixels=QWEN2_5_PIXELS[0], max_pixels=QWEN2_5_PIXELS[1],
                            temporal_patch=temporal, video_min_pixels=QWEN2_5_VIDEO_PIXELS[0],
                            video_max_pixels=QWEN2_5_VIDEO_PIXELS[1]),
        blocks=tuple(blocks), windows=tuple(windows), width=h, residual_in_compute_dtype=True,
        pixel_values_per_token=v.int("in_chans", "in_channels", default=3) * temporal * patch ** 2,
        projector=_projector(_mlp2(wide, wide, v.int("out_hidden_size"),
                                   names=("mlp.0", "mlp.2")), norm=NormKind.RMS, act_width=wide))


def qwen3_vl(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """Qwen3VLVisionModel (also Qwen3.5's): LayerNorm blocks with a fused biased `qkv` and a
    plain biased MLP (`linear_fc1`, `linear_fc2`), full attention over each image; the merger
    (LayerNorm over each patch, linear_fc1 4h -> 4h, GELU, linear_fc2 4h -> out) and one more
    like it per `deepstack_visual_indexes` entry (their features join the first layers)."""
    h, inter, depth = v.int("hidden_size"), v.int("intermediate_size"), v.int("depth")
    heads, patch, merge = v.int("num_heads"), v.int("patch_size"), v.int("spatial_merge_size")
    temporal = v.int("temporal_patch_size")
    linears = (Linear(name="qkv", role=Role.QKV, d_in=h, d_out=3 * h, bias=True, parts=(h, h, h)),
               Linear(name="proj", role=Role.O, d_in=h, d_out=h, bias=True),
               *_plain(h, inter, ("linear_fc1", "linear_fc2")))
    wide = h * merge * merge
    deep = len(v.config.get("deepstack_visual_indexes") or [])
    return VisionSpec(
        processor=Processor(kind=ProcessorKind.QWEN, patch=patch, merge=merge,
                            min_pixels=QWEN3_PIXELS[0], max_pixels=QWEN3_PIXELS[1],
                            temporal_patch=temporal, video_min_pixels=QWEN3_VIDEO_PIXELS[0],
                            video_max_pixels=QWEN3_VIDEO_PIXELS[1], video_bound_is_clip=True),
        blocks=(_block("vision", depth, linears, h=h, heads=heads, inter=inter,
                       mlp=MlpKind.PLAIN, norm=NormKind.LAYER,
                       act=act_saved(v, default="gelu_pytorch_tanh")),),
        windows=(0,), width=h,
        pixel_values_per_token=v.int("in_channels", default=3) * temporal * patch ** 2,
        projector=_projector(_mlp2(wide, wide, v.int("out_hidden_size"),
                                   names=("linear_fc1", "linear_fc2")), norm=NormKind.LAYER,
                             act_width=wide, count=1 + deep))


def used_layers(v: ConfigReader, r: ConfigReader) -> int:
    """The tower's layers whose output reaches the language model: LLaVA takes the features
    of `vision_feature_layer` (-2: all but the last), and the last layer's graph, unused, is
    freed with the tower's outputs (llava/modeling_llava.py@v5.24.0 get_image_features)."""
    layers = v.int("num_hidden_layers")
    chosen = r.config.get("vision_feature_layer", -1)
    if isinstance(chosen, int) and not isinstance(chosen, bool):
        return layers + 1 + chosen if chosen < 0 else chosen
    return layers


def _siglip_blocks(v: ConfigReader, name: str = "vision",
                   layers: int | None = None) -> tuple[LayerStack, ...]:
    """SiglipEncoderLayer / Idefics3EncoderLayer / CLIPEncoderLayer: LayerNorms, biased
    q/k/v/out_proj, fc1 -> activation -> fc2."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    linears = (*_qkvo(h, ("q_proj", "k_proj", "v_proj", "out_proj"), True, True),
               *_plain(h, inter))
    return (_block(name, layers or v.int("num_hidden_layers"), linears, h=h,
                   heads=v.int("num_attention_heads"), inter=inter, mlp=MlpKind.PLAIN,
                   norm=NormKind.LAYER, act=act_saved(v, default="gelu_pytorch_tanh")),)


def _fixed(v: ConfigReader, tokens: int, *, cls: int = 0, pan_and_scan: bool = False,
           ) -> Processor:
    """One fixed-size image; Gemma 3's pan & scan can add crops (off in Gemma3Processor's
    defaults: gemma3/processing_gemma3.py@v5.24.0 do_pan_and_scan False)."""
    size, patch = _image(v)
    return Processor(kind=ProcessorKind.FIXED, patch=patch, size=size, tokens=tokens,
                     extra_tower_tokens=cls, can_crop=pan_and_scan)


def gemma3(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """Gemma 3: SigLIP at `image_size` (896 px: 64x64 patches), average-pooled to
    `mm_tokens_per_image` (256), Gemma3RMSNorm (`mm_soft_emb_norm`), then a matmul by
    `mm_input_projection_weight` (a Parameter, not an nn.Linear: LoRA's all-linear passes it by)
    (gemma3/modeling_gemma3.py Gemma3MultiModalProjector)."""
    h = v.int("hidden_size")
    tokens = r.int("mm_tokens_per_image", default=256)
    return VisionSpec(
        processor=_fixed(v, tokens, pan_and_scan=True), blocks=_siglip_blocks(v), windows=(0,),
        width=h, outer_norms=1, pixel_values_per_token=3 * _image(v)[1] ** 2,
        projector=_projector((Linear(name="mm_input_projection_weight", role=Role.UP, d_in=h,
                                     d_out=text_h),), norm=NormKind.RMS),
        projector_not_linear=("mm_input_projection_weight",), lm_mask_with_images=True)


def paligemma(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """PaliGemma: SigLIP at `image_size`, every patch one LM token, one biased Linear
    (paligemma/modeling_paligemma.py PaliGemmaMultiModalProjector)."""
    size, patch = _image(v)
    out = r.int("projection_dim", default=text_h)
    return VisionSpec(
        processor=_fixed(v, (size // patch) ** 2), blocks=_siglip_blocks(v), windows=(0,),
        width=v.int("hidden_size"), outer_norms=1, pixel_values_per_token=3 * patch ** 2,
        projector=_projector((Linear(name="linear", role=Role.UP, d_in=v.int("hidden_size"),
                                     d_out=out, bias=True),)))


def llava(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """LLaVA: CLIP at `image_size` with a class token, the features of one layer but the last
    (`vision_feature_layer` -2) without the class token (`vision_feature_select_strategy`
    default: llava/processing_llava.py lines 66-68), linear_1 -> GELU -> linear_2."""
    size, patch = _image(v)
    bias = r.bool("multimodal_projector_bias", True)
    return VisionSpec(
        processor=_fixed(v, (size // patch) ** 2, cls=1),
        blocks=_siglip_blocks(v, layers=used_layers(v, r)), windows=(0,),
        width=v.int("hidden_size"), outer_norms=1,
        pixel_values_per_token=3 * patch ** 2,
        projector=_projector(_mlp2(v.int("hidden_size"), text_h, text_h, bias),
                             act_width=text_h))


def internvl(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """InternVL: InternViT tiles of `image_size` (448) with a class token; blocks of LayerNorm,
    q/k/v (biased per `attention_bias`), `projection_layer`, fc1/fc2 and layer-scale vectors;
    a 0.5 pixel shuffle (4h wide tokens), then LayerNorm, linear_1, GELU, linear_2
    (internvl/modeling_internvl.py InternVLMultiModalProjector). InternViT-6B adds full-width
    q/k RMSNorms (`use_qk_norm`)."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    qk_norm = v.bool("use_qk_norm", False)
    size, patch = _image(v)
    ratio = r.float("downsample_ratio", 0.5)
    wide = int(h / ratio ** 2)
    bias = v.bool("attention_bias", False)
    linears = (*_qkvo(h, ("q_proj", "k_proj", "v_proj", "projection_layer"), bias, True),
               *_plain(h, inter))
    norm = NormKind.LAYER if v.str("norm_type", "layer_norm") == "layer_norm" else NormKind.RMS
    tokens = int((size // patch) ** 2 * ratio ** 2)
    return VisionSpec(
        processor=Processor(kind=ProcessorKind.CLOSEST_TILES, patch=patch, size=size,
                            tokens=tokens, extra_tower_tokens=1, max_tiles=12, can_crop=True,
                            crops_by_default=True),
        blocks=(_block("vision", v.int("num_hidden_layers"), linears, h=h,
                       heads=v.int("num_attention_heads"), inter=inter, mlp=MlpKind.PLAIN,
                       norm=norm, act=act_saved(v, default="gelu"),
                       extra=2 * h + (2 * h if qk_norm else 0), qk_norm=qk_norm),),
        windows=(0,), width=h, pixel_values_per_token=3 * patch ** 2,
        projector=_projector(_mlp2(wide, text_h, text_h), norm=NormKind.LAYER,
                             act_width=text_h))


def idefics3(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """Idefics3 / SmolVLM: SigLIP-style blocks over `image_size` tiles (no class token), a
    post-LayerNorm, a pixel shuffle by `scale_factor` and one bias-free Linear (connector
    `modality_projection.proj`); the processor resizes the longest edge to 4 tiles
    (image_processing_idefics3.py@v5.24.0: size longest_edge 4·364, max_image_size 364)."""
    size, patch = _image(v)
    scale = r.int("scale_factor", default=2)
    h = v.int("hidden_size")
    return VisionSpec(
        processor=Processor(kind=ProcessorKind.SPLIT, patch=patch, size=size,
                            tokens=(size // patch) ** 2 // scale ** 2, longest_edge=4 * size,
                            max_tiles=17, can_crop=True, crops_by_default=True),
        blocks=_siglip_blocks(v), windows=(0,), width=h, outer_norms=1,
        pixel_values_per_token=3 * patch ** 2,
        projector=_projector((Linear(name="proj", role=Role.UP, d_in=h * scale * scale,
                                     d_out=text_h),)))


def mistral3(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """Mistral 3: Pixtral blocks (RMSNorm, bias-free q/k/v/o_proj, gated MLP) over every patch
    of an image whose longest edge is at most `image_size`; the projector's RMSNorm, the patch
    merger (Linear h·m² -> h over merged tokens), linear_1, GELU, linear_2
    (mistral3/modeling_mistral3.py Mistral3MultiModalProjector)."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    size, patch = _image(v)
    merge = r.int("spatial_merge_size", default=2)
    bias = r.bool("multimodal_projector_bias", False)
    linears = (*_qkvo(h, ("q_proj", "k_proj", "v_proj", "o_proj"), False, False),
               *_gated(h, inter, bias=False))
    return VisionSpec(
        processor=Processor(kind=ProcessorKind.PIXTRAL, patch=patch, merge=merge, size=size),
        blocks=(_block("vision", v.int("num_hidden_layers"), linears, h=h,
                       heads=v.int("num_attention_heads"), inter=inter, mlp=MlpKind.GATED,
                       norm=NormKind.RMS),),
        windows=(0,), width=h, outer_norms=1, pixel_values_per_token=3 * patch ** 2,
        projector=_projector((Linear(name="merging_layer", role=Role.GATE,
                                     d_in=h * merge * merge, d_out=h),
                              *_mlp2(h, text_h, text_h, bias)), norm=NormKind.RMS,
                             act_width=text_h))


def mllama(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """Llama 3.2 Vision: tiles of `image_size` (560 px, 40x40 patches and a class token,
    padded to 1,608), a local transformer and a gated global one (bias-free q/k/v/o_proj,
    fc1/fc2, LayerNorms); the projector maps every tile token's `vision_output_dim` features to
    the text width, and the text reaches them through cross-attention
    (mllama/modeling_mllama.py)."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    size, patch = _image(v)
    heads = v.int("attention_heads", "num_attention_heads")
    linears = (*_qkvo(h, ("q_proj", "k_proj", "v_proj", "o_proj"), False, False),
               *_plain(h, inter))
    block = partial(_block, linears=linears, h=h, heads=heads, inter=inter, mlp=MlpKind.PLAIN,
                    norm=NormKind.LAYER, act=act_saved(v, default="gelu"))
    return VisionSpec(
        processor=Processor(kind=ProcessorKind.MLLAMA, patch=patch, size=size, tokens=1,
                            extra_tower_tokens=1, pad_tower_tokens_to=8,
                            max_tiles=v.int("max_num_tiles", default=4)),
        blocks=(block("vision local", v.int("num_hidden_layers")),
                block("vision global", v.int("num_global_layers"))),
        windows=(0, 0), width=h, outer_norms=2, pixel_values_per_token=3 * patch ** 2,
        projector=_projector((Linear(name="multi_modal_projector", role=Role.UP,
                                     d_in=v.int("vision_output_dim"), d_out=text_h,
                                     bias=True),)),
        projector_on_tower_tokens=True, cross_attention=True)


def llama4(v: ConfigReader, r: ConfigReader, text_h: int) -> VisionSpec:
    """Llama 4: tiles of `image_size` (336 px, 24x24 patches and a class token) on the best-fit
    canvas of up to 16 and a global tile, LayerNorm blocks (biased q/k/v/o_proj, fc1/fc2), a
    0.5 pixel shuffle into 144 tokens per tile and a bias-free Linear to the text width
    (llama4/modeling_llama4.py; processing_llama4.py)."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    size, patch = _image(v)
    shuffle = round(1 / v.float("pixel_shuffle_ratio", 0.5))
    linears = (*_qkvo(h, ("q_proj", "k_proj", "v_proj", "o_proj"), True, True),
               *_plain(h, inter))
    return VisionSpec(
        processor=Processor(kind=ProcessorKind.CANVAS, patch=patch, merge=shuffle, size=size,
                            extra_tower_tokens=1, max_tiles=16),
        blocks=(_block("vision", v.int("num_hidden_layers"), linears, h=h,
                       heads=v.int("num_attention_heads"), inter=inter, mlp=MlpKind.PLAIN,
                       norm=NormKind.LAYER, act=act_saved(v, default="gelu")),),
        windows=(0,), width=h, outer_norms=2, pixel_values_per_token=3 * patch ** 2,
        projector=_projector((Linear(name="linear_1", role=Role.UP,
                                     d_in=v.int("vision_output_dim"), d_out=text_h),)))


#: model_type -> the builder of its VisionSpec.
TOWERS: dict[str, Callable[[ConfigReader, ConfigReader, int], VisionSpec]] = {
    "qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl, "qwen3_5": qwen3_vl, "gemma3": gemma3,
    "paligemma": paligemma, "llava": llava, "internvl": internvl, "idefics3": idefics3,
    "smolvlm": idefics3,
    "mistral3": mistral3, "mllama": mllama, "llama4": llama4,
}
