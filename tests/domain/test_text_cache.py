"""The KV cache a VLM's language model fills in a training forward (`vram.memory.text_cache`).

Qwen3-VL 4B reads `text_config.use_cache` (True); the HF Trainer turns off the top-level one
only. Under bf16-mixed QLoRA the cached K (after the fp32 k_norm) and V (the fp32 4-bit Linear's
output) are fp32 beside attention's bf16 casts: 36 layers × 4,096 tokens × 8 kv heads ×
(4 + 4) × 128 = 1,207,959,552 bytes (1,152 MiB), the trace's gap at the end of the forward
(benchmarks/VLM_TRACE_NOTES.md).
"""

from __future__ import annotations

import pytest

import vram
from vram.memory.text_cache import text_cache_bytes
from vram.result import MomentId
from vram.setup import TrainingSetup
from vram.stacks.profile import profile_for

QLORA = {"method": "qlora", "precision": "bf16-mixed", "seq_len": 4096, "micro_batch": 1,
         "framework": "hf-trainer", "grad_ckpt": False}
CACHE_BYTES = 36 * 4096 * 8 * (4 + 4) * 128


def _setup(**fields: object) -> TrainingSetup:
    return TrainingSetup.model_validate({**QLORA, **fields})


def _cache(model: str, **fields: object) -> int:
    setup = _setup(**fields)
    return text_cache_bytes(vram.load_model(model), setup, profile_for(setup))


def _moments(monkeypatch: pytest.MonkeyPatch | None = None) -> dict[MomentId, int]:
    if monkeypatch is not None:
        monkeypatch.setattr("vram.step.context.text_cache_items", lambda *_: [])
    est = vram.estimate(vram.load_model("qwen3-vl-4b"), _setup())
    return {m.label: m.activation_bytes for m in est.moments}


def test_qwen3_vl_qlora_bf16_mixed_caches_fp32_k_and_v() -> None:
    assert CACHE_BYTES == 1_207_959_552
    assert _cache("qwen3-vl-4b") == CACHE_BYTES


def test_gemma3_sliding_layers_hold_the_whole_sequence() -> None:
    """A sliding layer keeps a view of its last window of a `torch.cat` of all the tokens: the
    whole storage stays (a tiny Gemma 3 in train mode: a (1, 2, 15, 16) view over 64 tokens).
    Gemma 3 4B: 34 layers × 4,096 × 4 kv heads × (4 + 4) × 256; Gemma's k_norm casts back."""
    assert _cache("gemma-3-4b") == 34 * 4096 * 4 * (4 + 4) * 256 == 1_140_850_688


def test_the_cache_is_alive_at_the_end_of_the_forward_not_at_the_loss(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's output holds it through the loss's forward (the end-of-forward moment);
    the Trainer drops it before the backward (the loss moment and after)."""
    with_cache = _moments()
    without = _moments(monkeypatch)
    assert with_cache[MomentId.FORWARD_END] - without[MomentId.FORWARD_END] == CACHE_BYTES
    assert with_cache[MomentId.LOSS] == without[MomentId.LOSS]
    assert with_cache[MomentId.TOP_LAYER_BACKWARD] == without[MomentId.TOP_LAYER_BACKWARD]


@pytest.mark.parametrize("fields", [
    {"grad_ckpt": True},  # merge_with_config_defaults turns use_cache off
    {"framework": "llama-factory"},  # configure_kv_cache: text_config.use_cache=False
    {"framework": "axolotl"},  # check_model_config: get_text_config().use_cache=False
    {"precision": "bf16-true"},  # the cache holds attention's own tensors
    {"method": "lora"},  # bf16 K and V: attention's own
])
def test_no_cache_bytes_where_nothing_builds_one_or_it_is_attentions_own(
        fields: dict[str, object]) -> None:
    assert _cache("qwen3-vl-4b", **fields) == 0


def test_a_text_model_and_idefics3_build_none() -> None:
    assert _cache("qwen3-4b") == 0
    assert _cache("tests/data/families/idefics3.json") == 0
