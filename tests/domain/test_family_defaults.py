"""Issue 22's 34 model types load, estimate and count exactly what transformers counts.

`tests/data/families/<type>.json` is each type's default config in transformers 5.24.0 and
`counts.csv` its parameter count with the class a fine-tuner loads, on the meta device
(`benchmarks/family_defaults.py` regenerates both; a VLM counts its vision tower).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from vram import TrainingSetup, estimate, load_model
from vram.errors import ConfigError
from vram.model.spec import Mixer, MixerSaved

DATA = Path(__file__).resolve().parents[1] / "data" / "families"
MODELS = Path(__file__).resolve().parents[2] / "data" / "models"
with (DATA / "counts.csv").open(newline="") as _handle:
    COUNTS = {row["model_type"]: int(row["params"]) for row in csv.DictReader(_handle)}


def _config(model_type: str) -> dict[str, object]:
    config: dict[str, object] = json.loads((DATA / f"{model_type}.json").read_text())
    return config


def test_the_issue_lists_34_types() -> None:
    assert len(COUNTS) == 34


@pytest.mark.parametrize("model_type", sorted(COUNTS))
def test_default_config_count_is_transformers_count(model_type: str) -> None:
    assert load_model(_config(model_type)).n_params == COUNTS[model_type]


@pytest.mark.parametrize("model_type", sorted(COUNTS))
def test_default_config_estimates(model_type: str) -> None:
    spec = load_model(_config(model_type))
    for method in ("full", "lora", "qlora"):
        setup = TrainingSetup(method=method, precision="bf16-mixed", micro_batch=1,
                              seq_len=1024, grad_ckpt=True, lora_targets="all-linear")
        result = estimate(spec, setup)
        assert result.allocated_peak_bytes > result.bucket_bytes["weights"] > 0
        # a hybrid's unmodelled parts, or a VLM's, are said: never a silent number
        assert result.approximate == spec.approximate
        if spec.approximate:
            assert any(spec.family in note for note in result.notes)


def test_hybrid_layers_keep_their_mixer_not_attention() -> None:
    spec = load_model(_config("qwen3_next"))
    kinds = {stack.name: stack.mixer for stack in spec.stacks}
    assert kinds == {"linear_attention": Mixer.GATED_DELTANET, "full_attention": Mixer.ATTENTION}
    assert [s.count for s in spec.stacks] == [36, 12]
    deltanet = spec.stacks[0]
    # per token, bf16: the conv's input and fla's q/k/v (2·conv_dim), A and beta (65·nv), z
    # (nv·dv): 16,384 + 2,080 + 4,096; fp32: g (nv), q/k rstd (2·nk), the gated norm's input,
    # z and SiLU(z) (3·nv·dv) and rstd (nv); trained: the norm's normalized input, g's softplus
    # (fp32 nv); out_proj's input when it trains
    assert deltanet.mixer_saved == MixerSaved(
        token=2 * 8192 + 65 * 32 + 32 * 128, token_fp32=2 * 32 + 2 * 16 + 3 * 32 * 128 + 32,
        trained=32 * 128, trained_fp32=32, linear_inputs=32 * 128)


def test_a_vlm_counts_its_vision_tower_and_projector() -> None:
    spec = load_model(MODELS / "qwen2.5-vl-7b.json")
    assert spec.n_params == 8_292_166_656
    # Qwen2.5-VL-7B: 32 blocks of 1280 with a 3420 gated MLP, the 5120 -> 3584 merger
    assert spec.projector_params == 1280 + 5120 * 5120 + 5120 + 5120 * 3584 + 3584
    weights = estimate(spec, TrainingSetup(method="full", precision="bf16-true",
                                           seq_len=512)).bucket_bytes["weights"]
    assert weights == 2 * spec.n_params


def test_every_new_catalog_config_counts_exactly() -> None:
    checked = 0
    for name in ("catalog.csv",):
        with (MODELS / name).open(newline="") as handle:
            for row in csv.DictReader(handle):
                if row["params_source"].startswith("transformers 5.24.0 meta-device count"):
                    assert load_model(MODELS / f"{row['slug']}.json").n_params == int(
                        row["params"]), row["slug"]
                    checked += 1
    assert checked == 47


def test_internvit_6b_counts_and_keeps_its_q_k_norms() -> None:
    # InternVL3-78B's InternViT-6B: a 3200-wide RMSNorm on q and one on k in each of 45 blocks
    # (transformers' count 78,408,318,336 = InternVL2.5-78B's published safetensors total)
    config = json.loads((MODELS / "internvl3-78b-hf.json").read_text())
    vision = dict(config["vision_config"])  # type: ignore[call-overload]
    plain = {**config, "vision_config": {**vision, "use_qk_norm": False}}
    with_norms, without = load_model(config), load_model(plain)
    assert with_norms.n_params == 78_408_318_336
    assert with_norms.n_params - without.n_params == 45 * 2 * 3200
    assert with_norms.vision is not None and without.vision is not None
    assert with_norms.vision.blocks[0].qk_norm and not without.vision.blocks[0].qk_norm
    setup = TrainingSetup(method="lora", precision="bf16-mixed", seq_len=1024,
                          images_per_sample=1, image_height=448, image_width=448)
    kept = estimate(with_norms, setup).bucket_bytes["activations"]
    assert kept > estimate(without, setup).bucket_bytes["activations"]


def test_smolvlm_reads_as_idefics3s_tower_under_its_own_type() -> None:
    # SmolVLM2 is transformers' Idefics3 (modular_smolvlm.py) under its own model types
    config = json.loads((MODELS / "smolvlm2-500m-video-instruct.json").read_text())
    vision = dict(config["vision_config"])  # type: ignore[call-overload]
    as_idefics3 = {**config, "model_type": "idefics3",
                   "vision_config": {**vision, "model_type": "idefics3_vision"}}
    smol, idefics = load_model(config), load_model(as_idefics3)
    assert smol.family == "smolvlm" and smol.n_params == idefics.n_params == 507_482_304
    assert smol.vision == idefics.vision
    setup = TrainingSetup(method="full", precision="bf16-mixed", seq_len=2048,
                          images_per_sample=1, image_height=512, image_width=512)
    assert estimate(smol, setup).allocated_peak_bytes == estimate(
        idefics, setup).allocated_peak_bytes


def test_a_nemotron_config_without_its_block_list_names_the_key() -> None:
    config = _config("nemotron_h")
    config.pop("layers_block_type")
    with pytest.raises(ConfigError, match=r"^layers_block_type: missing"):
        load_model(config)


def test_an_unknown_llama_shaped_type_is_estimated_and_says_approximate() -> None:
    config = {**json.loads((MODELS / "llama-3.2-1b.json").read_text()), "model_type": "acme_lm"}
    spec = load_model(config)
    assert spec.approximate and spec.n_params == load_model("llama-3.2-1b").n_params
    result = estimate(spec, TrainingSetup(seq_len=512))
    assert result.approximate
    assert any("'acme_lm' is not one vram knows" in note for note in result.notes)


def test_an_unknown_type_of_another_shape_gets_a_clear_message() -> None:
    config = {**_config("granitemoehybrid"), "model_type": "acme_hybrid"}
    with pytest.raises(ConfigError, match=r"^model_type: 'acme_hybrid' is not supported"):
        load_model(config)
