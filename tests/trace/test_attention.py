"""Attention in the trace follows CUDA: no causal mask without padding, CUDA's SDPA kernels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vram.model.params import allocated_bytes as rounded  # noqa: E402
from vram.setup import TrainingSetup  # noqa: E402
from vram.trace import attention  # noqa: E402
from vram.trace.step import trace_depth  # noqa: E402
from vram.trace.tracker import StorageTracker  # noqa: E402

pytestmark = pytest.mark.trace

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "models"
SEQ = 8192


def _config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


def _is_sxs(shape: tuple[int, ...], batch: int, seq: int) -> bool:
    """An attention-sized tensor: [B, H, S, S] (mask, scores) or a bmm's [B*H, S, S].

    A 3-D [B, S, S] is an MLP activation when the intermediate size equals S (llama-3.2-1b).
    """
    if len(shape) < 3 or tuple(shape[-2:]) != (seq, seq):
        return False
    return len(shape) >= 4 or shape[0] > batch


def _allocated_shapes(monkeypatch: pytest.MonkeyPatch, config: dict[str, Any],
                      setup: TrainingSetup) -> tuple[list[tuple[int, ...]], Any]:
    """Every tensor shape the step allocates (one block), and the depth-1 raw trace."""
    shapes: list[tuple[int, ...]] = []
    original = StorageTracker.register

    def register(self: StorageTracker, tensor: Any, origin: str = "") -> None:
        if self.recording:
            shapes.append(tuple(tensor.shape))
        original(self, tensor, origin)

    monkeypatch.setattr(StorageTracker, "register", register)
    raw = trace_depth(config, setup, 1)
    return shapes, raw


def _peak_shapes(raw: Any) -> list[tuple[int, ...]]:
    best = max(raw.peaks.values(), key=lambda p: p.live)
    out = []
    for what, _, _ in best.top:
        dims = what.rsplit("[", 1)[1].rstrip("]")
        out.append(tuple(int(d) for d in dims.split(", ") if d))
    return out


def _setup(attn: str, **kw: Any) -> TrainingSetup:
    base: dict[str, Any] = {
        "framework": "hf-trainer", "lora_targets": "q_proj,v_proj", "lora_rank": 16,
        "precision": "bf16-true", "micro_batch": 1, "seq_len": SEQ, "attention": attn,
        "method": "lora", "optimizer": "sgd-momentum",
    }
    base.update(kw)
    return TrainingSetup(**base)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_llama_sdpa_8192_has_no_sxs_tensor(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    shapes, raw = _allocated_shapes(monkeypatch, _config("llama-3.2-1b"),
                                    _setup("sdpa", method=method))
    assert not [s for s in shapes if _is_sxs(s, 1, SEQ)]
    assert not [s for s in _peak_shapes(raw) if _is_sxs(s, 1, SEQ)]
    # GQA stays unexpanded: no [1, 32, S, 64] copies of the 8 kv heads.
    assert (1, 8, SEQ, 64) in shapes and (1, 32, SEQ, 64) in shapes


def test_llama_eager_keeps_its_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    shapes, _ = _allocated_shapes(monkeypatch, _config("llama-3.2-1b"), _setup("eager"))
    assert (1, 32, SEQ, SEQ) in shapes


def test_falcon_flash_8192_has_no_sxs_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = _setup("flash", method="full", optimizer="adamw")
    shapes, raw = _allocated_shapes(monkeypatch, _config("falcon-7b"), setup)
    assert not [s for s in shapes if _is_sxs(s, 1, SEQ)]
    assert not [s for s in _peak_shapes(raw) if _is_sxs(s, 1, SEQ)]
    assert (1, 1, SEQ, 64) in shapes  # the one kv head of multi-query attention, unexpanded


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_falcon_sdpa_and_eager_keep_sxs(monkeypatch: pytest.MonkeyPatch, attn: str) -> None:
    """HF's Falcon always builds a 4-D mask (`allow_is_causal_skip=False`, for ALiBi) and calls
    SDPA with 71 query heads and 1 kv head without `enable_gqa`: no CUDA fused kernel takes
    that (flash: no mask; efficient and cuDNN: equal head counts), so CUDA runs the math
    fallback and keeps fp32 [B, 71, S, S] probabilities, as eager does."""
    setup = _setup(attn, method="full", optimizer="adamw")
    shapes, raw = _allocated_shapes(monkeypatch, _config("falcon-7b"), setup)
    assert (1, 71, SEQ, SEQ) in shapes
    assert (1, 71, SEQ, SEQ) in _peak_shapes(raw)


def test_gemma2_sdpa_is_eager_and_flash_has_no_sxs(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers refuses SDPA for Gemma 2 (`_supports_sdpa = False`: soft-capping)."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2PreTrainedModel

    assert Gemma2PreTrainedModel._supports_sdpa is False
    config = _config("gemma-2-2b")
    shapes, _ = _allocated_shapes(monkeypatch, config, _setup("sdpa", seq_len=2048))
    assert (1, 8, 2048, 2048) in shapes
    shapes, _ = _allocated_shapes(monkeypatch, config, _setup("flash", seq_len=2048))
    assert not [s for s in shapes if _is_sxs(s, 1, 2048)]


def _qkv(heads: int, kv: int, dim: int = 64, dtype: Any = None) -> tuple[Any, Any, Any]:
    dtype = dtype or torch.bfloat16
    return (torch.empty(1, heads, 128, dim, dtype=dtype, device="meta"),
            torch.empty(1, kv, 128, dim, dtype=dtype, device="meta"),
            torch.empty(1, kv, 128, dim, dtype=dtype, device="meta"))


def test_cuda_kernel_choice() -> None:
    mask = torch.empty(1, 1, 128, 128, dtype=torch.bool, device="meta")
    assert attention.cuda_kernel(*_qkv(32, 8), None, True) == "flash"
    assert attention.cuda_kernel(*_qkv(32, 32), None, False) == "flash"
    assert attention.cuda_kernel(*_qkv(32, 8), None, False) == "math"  # no enable_gqa
    assert attention.cuda_kernel(*_qkv(32, 32), mask, False) == "efficient"
    assert attention.cuda_kernel(*_qkv(32, 8), mask, True) == "math"  # efficient: no GQA
    assert attention.cuda_kernel(*_qkv(8, 8, dtype=torch.float32), None, False) == "efficient"
    assert attention.cuda_kernel(*_qkv(8, 8, dim=512), None, False) == "efficient"


def test_fused_sdpa_saves_out_and_logsumexp_only() -> None:
    """Forward leaves q, k, v, out and fp32 logsumexp alive; backward adds dq, dk, dv."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    b, h, kv, s, d = 2, 8, 2, 1024, 64
    with FakeTensorMode():
        q = torch.empty(b, h, s, d, dtype=torch.bfloat16, requires_grad=True)
        k = torch.empty(b, kv, s, d, dtype=torch.bfloat16, requires_grad=True)
        v = torch.empty(b, kv, s, d, dtype=torch.bfloat16, requires_grad=True)
        tracker = StorageTracker()
        with tracker:
            for t in (q, k, v):
                tracker.register(t, "input")
            out = attention.sdpa(q, k, v, is_causal=True, enable_gqa=True)
            inputs = rounded(2 * b * h * s * d) + 2 * rounded(2 * b * kv * s * d)
            assert out.shape == (b, h, s, d)
            # out is q-sized (bf16); logsumexp is fp32 [B, H, S]; nothing else stays.
            saved = rounded(2 * b * h * s * d) + rounded(4 * b * h * s)
            assert tracker.live_bytes == inputs + saved
            out.sum().backward()
            assert q.grad is not None and k.grad is not None
            assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_fused_sdpa_matches_torch_on_real_tensors() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    k = torch.randn(2, 2, 16, 8, requires_grad=True)
    v = torch.randn(2, 2, 16, 8, requires_grad=True)
    ours = attention.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    ref = attention._original_sdpa(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(ours, ref, atol=1e-5)
    grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
    expected = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for got, want in zip(grads, expected, strict=True):
        assert torch.allclose(got, want, atol=1e-4)


def test_routing_is_undone_after_the_trace() -> None:
    from transformers import masking_utils

    def now() -> tuple[Any, ...]:
        return (torch.nn.functional.scaled_dot_product_attention,
                masking_utils.find_packed_sequence_indices,
                masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])

    before = now()
    for attn in ("sdpa", "flash", "eager"):
        with attention.cuda_attention(attn):
            assert now()[1] is not before[1]
            assert (now()[0] is before[0]) == (attn == "eager")
            assert (now()[2] is before[2]) == (attn != "flash")
        assert now() == before
