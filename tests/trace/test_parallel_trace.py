"""The parallel trace prototype (issue 23) counts what each mechanism keeps, to the byte.

A tiny Llama (hidden 256, 8 heads, 2 kv heads, vocab 512) on fake tensors: each test computes
a figure two ways, from the shapes (what the mechanism must hold, by its source) and from the
trace, and asserts they are equal.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vram.setup import TrainingSetup  # noqa: E402
from vram.trace.parallel import ParallelSpec, trace_parallel_depth  # noqa: E402

pytestmark = pytest.mark.trace

H, FFN, HEADS, KV, VOCAB = 256, 512, 8, 2, 512
D = H // HEADS
CONFIG: dict[str, Any] = {
    "model_type": "llama", "vocab_size": VOCAB, "hidden_size": H, "intermediate_size": FFN,
    "num_hidden_layers": 2, "num_attention_heads": HEADS, "num_key_value_heads": KV,
    "tie_word_embeddings": False, "max_position_embeddings": 65536, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
}
BF16 = 2


def setup(seq: int = 1024, **kw: Any) -> TrainingSetup:
    fields: dict[str, Any] = {"method": "full", "precision": "bf16-true", "micro_batch": 1,
                              "seq_len": seq, "grad_ckpt": False, "attention": "sdpa",
                              "optimizer": "adamw", "framework": "torchtitan"}
    fields.update(kw)
    return TrainingSetup(**fields)


def block_params() -> tuple[int, int]:
    """(split by TP, replicated) parameters of one block."""
    split = H * H * 2 + 2 * H * KV * D + 3 * H * FFN  # q, o, k, v, gate, up, down
    return split, 2 * H  # the two norms


def test_tp_shards_linears_and_splits_embedding_and_head_by_vocabulary() -> None:
    tp, layers = 2, 2
    raw = trace_parallel_depth(CONFIG, setup(), ParallelSpec(tp=tp), layers).raw
    split, replicated = block_params()
    expected = BF16 * (layers * (split // tp + replicated) + 2 * VOCAB * H // tp + H)
    expected += 2 * 512  # rotary inv_freq and original_inv_freq buffers: one block each
    weights = {p.buckets["weights"] for p in raw.peaks.values()}
    assert weights == {expected}


def test_tp_needs_whole_heads_per_rank() -> None:
    from vram.trace.build import TraceUnsupported

    with pytest.raises(TraceUnsupported, match="tp: 4 must divide"):
        trace_parallel_depth(CONFIG, setup(), ParallelSpec(tp=4), 2)


def test_ring_all_gathers_every_ranks_keys_and_values() -> None:
    """PyTorch's ring (`_RotateMethod.ALL_GATHER`) holds all `s` tokens' k and v. A model
    with wide k/v and a narrow MLP and vocabulary, so the gathered block is among the largest
    tensors alive (the trace lists the twelve largest)."""
    seq, cp = 4096, 4
    wide = {**CONFIG, "num_key_value_heads": HEADS, "intermediate_size": 64, "vocab_size": 64}
    raw = trace_parallel_depth(wide, setup(seq), ParallelSpec(cp=cp), 2).raw
    gathered = [size for peak in raw.peaks.values() for what, size, _ in peak.top
                if what.startswith("all_gather_into_tensor")]
    assert max(gathered) == 2 * seq * HEADS * D * BF16  # k and v of all ranks


def test_offload_sends_one_block_input_per_layer_to_the_host() -> None:
    """Under checkpointing the offload hooks see each block's input only: one more block,
    one more `s h` 16-bit tensor of pinned host memory."""
    seq = 2048
    spec = ParallelSpec(offload_activations=True)
    host = [trace_parallel_depth(CONFIG, setup(seq, grad_ckpt=True), spec, n).host_peak_bytes
            for n in (7, 8)]
    assert host[1] - host[0] == seq * H * BF16


def test_pipeline_stage_preallocates_a_gradient_buffer_per_micro_batch() -> None:
    from vram.trace.pipeline import PipelineSpec, trace_stage_depth

    seq, m = 1024, 4
    raw = trace_stage_depth(CONFIG, setup(seq), ParallelSpec(),
                            PipelineSpec(pp=2, microbatches=m), 1).raw
    split, replicated = block_params()
    weights = BF16 * (split + replicated + VOCAB * H)  # stage 0: one block and the embedding
    ids = m * seq * 8  # the step's input ids, int64
    assert raw.peaks[("setup",)].buckets["activations"] == m * seq * H * BF16 + ids
    assert raw.peaks[("setup",)].buckets["weights"] == weights


def test_offload_of_the_loss_follows_the_stack() -> None:
    """TRL wraps `model(**inputs)`, whose loss the model computes inside: its saved fp32
    log-softmax (`s x V`, saved by log_softmax and again by nll_loss: TRL sends the storage
    once) and the shifted labels (`s` int64) go to the host too; torchtune offloads the
    model's forward only. TRL also sends the final RMSNorm's fp32 input (`s h`) and its
    rsqrt (`s`) once, where torchtune sends them for each op that saves them (pow and mul)."""
    seq = 2048
    host = [trace_parallel_depth(CONFIG, setup(seq, grad_ckpt=True),
                                 ParallelSpec(offload_activations=True, offload_style=style),
                                 2).host_peak_bytes for style in ("torchtune", "trl")]
    assert host[1] - host[0] == seq * VOCAB * 4 + seq * 8 - seq * H * 4 - seq * 4
