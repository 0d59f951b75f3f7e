"""Which attention kernel a step runs, and the masks Transformers builds for it.

The kernel decides whether s×s scores exist: FlashAttention and SDPA's memory-efficient kernel
keep O(s) per head; SDPA's math fallback and a model's eager attention keep the s×s
probabilities. PyTorch's CUDA dispatch: torch/backends/cuda (sdp_kernel priorities) and
aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (each kernel's constraints).
"""

from __future__ import annotations

from enum import StrEnum

from vram.model.spec import LayerStack, ModelSpec
from vram.setup import Attention, TrainingSetup
from vram.stacks.precision import PrecisionPolicy
from vram.stacks.profile import StackProfile, runs_transformers_code
from vram.units import FP32_BYTES as FP32


class Kernel(StrEnum):
    """The attention kernel a step really runs (it decides whether s×s scores are kept)."""

    FLASH = "flash"  # FlashAttention (flash-attn 2, or SDPA's flash kernel): O(s)
    EFFICIENT = "memory-efficient"  # SDPA's efficient kernel: O(s), accepts a mask
    MATH = "math"  # SDPA's fallback: s×s probabilities in fp32
    EAGER = "eager"  # the model's own softmax(q·kᵀ)·v

    @property
    def explicit_scores(self) -> bool:
        """Whether the kernel materializes the s×s scores and probabilities."""
        return self in (Kernel.EAGER, Kernel.MATH)


def attention_kernel(model: ModelSpec, stack: LayerStack, setup: TrainingSetup,
                     profile: StackProfile) -> Kernel:
    """Which kernel runs, following PyTorch's CUDA dispatch and each stack's code.

    - Gemma 2's soft-capping rules SDPA out: Transformers refuses `sdpa` for it
      (Gemma2PreTrainedModel._supports_sdpa = False) and LitGPT computes scores itself; only
      flash-attn 2 soft-caps in a fused kernel.
    - A family whose Transformers code always passes a 4-D mask and k/v with fewer heads and
      no `enable_gqa` (Falcon: `LayerStack.hf_sdpa_runs_math`) makes CUDA's flash and efficient
      kernels refuse it, and SDPA falls back to math.
    - A sliding window shorter than the sequence needs a mask: SDPA's efficient kernel, with
      k/v repeated to every head first (HF's repeat_kv).
    - fp32 rules flash out; the efficient kernel then runs, except for grouped k/v passed
      unexpanded (HF with enable_gqa), which only math accepts.
    - torch's nn.MultiheadAttention with `need_weights=True` computes softmax(q·kᵀ) itself
      (`LayerStack.torch_multihead_attention`), whatever the setup asks for.
    """
    if setup.attention is Attention.EAGER or stack.torch_multihead_attention:
        return Kernel.EAGER
    if setup.attention is Attention.FLASH:
        return Kernel.FLASH
    if stack.attn_softcap or stack.attention_sinks:
        return Kernel.EAGER
    hf = runs_transformers_code(profile)
    if hf and stack.hf_sdpa_runs_math:
        return Kernel.MATH
    grouped = stack.n_kv_heads < stack.n_heads
    if needs_mask(model, setup, profile, stack):
        return Kernel.EFFICIENT  # masked, k/v repeated: any dtype
    if profile.precision.attention == FP32:
        # Flash needs 16-bit inputs; the efficient kernel takes fp32 but not grouped k/v, which
        # HF passes unexpanded (enable_gqa) when no mask is needed.
        return Kernel.MATH if hf and grouped else Kernel.EFFICIENT
    return Kernel.FLASH


def needs_mask(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
               stack: LayerStack | None = None) -> bool:
    """HF passes an explicit mask when the sequence is as long as a sliding window or longer
    (transformers/masking_utils.py@v5.24.0 _ignore_causal_mask_sdpa #L286: `kv_length >=
    local_attention_size` keeps the mask; the sharded trace builds it at 4,096 tokens on
    Mistral's 4,096 window). In a model whose stacks carry their own window (the local/global
    patterns of issue 22: `LayerStack.attention_window`), only the windowed layers do: the
    global layers' mask is skipped for SDPA's `is_causal` (one mask per layer type,
    `create_causal_mask` vs `create_sliding_window_causal_mask`). A VLM whose images attend
    bidirectionally (`VisionSpec.lm_mask_with_images`) masks every layer when it has images
    (transformers/models/gemma3/modeling_gemma3.py@v5.24.0 `create_masks_for_vision_model`)."""
    if not runs_transformers_code(profile):
        return False
    if (model.vision is not None and model.vision.lm_mask_with_images
            and (setup.images_per_sample or setup.video_frames)):
        return True  # every layer's mask, for the images' bidirectional attention
    if any(st.attention_window for st in model.stacks):
        windows = [stack.attention_window] if stack is not None else [
            st.attention_window for st in model.stacks]
        return any(w is not None and w <= setup.seq_len for w in windows)
    return bool(model.sliding_window and model.sliding_window <= setup.seq_len)


def mask_bytes_per_sequence(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                            n: PrecisionPolicy) -> int:
    """HF materializes a [batch, 1, s, s] additive causal mask in the compute dtype when the
    kernel needs one (eager, math), and a second one for sliding-window layers (Gemma 2)
    (transformers masking_utils). Per sequence of the batch: the mask grows with the batch."""
    hf = runs_transformers_code(profile)
    causal = [st for st in model.stacks if st.causal]
    if not hf or not causal:
        return 0
    kernels = {attention_kernel(model, st, setup, profile) for st in causal}
    s = setup.seq_len
    if not kernels & {Kernel.EAGER, Kernel.MATH}:
        # A fused kernel needs no mask, except a sliding window: HF then builds a boolean
        # [batch, 1, s, s] mask (SDPA turns it into each layer's bias, counted per layer).
        if Kernel.EFFICIENT in kernels and needs_mask(model, setup, profile):
            return s * s
        return 0
    masks = 2 if model.sliding_window and model.sliding_window < s else 1
    return masks * s * s * n.compute
