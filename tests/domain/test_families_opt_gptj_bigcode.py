"""OPT, GPT-J and GPT-BigCode (issue 9): exact counts, and what their blocks keep.

Counts are `AutoModelForCausalLM.from_config(cfg)` on the meta device, summed `p.numel()`, at
transformers 5.24.0; each is also written out below as the modules' shapes add up.
"""

from __future__ import annotations

import pytest

from vram import TrainingSetup, load_model, model_from_config
from vram.errors import ConfigError
from vram.memory.activations import layer_activations
from vram.model.architecture import SUPPORTED_FAMILIES
from vram.stacks.profile import profile_for


def _opt_block(h: int, ffn: int) -> int:
    """q, k, v, out_proj (h x h + h each), fc1, fc2 with biases, two LayerNorms."""
    return 4 * (h * h + h) + (h * ffn + ffn) + (ffn * h + h) + 2 * 2 * h


@pytest.mark.parametrize(("slug", "h", "ffn", "layers", "published"), [
    ("opt-125m", 768, 3072, 12, 125_239_296),
    ("opt-1.3b", 2048, 8192, 24, 1_315_758_080),
    ("opt-6.7b", 4096, 16384, 32, 6_658_473_984),
    ("opt-66b", 9216, 36864, 64, 65_719_701_504),
])
def test_pre_layernorm_opt_counts_like_optforcausallm(
        slug: str, h: int, ffn: int, layers: int, published: int) -> None:
    """embed_tokens 50272·h + positions (2048 + 2)·h + blocks + final LayerNorm; tied head."""
    assert 50272 * h + 2050 * h + layers * _opt_block(h, ffn) + 2 * h == published
    spec = load_model(slug)
    assert spec.n_params == published
    assert spec.tied_embeddings and spec.head_params == 0


def test_opt_350m_counts_its_projections_and_has_no_final_norm() -> None:
    """facebook/opt-350m: word_embed_proj_dim 512 (embed_tokens 50272 x 512, project_in
    512 x 1024, project_out 1024 x 512, no bias), post-LayerNorm blocks, no final norm."""
    h, word = 1024, 512
    expected = 50272 * word + 2050 * h + 2 * word * h + 24 * _opt_block(h, 4096)
    assert expected == 331_196_416
    spec = load_model("opt-350m")
    assert spec.n_params == 331_196_416
    assert spec.decoder.post_norm


def test_gpt_j_6b_counts_like_gptjforcausallm() -> None:
    """EleutherAI/gpt-j-6b: wte 50400 x 4096, 28 blocks of q, k, v, out_proj without bias,
    fc_in / fc_out with biases and one ln_1, ln_f, an untied lm_head with a bias."""
    h, vocab = 4096, 50400
    block = 4 * h * h + (h * 4 * h + 4 * h) + (4 * h * h + h) + 2 * h
    assert vocab * h + 28 * block + 2 * h + (vocab * h + vocab) == 6_050_882_784
    spec = load_model("gpt-j-6b")
    assert spec.n_params == 6_050_882_784
    assert spec.decoder.parallel_residual and spec.decoder.n_norms == 1


def test_opt_and_gptj_are_known_model_types() -> None:
    assert {"opt", "gptj"} <= set(SUPPORTED_FAMILIES)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_relu_keeps_one_tensor_that_fc2_shares(method: str) -> None:
    """OPT's fc1 -> ReLU -> fc2 (modeling_opt.py@v5.24.0): ReLU's backward reads its output
    (`threshold_backward(grad, result, 0)`), the very tensor fc2 keeps as its input, so the
    MLP keeps one I-wide bf16 tensor whether fc2 keeps its input (full) or not (LoRA)."""
    spec = load_model("opt-125m")
    setup = TrainingSetup(method=method, precision="bf16-true", micro_batch=1, seq_len=1024,
                          attention="sdpa", framework="hf-trainer")
    layer = layer_activations(spec, spec.decoder, setup, profile_for(setup))
    mlp = {t.key: t.bytes_per_token for t in layer.terms}["mlp"]
    assert mlp == 2 * 3072


def test_gelu_new_in_gptj_keeps_its_four_tensors_and_fc_out_input() -> None:
    """GPT-J's `gelu_new` is the Python tanh formula (four I-wide tensors kept), and fc_out
    keeps its own input in a full fine-tune: 5 x 2 bytes x 16384 per token."""
    spec = load_model("gpt-j-6b")
    setup = TrainingSetup(method="full", precision="bf16-true", micro_batch=1, seq_len=1024,
                          attention="sdpa", framework="hf-trainer")
    layer = layer_activations(spec, spec.decoder, setup, profile_for(setup))
    assert {t.key: t.bytes_per_token for t in layer.terms}["mlp"] == 5 * 2 * 16384


@pytest.mark.parametrize(("config", "field"), [
    ({"model_type": "opt", "hidden_size": 1000, "num_attention_heads": 12, "ffn_dim": 4000,
      "num_hidden_layers": 2, "vocab_size": 100}, "num_attention_heads"),
    ({"model_type": "opt", "hidden_size": 768, "num_attention_heads": 12,
      "num_hidden_layers": 2, "vocab_size": 100}, "ffn_dim"),
    ({"model_type": "gptj", "n_embd": 1000, "n_head": 12, "n_layer": 2, "vocab_size": 100},
     "n_head"),
])
def test_bad_opt_and_gptj_configs_name_the_field(config: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        model_from_config(config)


@pytest.mark.parametrize(("slug", "h", "layers", "ffn", "positions", "vocab", "published"), [
    ("starcoder", 6144, 40, 24576, 8192, 49152, 15_517_456_384),
    ("starcoderbase-1b", 2048, 24, 8192, 8192, 49152, 1_137_207_296),
    ("gpt_bigcode-santacoder", 2048, 24, 8192, 2048, 49280, 1_124_886_528),
])
def test_gpt_bigcode_counts_multi_query_blocks(slug: str, h: int, layers: int, ffn: int,
                                               positions: int, vocab: int, published: int) -> None:
    """GPTBigCodeForCausalLM (modeling_gpt_bigcode.py@v5.24.0): wte, wpe, blocks of c_attn
    h x (h + 2·head_dim) for one shared k/v head, c_proj, c_fc / c_proj, all with biases,
    ln_1, ln_2; ln_f; tied head."""
    head_dim = h // {6144: 48, 2048: 16}[h]
    qkv = h + 2 * head_dim
    block = (h * qkv + qkv) + (h * h + h) + (h * ffn + ffn) + (ffn * h + h) + 4 * h
    assert vocab * h + positions * h + layers * block + 2 * h == published
    spec = load_model(slug)
    assert spec.n_params == published
    assert spec.decoder.n_kv_heads == 1
    assert spec.buffer_bytes == positions * positions  # GPTBigCodeModel.bias, torch.bool


def test_gpt_bigcode_weights_bucket_holds_its_causal_mask_buffer() -> None:
    """The n_positions² bool buffer sits on the GPU beside the parameters: the weights bucket
    is the bf16 parameters plus 8192² bytes (the trace's weights: +0.00 % with it, -2.9 %
    without, on starcoderbase-1b)."""
    from vram import estimate
    spec = load_model("starcoderbase-1b")
    setup = TrainingSetup(method="full", precision="bf16-true", micro_batch=1, seq_len=512,
                          framework="hf-trainer")
    weights = estimate(spec, setup).bucket_bytes["weights"]
    assert weights == 2 * 1_137_207_296 + 8192 * 8192
