"""A vision-language model's images and video in one training step (issue 22).

Three things a text model does not hold (`docs/vlm-tokens.md`):
- image tokens: each image becomes the tokens its processor computes (`vram.model.processor`),
  and they are part of the language model's sequence. `seq_len` is that whole sequence, image
  tokens included (what `cutoff_len`, `max_length` and `sequence_len` bound), so images do not
  add to the language model's activations: they take text's place, and must fit.
- the vision tower's activations, over every patch of every image (4,888 per 1080p image in
  Qwen2.5-VL, four times its LM tokens). A frozen tower without adapters keeps none for
  backward; a trained tower, or one with LoRA adapters (PEFT's all-linear puts them there),
  keeps what a layer keeps (`vram.memory.activations.layer`), its blocks checkpointed with the
  language model's (they are `GradientCheckpointingLayer`s, transformers 5.24.0).
- the processor's fp32 pixel values, alive through the step.

The tower's blocks and projector are `LayerStack`s, so each term is the same bookkeeping as a
decoder layer's, at the tower's width and sequence (one image, tile or attention window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from vram.errors import VramError
from vram.memo import memoized, setup_key
from vram.memory.activations.layer import LayerActivations, layer_activations
from vram.model.lora_reach import EVERY_LINEAR, Roles
from vram.model.params import vision_frozen, vision_targeted
from vram.model.processor import ImageTokens, Processor, image_tokens, largest_side, video_tokens
from vram.model.spec import FUSED_PARTS, LayerStack, ModelSpec, Role, VisionSpec
from vram.result import LineItem, VisionTokens
from vram.setup import ALL_LINEAR, Method, TrainingSetup
from vram.stacks.profile import StackProfile, runs_transformers_code
from vram.stacks.resolve import resolve
from vram.units import FP32_BYTES as FP32

PROJECTOR_KEY = "activations.vision_projector"
TOWER_SOURCE = "autograd saved tensors of the vision tower's blocks; see vram.memory.vision"


@dataclass(frozen=True, slots=True)
class MediaTokens:
    """One sample's images and video after the processor."""

    images: int
    #: The size of each image (and video frame) before the processor: (height, width).
    size: tuple[int, int]
    image: ImageTokens | None
    frames: int
    video: ImageTokens | None

    @property
    def lm_tokens(self) -> int:
        """Image and video tokens in the language model's sequence."""
        return (self.images * self.image.lm_tokens if self.image else 0) + (
            self.video.lm_tokens if self.video else 0)

    @property
    def tower_tokens(self) -> int:
        """Tokens the vision tower runs over, every tile of every image."""
        return (self.images * self.image.tiles * self.image.tower_tokens if self.image
                else 0) + (self.video.tower_tokens if self.video else 0)


def prescaled(height: int, width: int, max_pixels: int | None,
              min_pixels: int | None) -> tuple[int, int]:
    """An image scaled into [min, max] pixels, sides floored, before the processor sees it
    (LLaMA-Factory@ff6d4d12 src/llamafactory/data/mm_plugin.py BasePlugin._preprocess_image)."""
    if max_pixels and height * width > max_pixels:
        factor = math.sqrt(max_pixels / (height * width))
        height, width = int(height * factor), int(width * factor)
    if min_pixels and height * width < min_pixels:
        factor = math.sqrt(min_pixels / (height * width))
        height, width = int(height * factor), int(width * factor)
    return max(1, height), max(1, width)


def media_tokens(model: ModelSpec, setup: TrainingSetup,
                 profile: StackProfile) -> MediaTokens | None:
    """What the processor makes of the setup's images and video; None without either. A text
    model given images, or image tokens that do not fit `seq_len`, is a one-line error."""
    if not setup.images_per_sample and not setup.video_frames:
        return None
    spec = model.vision
    knob = "images_per_sample" if setup.images_per_sample else "video_frames"
    if spec is None:
        raise VramError(f"{knob}: {model.name} is not a vision-language model (its config "
                        "has no vision_config); give 0")
    run = resolve(setup).run
    p = spec.processor
    pre = profile.resizes_images_before_processor
    side = largest_side(p, None if pre else run.max_pixels)
    if pre and run.max_pixels:
        side = math.isqrt(run.max_pixels)
    size = (setup.image_height or side, setup.image_width or side)
    image = _one_image(p, size, run, pre) if setup.images_per_sample else None
    video = _video(model, p, size, run) if setup.video_frames else None
    media = MediaTokens(setup.images_per_sample, size, image, setup.video_frames, video)
    if media.lm_tokens > setup.seq_len:
        raise VramError(_does_not_fit(media, setup.seq_len))
    return media


def _one_image(p: Processor, size: tuple[int, int], run: TrainingSetup,
               pre: bool) -> ImageTokens:
    height, width = size
    try:
        if pre:  # the stack's own bounds first, then the checkpoint processor's
            height, width = prescaled(height, width, run.max_pixels, run.min_pixels)
            return image_tokens(p, height, width, crop=run.crop_images)
        return image_tokens(p, height, width, min_pixels=run.min_pixels,
                            max_pixels=run.max_pixels, crop=run.crop_images)
    except ValueError as exc:
        raise VramError(f"image_width: {exc}") from None


def _video(model: ModelSpec, p: Processor, size: tuple[int, int],
           run: TrainingSetup) -> ImageTokens:
    if not p.takes_video:
        raise VramError(f"video_frames: {model.name}'s processor takes no video in vram "
                        "(Qwen2.5-VL, Qwen3-VL and Qwen3.5 do); give 0")
    if run.video_frames < p.temporal_patch:
        raise VramError(f"video_frames: at least {p.temporal_patch} (one temporal patch)")
    try:
        return video_tokens(p, run.video_frames, *size, max_pixels=run.video_max_pixels)
    except ValueError as exc:
        raise VramError(f"image_width: {exc}") from None


def _does_not_fit(media: MediaTokens, seq_len: int) -> str:
    parts = []
    if media.image:
        parts.append(f"{media.images} image(s) x {media.image.lm_tokens:,} tokens")
    if media.video:
        parts.append(f"a {media.frames}-frame video's {media.video.lm_tokens:,} tokens")
    return (f"seq_len: {' + '.join(parts)} = {media.lm_tokens:,} image tokens do not fit in "
            f"{seq_len:,}; seq_len counts them (raise it, or lower max_pixels or the images)")


def _roles(stack: LayerStack, setup: TrainingSetup) -> Roles:
    """What LoRA adapts in a vision stack, by PEFT's name matching (`vision_targeted`)."""
    if setup.lora_targets == ALL_LINEAR and not vision_frozen(setup):
        return EVERY_LINEAR if setup.trains_adapters else frozenset()
    roles: set[Role] = set()
    for linear in stack.linears:
        if vision_targeted(linear, setup):
            roles |= {linear.role} | FUSED_PARTS.get(linear.role, frozenset())
    return frozenset(roles)


def _tower_model(model: ModelSpec, spec: VisionSpec) -> ModelSpec:
    """The tower as a model of its own, for the layer bookkeeping (its attention kernel)."""
    return memoized(model, "vision tower model", lambda: ModelSpec(
        name=f"{model.name} vision tower", family=model.family, hidden_size=spec.width,
        vocab_size=1, stacks=(*spec.blocks, spec.projector), embedding_params=0))


@dataclass(frozen=True, slots=True)
class VisionPlan:
    """The images of one micro-batch: tokens, and what the vision side holds for backward."""

    media: MediaTokens
    #: The tower's (or projector's) gradient flows: it trains, or LoRA adapts it.
    keeps: bool
    tower_tokens: int
    lm_image_tokens: int
    #: Kept from the tower's forward to its backward, after the language model's: per stack.
    saved: tuple[LineItem, ...]
    pixels: LineItem
    #: The tower's backward beyond what it kept: a block recomputed (checkpointing) and its
    #: gradient buffers.
    backward_bytes: int

    @property
    def saved_bytes(self) -> int:
        return sum(item.bytes for item in self.saved)

    @property
    def tower_saved(self) -> tuple[LineItem, ...]:
        """What the tower's blocks keep (the projector's backward runs before theirs)."""
        return tuple(item for item in self.saved if item.key != PROJECTOR_KEY)


def tower_profile(spec: VisionSpec, profile: StackProfile) -> StackProfile:
    """The stack's profile for the tower: its residual stream in the compute dtype where the
    tower keeps it so under autocast (`VisionSpec.residual_in_compute_dtype`)."""
    n = profile.precision
    if not spec.residual_in_compute_dtype or n.residual == n.compute:
        return profile
    return replace(profile, precision=replace(n, residual=n.compute))


def _tower_stack(tower: ModelSpec, stack: LayerStack, span: int, setup: TrainingSetup,
                 profile: StackProfile, method: Method, roles: Roles) -> LayerActivations:
    """One stack of the tower's blocks, attending over `span` tokens at once."""
    local = setup.model_copy(update={"seq_len": max(1, span), "micro_batch": 1,
                                     "method": method})
    return layer_activations(tower, stack, local, profile, roles)


def vision_plan(model: ModelSpec, setup: TrainingSetup,
                profile: StackProfile) -> VisionPlan | None:
    """The micro-batch's images (None without any), remembered per setup."""
    if not (setup.images_per_sample or setup.video_frames):
        return None
    return memoized(model, ("vision", setup_key(setup, frozenset({"grad_accum"}))),
                    lambda: _vision_plan(model, setup, profile))


def _vision_plan(model: ModelSpec, setup: TrainingSetup,
                 profile: StackProfile) -> VisionPlan | None:
    media = media_tokens(model, setup, profile)
    spec = model.vision
    if media is None or spec is None:
        return None
    b = setup.micro_batch
    tower_tokens = b * media.tower_tokens
    lm_tokens = b * media.lm_tokens
    trains = setup.method is Method.FULL and not vision_frozen(setup)
    method = Method.FULL if trains else setup.method
    roles = [_roles(stack, setup) for stack in spec.blocks]
    projector_roles = _roles(spec.projector, setup)
    hooked = hooked_tower(spec, setup, profile)
    keeps = trains or any(bool(r) for r in roles) or bool(projector_roles) or hooked
    profile = tower_profile(spec, profile)
    n = profile.precision
    pixels = LineItem.assemble(
        key="activations.vision.pixels", label="image pixel values (the processor's fp32)",
        formula="tower tokens × values per token × 4 B",
        inputs={"tower_tokens": tower_tokens, "values_per_token": spec.pixel_values_per_token},
        bytes=tower_tokens * spec.pixel_values_per_token * FP32,
        source="the processor returns fp32 pixel_values; the batch holds them through the step")
    if not keeps:
        return VisionPlan(media, False, tower_tokens, lm_tokens, (), pixels, 0)
    tower = _tower_model(model, spec)
    span = media.image.tower_tokens if media.image else (
        media.video.tower_tokens if media.video else 1)
    saved: list[LineItem] = []
    largest = transient = 0
    for stack, window, stack_roles in zip(spec.blocks, spec.windows, roles, strict=True):
        layer = _tower_stack(tower, stack, window or span, setup, profile, method, stack_roles)
        largest = max(largest, layer.bytes_per_token)
        transient = max(transient, layer.backward_transient_per_token)
        if not setup.grad_ckpt:
            saved.append(LineItem.assemble(
                key=f"activations.{stack.name.replace(' ', '_')}",
                label=f"{stack.name} blocks × {stack.count}: "
                      + ", ".join(term.label for term in layer.terms),
                formula="tower tokens × blocks × Σ terms per token",
                inputs={"tower_tokens": tower_tokens, "blocks": stack.count,
                        "per_token_bytes": layer.bytes_per_token},
                bytes=tower_tokens * stack.count * layer.bytes_per_token, source=TOWER_SOURCE))
    if setup.grad_ckpt:
        saved.append(LineItem.assemble(
            key="activations.vision_checkpoints", label="checkpointed vision block inputs",
            formula="tower tokens × blocks × width × residual bytes",
            inputs={"tower_tokens": tower_tokens, "blocks": spec.depth, "width": spec.width},
            bytes=tower_tokens * spec.depth * spec.width * n.residual,
            source="the tower's blocks are GradientCheckpointingLayers (transformers 5.24.0)"))
    projector = _tower_stack(tower, spec.projector, 1, setup, profile, method, projector_roles)
    basis = tower_tokens if spec.projector_on_tower_tokens else lm_tokens
    saved.append(LineItem.assemble(
        key=PROJECTOR_KEY,
        label="vision projector: " + ", ".join(term.label for term in projector.terms),
        formula="image tokens × projectors × Σ terms per token",
        inputs={"tokens": basis, "projectors": spec.projector.count,
                "per_token_bytes": projector.bytes_per_token},
        bytes=basis * spec.projector.count * projector.bytes_per_token, source=TOWER_SOURCE))
    if hooked and setup.method is not Method.FULL:  # a trained embedding's output is no leaf
        saved.append(_embedding_leaf(model, setup, lm_tokens, n.frozen_weights))
    recompute = largest if setup.grad_ckpt else 0
    backward = tower_tokens * (recompute + transient)
    return VisionPlan(media, True, tower_tokens, lm_tokens, tuple(saved), pixels, backward)


def hooked_tower(spec: VisionSpec, setup: TrainingSetup, profile: StackProfile) -> bool:
    """transformers' checkpointing makes the tower's patch embedding output require grad
    (`VisionSpec.input_hooked`), so a frozen tower without adapters keeps what a frozen layer
    keeps for a backward that reaches no parameter (traced: Mistral 3's 24 Pixtral block
    inputs). Only where the model code is transformers' own."""
    return setup.grad_ckpt and spec.input_hooked and runs_transformers_code(profile)


def _embedding_leaf(model: ModelSpec, setup: TrainingSetup, lm_tokens: int,
                    embedding_bytes: int) -> LineItem:
    """The same hook on the language model's frozen embedding makes its output a leaf that
    requires grad; autograd's AccumulateGrad holds it until the backward reaches it. A text
    model's first layer keeps that tensor anyway; here the images are scattered into a copy
    (`masked_scatter`), which the first layer keeps instead."""
    tokens = setup.micro_batch * setup.seq_len
    return LineItem.assemble(
        key="activations.vision.embedding_leaf",
        label="the language embedding's output (a leaf requiring grad)",
        formula="tokens × h × embedding bytes", inputs={"tokens": tokens, "h": model.hidden_size,
                                                        "image_tokens": lm_tokens},
        bytes=tokens * model.hidden_size * embedding_bytes,
        source="transformers/modeling_utils.py@v5.24.0 L2153-2154 output.requires_grad_(True)")


def vision_tokens(vision: VisionPlan | None, setup: TrainingSetup,
                  alive: Sequence[object]) -> VisionTokens | None:
    """The images' figures for the estimate: tokens per image and per sample, and the vision
    side's activations among `alive` (the peak moment's items)."""
    if vision is None:
        return None
    media = vision.media
    image, video = media.image, media.video
    mine = {id(item) for item in (*vision.saved, vision.pixels)}
    held = sum(getattr(item, "bytes", 0) for item in alive if id(item) in mine)
    held += sum(getattr(item, "bytes", 0) for item in alive
                if getattr(item, "key", "") == "activations.vision_backward")
    return VisionTokens(
        images_per_sample=media.images, image_height=media.size[0], image_width=media.size[1],
        resized_height=image.height if image else 0, resized_width=image.width if image else 0,
        tiles_per_image=image.tiles if image else 0,
        tower_tokens_per_image=image.tiles * image.tower_tokens if image else 0,
        tokens_per_image=image.lm_tokens if image else 0, video_frames=media.frames,
        video_tokens=video.lm_tokens if video else 0,
        image_tokens_per_sample=media.lm_tokens,
        text_tokens_per_sample=setup.seq_len - media.lm_tokens,
        vision_activation_bytes=held)
