"""Serving the same model, for the training-versus-inference comparison.

Weights in the serving dtype (16-bit, or the quantized format for QLoRA), the KV cache for
batch × sequence (`2 · layers · kv_heads · head_dim · bytes · batch · tokens`, Pope et al. 2022,
"Efficiently Scaling Transformer Inference", §2), one layer's working activations and the last
token's logits.
"""

from __future__ import annotations

from vram.memo import memoized
from vram.model.architecture import ModelSpec
from vram.model.params import STORAGE_BYTES, Storage, quantized_bytes
from vram.result import InferenceEstimate, LineItem
from vram.setup import Quant, TrainingSetup
from vram.units import FP32_BYTES as FP32


def _weights_item(model: ModelSpec, quant: Quant) -> LineItem:
    """The served weights: 16-bit, or the layers' Linears in the quantized format."""
    e = 2
    if quant is Quant.NONE:
        weights = model.n_params * e
        w_formula = "params × 2 B (16-bit)"
    else:
        storage = Storage(quant.value)
        weights = (model.n_params - sum(
            s.count * ln.weight_params for s in model.stacks for ln in s.linears)) * e
        weights += sum(
            s.count * ln.copies * quantized_bytes(ln.d_in * ln.d_out, ln.d_out, storage)
            for s in model.stacks for ln in s.linears)
        w_formula = (f"layer Linears in {quant.value} ({STORAGE_BYTES[storage]:.3f} B/param), "
                     "rest 2 B")
    return LineItem(key="inference.weights", label="weights", formula=w_formula,
                    inputs={"params": model.n_params}, bytes=weights)


def _per_token(model: ModelSpec) -> tuple[int, int]:
    """The KV cache's bytes per token over every layer, and the widest layer activation."""
    e = 2
    kv = sum(2 * s.count * s.n_kv_heads * s.head_dim * e for s in model.stacks)
    widest = max(max(s.intermediate_size * max(1, s.experts_per_token), s.n_heads * s.head_dim)
                 for s in model.stacks)
    return kv, widest


def inference_estimate(model: ModelSpec, setup: TrainingSetup) -> InferenceEstimate:
    """Memory to serve `model` for `setup.micro_batch` sequences of `setup.seq_len` tokens.
    It reads nothing else of the setup but the quantization, so it is remembered per model
    for those three (a sweep over training knobs builds it once per batch shape)."""
    quant = setup.effective_quant
    return memoized(model, ("inference", quant, setup.micro_batch, setup.seq_len),
                    lambda: _inference(model, quant, setup.micro_batch, setup.seq_len))


def _inference(model: ModelSpec, quant: Quant, batch: int, seq_len: int) -> InferenceEstimate:
    e = 2
    tokens = batch * seq_len
    weights = memoized(model, ("inference.weights", quant), lambda: _weights_item(model, quant))
    kv_per_token, widest = memoized(model, "inference.per_token", lambda: _per_token(model))
    kv = kv_per_token * tokens
    working = 3 * e * tokens * widest
    logits = FP32 * batch * model.vocab_size
    items = (
        weights,
        LineItem.assemble("inference.kv_cache", "KV cache",
                          "2 · layers · kv_heads · head_dim · 2 B · batch · tokens",
                          {"batch": batch, "tokens": seq_len}, kv, "Pope et al. 2022, §2"),
        LineItem.assemble("inference.working", "one layer's working activations",
                          "3 · 2 B · tokens · max(I, q width)", {"tokens": tokens}, working),
        LineItem.assemble("inference.logits", "last-token logits (fp32)",
                          "4 B · batch · vocab", {"vocab": model.vocab_size}, logits),
    )
    return InferenceEstimate.assemble(items)
