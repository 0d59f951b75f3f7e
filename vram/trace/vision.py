"""Vision-language models in the exact trace: the image-text-to-text class, fed the setup's
images on fake tensors (issue 22; `benchmarks/vlm_trace_probe.py` found how).

The model is what a fine-tuner loads (`AutoModelForImageTextToText`). Its inputs are what the
processor would hand over for the setup's images, sized by `vram.memory.vision.media_tokens`
(the processor rule, itself checked against transformers' processors): the pixel values in
fp32, the image tokens in the text, and the metadata each model reads back in Python (Qwen's
`image_grid_thw`, Mistral 3's `image_sizes`). Metadata is built from Python data, so a fake
tensor keeps its values (`constant`) up to `CONSTANT_NUMEL_LIMIT`, raised here; the helpers
that loop over it (`get_vision_*`, Qwen's `get_rope_index`) run on the real values
(`on_constants`). Weights and activations are never built from Python data: they stay fake.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vram.setup import TrainingSetup

#: Module names under which a VLM keeps its vision tower and projector (transformers 5.24.0:
#: Qwen's `visual` holds its merger; the others' `vision_tower` / `vision_model` and
#: `multi_modal_projector` / Idefics3's `connector`).
VISION_MODULES = ("visual", "vision_tower", "vision_model", "multi_modal_projector",
                  "connector")
#: Modules whose metadata helpers loop in Python over tensor values.
HELPER_MODULES = ("transformers.vision_utils",
                  "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
                  "transformers.models.qwen3_vl.modeling_qwen3_vl",
                  "transformers.models.qwen3_5.modeling_qwen3_5")
#: Fake tensors made from Python data keep their values up to this many elements.
CONSTANT_LIMIT = 1 << 26

Inputs = Callable[[], tuple[torch.Tensor, dict[str, Any]]]


def is_vlm(config: dict[str, Any]) -> bool:
    return isinstance(config.get("vision_config"), dict)


def text_part(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys: `text_config`, or the config itself (Qwen2.5-VL's flat one)."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def fed_layers(config: dict[str, Any]) -> int:
    """How many of the first language-model layers take the tower's features besides the image
    tokens: Qwen3-VL's deepstack adds one merger's output to each of layers 0..k-1, k =
    len(`deepstack_visual_indexes`) (transformers 5.24.0 `modeling_qwen3_vl.py`
    Qwen3VLTextModel.forward). A model traced with fewer layers leaves a merger unused (no
    gradient, no activations), so the trace's extrapolation starts above them."""
    if not is_vlm(config):
        return 0
    return len(config["vision_config"].get("deepstack_visual_indexes") or [])


def in_vision(name: str) -> bool:
    """Whether a module or parameter name belongs to the vision tower or projector."""
    return any(part in VISION_MODULES for part in name.split("."))


def constant(value: Any) -> Any:
    """A real tensor as a fake tensor that keeps its values (other values unchanged)."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode()
    if mode is None or not isinstance(value, torch.Tensor):
        return value
    return mode.fake_tensor_converter.from_real_tensor(mode, value, make_constant=True)


def on_constants(fn: Any) -> Any:
    """Run a metadata helper for real: its fake arguments that carry constants become their
    values, its outputs constants again. It only ever sees metadata."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    def real(value: Any) -> Any:
        if isinstance(value, FakeTensor) and value.constant is not None:
            return value.constant
        return value

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            out = fn(*(real(a) for a in args), **{k: real(v) for k, v in kwargs.items()})
        if isinstance(out, tuple):
            return tuple(constant(o) for o in out)
        return constant(out)

    wrapper.on_constants = True  # type: ignore[attr-defined]
    return wrapper


def prepare() -> None:
    """Once per process: keep metadata constants, and run the helpers that read them on
    their values."""
    import torch._subclasses.fake_tensor as fake_tensor
    import transformers.vision_utils as vision_utils

    fake_tensor.CONSTANT_NUMEL_LIMIT = max(fake_tensor.CONSTANT_NUMEL_LIMIT, CONSTANT_LIMIT)
    for module_name in HELPER_MODULES:
        module = importlib.import_module(module_name)
        for value in list(vars(module).values()):
            method = getattr(value, "get_rope_index", None) if isinstance(value, type) else None
            if method is not None and not getattr(method, "on_constants", False):
                value.get_rope_index = on_constants(method)
        for name in dir(vision_utils):
            if (name.startswith("get_vision_") and hasattr(module, name)
                    and not getattr(getattr(module, name), "on_constants", False)):
                setattr(module, name, on_constants(getattr(vision_utils, name)))


def instantiate(hf_config: Any, dtype: torch.dtype, attn: str) -> nn.Module:
    """The image-text-to-text model, weights uninitialised (SigLIP's init reads values)."""
    from transformers import AutoModelForImageTextToText
    from transformers.initialization import no_init_weights

    prepare()
    with no_init_weights():
        try:
            model: Any = AutoModelForImageTextToText.from_config(
                hf_config, dtype=dtype, attn_implementation=attn)
        except ValueError as exc:  # a language model transformers refuses SDPA (Gemma 2)
            if "does not support" not in str(exc):
                raise
            model = AutoModelForImageTextToText.from_config(
                hf_config, dtype=dtype, attn_implementation="eager")
    model.tie_weights()  # skipped with the init: a tied head shares the embedding's matrix
    return model  # type: ignore[no-any-return]


def block_lists(model: nn.Module, text_layers: int,
                vision_depth: int) -> list[tuple[str, nn.ModuleList]] | None:
    """The language model's decoder layers and the vision tower's blocks (labelled
    "vision"), each the one ModuleList of that length on its side; None if either is not
    found."""
    text = vision = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList):
            continue
        if in_vision(name) and len(module) == vision_depth and vision is None:
            vision = (name, module)
        elif not in_vision(name) and len(module) == text_layers and text is None:
            text = (name, module)
    if text is None or vision is None:
        return None
    return [text, ("vision", vision[1])]


def projector_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, name, Linear) of every nn.Linear outside the blocks on the vision side: the
    projector or merger (bitsandbytes quantizes them too: transformers 5.24.0
    quantizers/base.py `get_keys_to_not_convert` spares only the head and tied weights)."""
    out = []
    for name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if (type(child) is nn.Linear and in_vision(full)
                    and ".blocks." not in f".{full}." and ".layers." not in f".{full}."
                    and ".layer." not in f".{full}."):
                out.append((parent, child_name, child))
    return out


def freeze(model: nn.Module) -> None:
    """A frozen vision side (`freeze_vision`): no parameter of it trains."""
    for name, param in model.named_parameters():
        if in_vision(name):
            param.requires_grad_(False)


def lora_exclusions() -> str:
    """PEFT `exclude_modules` for a frozen vision side (LLaMA-Factory's forbidden modules)."""
    return r".*(?:" + "|".join(VISION_MODULES) + r").*"


def make_inputs(model_type: str, config: dict[str, Any], hf_config: Any,
                setup: TrainingSetup) -> Inputs:
    """A function that builds one micro-batch's inputs (ids and the model's image inputs),
    called inside the traced step so they count as live tensors, as the batch does."""
    from vram.memory.vision import media_tokens
    from vram.model.catalog import load_model
    from vram.stacks.profile import profile_for

    spec = load_model(config)
    media = media_tokens(spec, setup, profile_for(setup))
    vision = config["vision_config"]
    batch, seq = setup.micro_batch, setup.seq_len

    def build() -> tuple[torch.Tensor, dict[str, Any]]:
        return _inputs(model_type, config, vision, hf_config, batch, seq, media)

    return build


def _token(hf_config: Any, *names: str) -> int:
    for name in names:
        value = getattr(hf_config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"config: no {names[0]}")


def _ids(batch: int, seq: int, runs: list[tuple[int, int]], text: int) -> list[list[int]]:
    """Each sample: the image runs (token id, count) first, then text to `seq` tokens."""
    row: list[int] = []
    for token, count in runs:
        row += [token] * count
    return [row + [text] * (seq - len(row)) for _ in range(batch)]


def _inputs(model_type: str, config: dict[str, Any], vision: dict[str, Any], hf: Any,
            batch: int, seq: int, media: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    text = 1
    if media is None:
        ids = torch.tensor(_ids(batch, seq, [], text))
        return ids, {}
    image = media.image
    n_images = batch * media.images
    extra: dict[str, Any] = {}
    if model_type in ("qwen2_5_vl", "qwen3_vl", "qwen3_5"):
        return _qwen(hf, vision, batch, seq, media)
    token = _token(hf, "image_token_id", "image_token_index")
    size = image.height
    if model_type in ("idefics3", "smolvlm"):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # Idefics3 drops all-zero padding images by value
            ones = torch.ones(batch, media.images * image.tiles, 3, size, size)
        extra["pixel_values"] = constant(ones)
    elif model_type == "mistral3":
        extra["pixel_values"] = torch.zeros(n_images, 3, image.height, image.width)
        extra["image_sizes"] = torch.tensor([[image.height, image.width]] * n_images)
    else:
        extra["pixel_values"] = torch.zeros(n_images * image.tiles, 3, size, size)
    runs = [(token, media.images * image.lm_tokens)]
    rows = _ids(batch, seq, runs, text)
    if model_type in ("gemma3", "paligemma"):
        extra["token_type_ids"] = torch.tensor([[int(t == token) for t in row] for row in rows])
    return torch.tensor(rows), extra


def _qwen(hf: Any, vision: dict[str, Any], batch: int, seq: int,
          media: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Qwen2.5-VL / Qwen3-VL / Qwen3.5: patches flattened to [patches, C·T·P·P], the grid of
    each image (and video) as `*_grid_thw`, `<|vision_start|>` before each run of image
    tokens, and `mm_token_type_ids` (1 image, 2 video)."""
    patch, temporal = vision["patch_size"], vision["temporal_patch_size"]
    values = vision.get("in_channels", vision.get("in_chans", 3)) * temporal * patch * patch
    start = _token(hf, "vision_start_token_id")
    extra: dict[str, Any] = {}
    row: list[int] = []
    types: list[int] = []
    if media.image is not None:
        image = media.image
        grid = [1, image.height // patch, image.width // patch]
        extra["pixel_values"] = torch.zeros(batch * media.images * image.tower_tokens, values)
        extra["image_grid_thw"] = torch.tensor([grid] * (batch * media.images))
        token = _token(hf, "image_token_id")
        for _ in range(media.images):
            row += [start] + [token] * image.lm_tokens
            types += [0] + [1] * image.lm_tokens
    if media.video is not None:
        video = media.video
        frames = video.tower_tokens // ((video.height // patch) * (video.width // patch))
        grid = [frames, video.height // patch, video.width // patch]
        extra["pixel_values_videos"] = torch.zeros(batch * video.tower_tokens, values)
        extra["video_grid_thw"] = torch.tensor([grid] * batch)
        token = _token(hf, "video_token_id")
        row += [start] + [token] * video.lm_tokens
        types += [0] + [2] * video.lm_tokens
    rest = seq - len(row)
    ids = torch.tensor([row + [1] * rest] * batch)
    extra["mm_token_type_ids"] = torch.tensor([types + [0] * rest] * batch)
    return ids, extra
