"""Golden numbers from papers and published recipes."""

from __future__ import annotations

import pytest

from vram import TrainingSetup, estimate, load_model, model_from_config
from vram.memory.activations import layer_activations
from vram.memory.optimizer import optimizer_state
from vram.model.params import Storage, param_groups, quantized_bytes
from vram.stacks.profile import profile_for

GB = 10**9


def _llama(n_layers: int = 80) -> dict[str, object]:
    return {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
            "num_hidden_layers": n_layers, "num_attention_heads": 64,
            "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}


def test_70b_in_the_12_byte_recipe() -> None:
    """bf16 weights, bf16 gradients, fp32 AdamW states with no master: 2 + 2 + 8 bytes per
    parameter; 70B -> 140 GB + 140 GB + 560 GB = 840 GB (domain.md, the seeds)."""
    spec = load_model("llama-3.1-70b")
    setup = TrainingSetup(method="full", precision="bf16-true")
    groups = param_groups(spec, setup, profile_for(setup))
    n = spec.n_params
    assert sum(g.bytes for g in groups) == 2 * n  # 141.1 GB for 70.55B
    fp32_states = [g.__class__(g.key, g.label, g.n_params, Storage.FP32, True, 4 * g.n_params)
                   for g in groups]
    state = optimizer_state(fp32_states, setup, fused=True)
    assert state.state_bytes == 8 * n
    per_70b = 70 * 10**9
    assert (2 + 2 + 8) * per_70b == 840 * GB


def test_7b_at_16_bytes_per_parameter_is_112_gb() -> None:
    """fp32 weights + fp32 gradients + AdamW's two fp32 states: 16 B/param (7B -> 112 GB)."""
    spec = load_model("llama-2-7b")
    result = estimate(spec, TrainingSetup(method="full", precision="fp32", optimizer="adamw"))
    assert result.state_bytes == 16 * spec.n_params
    assert 107 * GB < result.state_bytes < 109 * GB  # 6.74B parameters


def test_zero_paper_mixed_precision_adam_is_16_bytes_and_shards() -> None:
    """Rajbhandari et al. 2020 (ZeRO), §3.1: mixed-precision Adam keeps 2 + 2 + 12 = 16 bytes
    per parameter; ZeRO-3 over N_d GPUs divides all of it (Figure 1: 7.5B, N_d = 64)."""
    spec = model_from_config(_llama(n_layers=8))
    n = spec.n_params
    one = estimate(spec, TrainingSetup(method="full", precision="bf16-mixed", n_gpus=2,
                                       sharding="zero1"))
    # ZeRO-1 with bf16-mixed: 2 B weights + 2 B grads on every GPU, 12 B (states + master) / N
    assert abs(one.state_bytes - (2 * n + 2 * n + 12 * n // 2)) <= 64
    sharded = estimate(spec, TrainingSetup(method="full", precision="bf16-mixed", n_gpus=64,
                                           sharding="zero3"))
    gathered = next(i.bytes for i in sharded.bucket("weights").items
                    if i.key == "weights.gathered")
    assert abs(sharded.state_bytes - gathered - 16 * n // 64) <= 64


def test_qlora_storage_matches_bitsandbytes() -> None:
    """NF4: 0.5 B/param + fp32 absmax per 64 values; double quantization: 8-bit absmax +
    fp32 per 256 absmax (Dettmers et al. 2023, §2: 0.5 and 0.127 bits of constants)."""
    numel = 4096 * 4096
    nf4 = quantized_bytes(numel, 4096, Storage.NF4)
    dq = quantized_bytes(numel, 4096, Storage.NF4_DQ)
    assert nf4 == numel // 2 + 4 * numel // 64
    assert (nf4 - numel / 2) * 8 / numel == pytest.approx(0.5)
    assert (dq - numel / 2) * 8 / numel == pytest.approx(0.127, abs=0.002)


def test_lora_trainable_counts_match_published_runs() -> None:
    """LitGPT's printouts (resource-tables.md): phi-1.5 q,v r8 -> 1,572,864; Llama-2-7B
    -> 4,194,304; StableLM-3B -> 2,097,152; Llama-2-13B -> 6,553,600."""
    expected = {"phi-1_5": 1_572_864, "llama-2-7b": 4_194_304,
                "stablelm-base-alpha-3b": 2_097_152, "llama-2-13b": 6_553_600}
    for slug, trainable in expected.items():
        setup = TrainingSetup(method="lora", lora_rank=8, lora_targets="q_proj,v_proj",
                              precision="bf16-true", framework="litgpt")
        assert estimate(load_model(slug), setup).params.trainable == trainable, slug


def test_litgpt_unties_the_head() -> None:
    """LitGPT keeps a separate lm_head: +262,668,288 parameters for Llama 3.2 1B (SOURCES.md)."""
    spec = load_model("llama-3.2-1b")
    setup = TrainingSetup(method="full", precision="bf16-true", framework="litgpt")
    hf = TrainingSetup(method="full", precision="bf16-true", framework="hf-trainer")
    litgpt_weights = sum(g.n_params for g in param_groups(spec, setup, profile_for(setup)))
    hf_weights = sum(g.n_params for g in param_groups(spec, hf, profile_for(hf)))
    assert litgpt_weights - hf_weights == 262_668_288


def test_korthikanti_activation_order_of_magnitude() -> None:
    """Korthikanti et al. 2022 (§4.1): s·b·h·34 bytes per GPT layer in 16 bits, attention
    scores aside. A Llama layer (gated MLP of 2.7·h, fp32 norm copies) keeps more, by the same
    bookkeeping: 12h (norms) + 4h (Linear inputs) + 8h (q, k, v and the flash output, which
    feeds o_proj as it is) + 8·I (MLP) = 45.5·h."""
    spec = load_model("llama-2-7b")
    setup = TrainingSetup(method="full", precision="bf16-true", micro_batch=1, seq_len=2048,
                          attention="flash", framework="hf-trainer")
    layer = layer_activations(spec, spec.decoder, setup, profile_for(setup))
    h, inter, heads = 4096, 11008, 32
    assert layer.bytes_per_token == 12 * h + 4 * h + 8 * h + 4 * heads + 8 * inter
    assert 34 * h < layer.bytes_per_token < 80 * h


def test_kv_cache_formula() -> None:
    """2 · layers · kv_heads · head_dim · 2 B · batch · tokens (Llama 3 8B: 128 KiB/token)."""
    spec = load_model("llama-3.1-8b")
    result = estimate(spec, TrainingSetup(method="full", micro_batch=1, seq_len=1024))
    kv = next(i.bytes for i in result.inference.items if i.key == "inference.kv_cache")
    assert kv == 2 * 32 * 8 * 128 * 2 * 1024 == 128 * 1024 * 1024


def test_tied_embedding_gradient_is_summed_from_two_contributions() -> None:
    """A leaf used twice (Llama-3.2-1B's tied embedding/head) gets one .grad: the head's
    contribution waits in autograd's input buffer from the top of backward, the embedding's is
    built last and added into it in place (`InputBuffer::accumulate` runs `old.add_(new)` on a
    GPU). At the embedding's backward two V × h fp32 tensors are alive beside every other
    gradient (the exact trace: the mm and embedding_dense_backward outputs, 1.05 GB each)."""
    spec = load_model("llama-3.2-1b")
    setup = TrainingSetup(method="full", optimizer="sgd-momentum", precision="fp32",
                          seq_len=2048, grad_ckpt=True)
    result = estimate(spec, setup)
    embed = next(m for m in result.moments if m.label == "the embedding's backward")
    vh = 128256 * 2048 * 4
    assert embed.activation_bytes == 2 * vh
    assert embed.gradient_bytes == 4 * spec.n_params - vh
    top = next(m for m in result.moments if m.label == "the top layer's backward")
    # In the top layer's backward only that layer's gradients are .grad; the head's waits.
    per_layer = 4 * (spec.n_params - 128256 * 2048) // 16  # the final norm spread over layers
    assert top.gradient_bytes == per_layer
