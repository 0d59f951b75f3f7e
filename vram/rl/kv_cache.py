"""The rollout engine's KV cache in vLLM's own block arithmetic.

vLLM pages the cache in blocks of `block_size` tokens (16 by default). One block of one layer
holds `2 · block_size · kv_heads · head_dim · dtype_bytes` bytes
(`AttentionSpec.real_page_size_bytes`, vllm-project/vllm vllm/v1/kv_cache_interface.py@001cabc1),
a sequence takes ⌈tokens / block_size⌉ blocks in every layer, and the pool holds
`available_memory // page_size // num_layers` blocks (`get_num_blocks`,
vllm/v1/core/kv_cache_utils.py@bbf906a8).
"""

from __future__ import annotations

from vram.model.architecture import ModelSpec
from vram.units import BF16_BYTES, ceil_div

#: vLLM's default `block_size` (tokens per KV block).
VLLM_BLOCK_SIZE = 16


def page_bytes_per_layer(model: ModelSpec, block_size: int = VLLM_BLOCK_SIZE,
                         dtype_bytes: int = BF16_BYTES) -> int:
    """One block of one layer: K and V for `block_size` tokens (vLLM `real_page_size_bytes`)."""
    stack = model.decoder
    return 2 * block_size * stack.n_kv_heads * stack.head_dim * dtype_bytes


def kv_bytes_per_token(model: ModelSpec, dtype_bytes: int = BF16_BYTES) -> int:
    """K and V of one token in every layer: 2 · layers · kv_heads · head_dim · bytes."""
    stack = model.decoder
    return 2 * stack.count * stack.n_kv_heads * stack.head_dim * dtype_bytes


def blocks_per_sequence(tokens: int, block_size: int = VLLM_BLOCK_SIZE) -> int:
    """A sequence of `tokens` occupies ⌈tokens / block_size⌉ blocks (the last one partly)."""
    return ceil_div(tokens, block_size)


def blocks_needed(sequences: int, tokens: int, block_size: int = VLLM_BLOCK_SIZE) -> int:
    """Blocks for `sequences` sequences of `tokens` tokens each, all in flight at once."""
    return sequences * blocks_per_sequence(tokens, block_size)


def kv_cache_bytes(model: ModelSpec, sequences: int, tokens: int,
                   block_size: int = VLLM_BLOCK_SIZE, dtype_bytes: int = BF16_BYTES) -> int:
    """The KV cache for `sequences` × `tokens`, rounded up to whole blocks in every layer."""
    return (blocks_needed(sequences, tokens, block_size) * model.decoder.count
            * page_bytes_per_layer(model, block_size, dtype_bytes))


def pool_blocks(model: ModelSpec, available_bytes: int, block_size: int = VLLM_BLOCK_SIZE,
                dtype_bytes: int = BF16_BYTES) -> int:
    """Blocks a pool of `available_bytes` holds (vLLM `get_num_blocks`)."""
    page = page_bytes_per_layer(model, block_size, dtype_bytes)
    return max(available_bytes // page // model.decoder.count, 0)


def sequences_in_pool(model: ModelSpec, available_bytes: int, tokens: int,
                      block_size: int = VLLM_BLOCK_SIZE) -> int:
    """How many sequences of `tokens` tokens the pool holds at once."""
    return pool_blocks(model, available_bytes, block_size) // blocks_per_sequence(tokens,
                                                                                  block_size)
