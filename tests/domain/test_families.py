"""Architecture families: one table, explicit flags, and the families users bring (issue 9).

Counts are exact (`model.num_parameters()` of the real module); activations are the tensors
PyTorch saves, op by op, for the code each model really runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vram import TrainingSetup, load_model, model_from_config
from vram.errors import ConfigError
from vram.memory.activations import Kernel, attention_kernel, layer_activations
from vram.model.architecture import SUPPORTED_FAMILIES
from vram.model.families import ALIASES, FAMILIES
from vram.stacks.profile import profile_for

VRAM = Path(__file__).resolve().parents[2] / "vram"

QWEN_7B_PUBLISHED = {  # Qwen/Qwen-7B config.json: the shape keys as published
    "model_type": "qwen", "architectures": ["QWenLMHeadModel"], "hidden_size": 4096,
    "intermediate_size": 22016, "kv_channels": 128, "num_attention_heads": 32,
    "num_hidden_layers": 32, "vocab_size": 151936, "no_bias": True, "seq_length": 8192,
    "max_position_embeddings": 8192, "tie_word_embeddings": False,
}


def test_one_table_names_every_supported_family() -> None:
    assert set(SUPPORTED_FAMILIES) == set(FAMILIES) - ALIASES
    assert {"gpt2", "qwen", "llama", "falcon", "t5", "bert"} <= set(SUPPORTED_FAMILIES)
    with pytest.raises(ConfigError, match="'mamba' is not supported; supported: apertus, bert"):
        model_from_config({"model_type": "mamba"})


def test_the_estimator_never_tests_a_family_name() -> None:
    """Behaviour is a flag on the spec (`LayerStack` fields), not `model.family == "..."`."""
    offenders = [
        f"{path.name}:{n}" for path in VRAM.rglob("*.py") if "families" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.family\s*(==|!=|in\b)", line)
    ]
    assert offenders == []


def test_gpt2_counts_like_gpt2lmheadmodel() -> None:
    """124,439,808 = wte 50257·768 + wpe 1024·768 + 12 × 7,087,872 + ln_f 2·768, head tied
    (the per-block figure nanoGPT's transformer_sizing notebook derives)."""
    spec = load_model("gpt2")
    assert spec.decoder.params_per_layer == 7_087_872
    assert spec.n_params == 50257 * 768 + 1024 * 768 + 12 * 7_087_872 + 2 * 768 == 124_439_808
    assert spec.tied_embeddings and spec.head_params == 0


@pytest.mark.parametrize(("slug", "h", "layers", "published"), [
    ("ds-simpletransformer-254m", 1024, 12, 254_128_976),
    ("ds-simpletransformer-6.86b", 4096, 32, 6_855_902_032),  # published as "6.86B"
])
def test_deepspeed_simple_transformer_counts_its_module_definition(
        slug: str, h: int, layers: int, published: int) -> None:
    """DeepSpeedExamples training/bf16_master_weight/train.py@ac3800b7: Embedding(V, h) +
    Embedding(512, h) + blocks of MultiheadAttention (in_proj 3h·h + 3h, out_proj h·h + h),
    two LayerNorms and Linear(h, 4h) / Linear(4h, h), then Linear(h, V) with a bias; no final
    norm."""
    vocab = 50000
    block = (3 * h * h + 3 * h) + (h * h + h) + 2 * 2 * h + (4 * h * h + 4 * h) + (4 * h * h + h)
    assert vocab * h + 512 * h + layers * block + h * vocab + vocab == published
    assert load_model(slug).n_params == published


def test_qwen_v1_reads_the_published_config_and_the_validation_form_alike() -> None:
    """QWenMLP: w1 and w2 are `intermediate_size // 2` wide; c_attn has a bias, c_proj not."""
    published = model_from_config(QWEN_7B_PUBLISHED)
    assert published.n_params == load_model("qwen-7b").n_params == 7_721_324_544
    assert published.decoder.intermediate_size == 11008
    assert {ln.name: ln.bias for ln in published.decoder.linears} == {
        "attn.c_attn": True, "attn.c_proj": False, "mlp.w2": False, "mlp.w1": False,
        "mlp.c_proj": False}
    assert load_model("qwen-14b").n_params == 14_167_290_880
    assert load_model("qwen-1_8b").n_params == 1_836_828_672


def test_qwen_v1_refuses_a_contradicting_width() -> None:
    config = {**QWEN_7B_PUBLISHED, "intermediate_size": 22016,
              "qwen_published_intermediate_size": 22016}
    with pytest.raises(ConfigError, match=r"intermediate_size.*11,008"):
        model_from_config(config)


def test_post_norm_multihead_block_keeps_34h_plus_its_probabilities() -> None:
    """One SimpleTransformerBlock in bf16 (no autocast), per token, op by op
    (torch/nn/functional.py@v2.13.0 multi_head_attention_forward, need_weights=True):
    in_proj's input (a copy: the batch-first input is transposed) 2h, the packed q, k, v 6h
    (k and v are saved views of it), q_scaled 2h, softmax's output 2·heads·s, out_proj's
    contiguous input 2h; norm1 and norm2 keep their inputs and fp32 mean and rstd (2h + 8
    each); ff.0's input 2h, GELU's input 8h, ff.2's input 8h. That is Korthikanti et al.'s
    34·h, here without dropout masks and with 16-bit probabilities."""
    spec = load_model("ds-simpletransformer-254m")
    setup = TrainingSetup(method="full", precision="bf16-true", micro_batch=4, seq_len=512,
                          attention="sdpa", framework="other")
    profile = profile_for(setup)
    # need_weights=True: explicit softmax(q·kᵀ) even when the setup asks for SDPA
    assert attention_kernel(spec, spec.decoder, setup, profile) is Kernel.EAGER
    layer = layer_activations(spec, spec.decoder, setup, profile)
    h, heads, s = 1024, 16, 512
    assert layer.bytes_per_token == 34 * h + 16 + 2 * heads * s


def test_gpt2_block_keeps_what_its_eager_attention_and_gelu_new_save() -> None:
    """HF GPT-2 (modeling_gpt2.py@v5.24.0), bf16, eager: ln_1 (2h + 8), c_attn's input 2h,
    its q, k, v output 6h, per score softmax's output (2), dropout's mask (1) and the dropped
    probabilities (2), c_proj's contiguous input 2h, resid_dropout's mask h; ln_2 (2h + 8),
    c_fc's input 2h, gelu_new's four I-wide tensors 32h, c_proj's input 8h, dropout's mask h."""
    spec = load_model("gpt2")
    setup = TrainingSetup(method="full", precision="bf16-true", micro_batch=1, seq_len=1024,
                          attention="eager", framework="hf-trainer")
    layer = layer_activations(spec, spec.decoder, setup, profile_for(setup))
    h, heads, s = 768, 12, 1024
    assert layer.bytes_per_token == 58 * h + 16 + 5 * heads * s
    assert {t.key for t in layer.terms} >= {"dropout", "mlp", "attention"}


def test_olmoe_counts_its_safetensors_total() -> None:
    """allenai/OLMoE-1B-7B-0924: 6,919,161,856 parameters (HF safetensors metadata). Per layer:
    q, k, v, o (4·h²), full-width q and k norms (2·h), the router (64·h), 64 experts of
    three h x 1024 matrices, two RMSNorms; untied head."""
    h, experts, inter, vocab = 2048, 64, 1024, 50304
    layer = 4 * h * h + 2 * h + experts * h + experts * 3 * h * inter + 2 * h
    assert 2 * vocab * h + 16 * layer + h == 6_919_161_856
    spec = load_model("olmoe-1b-7b-0924")
    assert spec.n_params == 6_919_161_856
    assert (spec.decoder.n_experts, spec.decoder.experts_per_token) == (64, 8)


def test_deepseek_v2_lite_counts_mla_and_its_experts() -> None:
    """deepseek-ai/DeepSeek-V2-Lite: 15,706,484,224 parameters. MLA per layer: q_proj
    h x 16·192, kv_a_proj_with_mqa h x (512 + 64), kv_a_layernorm 512, kv_b_proj 512 x
    16·(128 + 128), o_proj 16·128 x h; layer 0 has a dense MLP of 10,944, layers 1-26 a router
    (64 x h), 64 experts of three h x 1,408 matrices and 2 shared experts (one MLP of 2,816)."""
    h, vocab = 2048, 102400
    attention = h * 16 * 192 + h * 576 + 512 + 512 * 16 * 256 + 16 * 128 * h + 2 * h
    dense = 3 * h * 10944
    moe = 64 * h + 64 * 3 * h * 1408 + 3 * h * 2816
    assert 2 * vocab * h + 27 * attention + dense + 26 * moe + h == 15_706_484_224
    spec = load_model("deepseek-v2-lite")
    assert spec.n_params == 15_706_484_224
    assert [(st.name, st.count) for st in spec.stacks] == [("dense", 1), ("moe", 26)]


def test_mla_attention_keeps_q_k_and_v_at_their_own_widths() -> None:
    """SDPA's flash kernel keeps q and k (heads·192), v and the output (heads·128) and a
    logsumexp; o_proj reads the output as it is. v is a view of kv_b_proj's output, whose
    k_nope half (heads·128) stays alive with it."""
    spec = load_model("deepseek-v2-lite")
    setup = TrainingSetup(method="full", precision="bf16-true", micro_batch=1, seq_len=4096,
                          attention="flash", framework="hf-trainer")
    layer = layer_activations(spec, spec.stacks[0], setup, profile_for(setup))
    terms = {t.key: t.bytes_per_token for t in layer.terms}
    heads = 16
    assert terms["attention"] == 2 * (heads * 192 * 2 + heads * 128 * 2) + 4 * heads
    # latent norm (fp32 copy + normalized), kv_b's input, the k_nope half, the rotated k_pe
    assert terms["mla"] == 4 * 512 + 2 * 512 + 2 * 512 + 2 * heads * 128 + 2 * 64


def test_deepseek_v3_compresses_queries_too() -> None:
    """DeepSeek-V3: 671,026,404,352 parameters without the MTP module (model card: 671B).
    q goes through a 1,536-wide latent (q_a_proj, q_a_layernorm, q_b_proj), whose norm and
    up-projection input are kept like the k/v latent's."""
    h, vocab, heads = 7168, 129280, 128
    attention = (h * 1536 + 1536 + 1536 * heads * 192 + h * 576 + 512 + 512 * heads * 256
                 + heads * 128 * h + 2 * h)
    moe = 256 * h + 256 * 3 * h * 2048 + 3 * h * 2048
    total = 2 * vocab * h + 61 * attention + 3 * 3 * h * 18432 + 58 * moe + h
    assert total == load_model("deepseek-v3").n_params == 671_026_404_352
    spec = load_model("deepseek-v3")
    setup = TrainingSetup(method="full", precision="bf16-true", micro_batch=1, seq_len=4096,
                          attention="flash", framework="hf-trainer")
    mla = {t.key: t.bytes_per_token for t in
           layer_activations(spec, spec.stacks[0], setup, profile_for(setup)).terms}["mla"]
    latent = 4 + 2 + 2  # fp32 norm copy, normalized latent, up-projection input, per unit
    assert mla == latent * (512 + 1536) + 2 * heads * 128 + 2 * 64
