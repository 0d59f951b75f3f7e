"""The KV cache a vision-language model's language model fills in a training forward.

transformers' Trainer turns the cache off on the model's top-level config only
(transformers/trainer.py@v5.24.0 L645-646); most VLM language models read their own
`text_config.use_cache` (True by default: `merge_with_config_defaults`,
utils/generic.py@v5.24.0 L1106-1146) and, without checkpointing, build a `DynamicCache`
holding every layer's K and V (modeling_qwen3_vl.py@v5.24.0 L781-782). The model's output
holds it through the loss's forward; the Trainer drops the output before the backward.
Checkpointing turns it off (`merge_with_config_defaults` L1134-1146: `use_cache=False` when
`gradient_checkpointing` and training).

The cache costs nothing where its K and V are the tensors attention keeps anyway; it costs
their bytes where attention sees a cast of them: under autocast, K and V computed in fp32 (a
QLoRA base upcast by `prepare_model_for_kbit_training`, whose 4-bit Linears return their fp32
input's dtype; or a k_norm with an fp32 weight that multiplies after the cast, Qwen3's
RMSNorm) are cached in fp32 beside attention's 16-bit copies.
"""

from __future__ import annotations

from vram.model.spec import LayerStack, Mixer, ModelSpec
from vram.result import LineItem
from vram.setup import Method, TrainingSetup
from vram.stacks.profile import StackProfile

SOURCE = ("transformers/trainer.py@v5.24.0 L645-646 (top-level use_cache only); "
          "models/qwen3_vl/modeling_qwen3_vl.py@v5.24.0 L781-782 DynamicCache")


def builds_text_cache(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> bool:
    """The language model fills a cache: its config leaves `use_cache` on, the stack turns off
    the top-level one only, and no checkpointing turns it off."""
    vision = model.vision
    return (vision is not None and vision.text_cache and profile.leaves_text_cache_on
            and not setup.grad_ckpt)


def cached_kv_bytes(stack: LayerStack, setup: TrainingSetup, profile: StackProfile) -> tuple[
        int, int]:
    """Bytes per value of K and V as the cache holds them where they are not attention's own
    tensors (0 where they are): both come out of the projections in the compute dtype; a
    Llama-style k_norm promotes K to its weight's dtype (`weight * x.to(input_dtype)`), a
    Gemma-style one casts back (`norm_scales_in_fp32`)."""
    n = profile.precision
    k = v = n.compute
    if stack.qk_norm and not stack.norm_scales_in_fp32:
        k = max(k, n.weights if setup.method is Method.FULL else n.frozen_weights)
    return (k if k != n.attention else 0), (v if v != n.attention else 0)


def text_cache_bytes(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> int:
    """Σ attention layers × tokens × kv heads × (K bytes × head_dim + V bytes × v_head_dim).
    A sliding-window layer too: it keeps a slice of the whole `torch.cat` of its states, which
    holds the whole storage (cache_utils.py@v5.24.0 DynamicSlidingWindowLayer.update
    L242-247)."""
    if not builds_text_cache(model, setup, profile):
        return 0
    tokens = setup.micro_batch * setup.seq_len
    total = 0
    for stack in model.stacks:
        if stack.mixer is not Mixer.ATTENTION or stack.cross_attention:
            continue
        k, v = cached_kv_bytes(stack, setup, profile)
        width_bytes = k * stack.head_dim + v * (stack.v_head_dim or stack.head_dim)
        total += stack.count * tokens * stack.n_kv_heads * width_bytes
    return total


def text_cache_items(model: ModelSpec, setup: TrainingSetup,
                     profile: StackProfile) -> list[LineItem]:
    """The cache as a line item of the forward's moments (none where it costs nothing)."""
    cache_bytes = text_cache_bytes(model, setup, profile)
    if not cache_bytes:
        return []
    return [LineItem(
        key="activations.text_cache", label="the language model's KV cache (text_config)",
        formula="layers × tokens × kv heads × (K + V bytes not attention's own) × head_dim",
        inputs={"layers": model.n_layers, "tokens": setup.micro_batch * setup.seq_len},
        bytes=cache_bytes, source=SOURCE)]
