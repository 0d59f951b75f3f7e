"""DeepSpeed's ZeRO engine: what it keeps on the GPU, read from its source (vram.deepspeed_zero,
vram.precision), on DeepSpeedExamples' 254M SimpleTransformer (the dsbf16 case rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vram import TrainingSetup, estimate
from vram.architecture import ModelSpec, model_from_config_file
from vram.knobs import setup_record

CONFIG = (Path(__file__).resolve().parents[2].parent / "shared" / "validation" / "configs"
          / "ds-simpletransformer-254m.json")
PARAMS = 254_128_976
#: The example's run: batch 4 × 512 tokens, ZeRO-3 through DeepSpeed's engine.
RUN = dict(method="full", optimizer="adamw", micro_batch=4, seq_len=512, attention="eager",
           framework="deepspeed", sharding="zero3")


@pytest.fixture(scope="module")
def model() -> ModelSpec:
    if not CONFIG.exists():
        pytest.skip("../shared/validation/configs is not beside the project")
    return model_from_config_file(CONFIG)


def _optimizer(model: ModelSpec, **fields: object) -> dict[str, int]:
    result = estimate(model, TrainingSetup.model_validate({**RUN, **fields}))
    return {item.key: item.bytes for item in result.bucket("optimizer").items}


def test_the_engine_clones_its_master_partition_in_every_recipe(model: ModelSpec) -> None:
    """bf16_master_weights_and_grads (bf16-true) keeps a bf16 master beside the bf16 model, and
    fp32 an fp32 one: ZeRO-3's alias test compares a torch.device with a string (never equal)."""
    assert _optimizer(model, precision="bf16-true") == {
        "optimizer.states": 4 * PARAMS, "optimizer.master": 2 * PARAMS}
    assert _optimizer(model, precision="bf16-mixed") == {
        "optimizer.states": 8 * PARAMS, "optimizer.master": 4 * PARAMS}
    assert _optimizer(model, precision="fp32") == {
        "optimizer.states": 8 * PARAMS, "optimizer.master": 4 * PARAMS}
    assert _optimizer(model, precision="bf16-true", n_gpus=4) == {
        "optimizer.states": PARAMS, "optimizer.master": PARAMS // 2}


def test_no_master_copy_without_the_deepspeed_engine(model: ModelSpec) -> None:
    """FSDP (the fsdp_version knob) steps the bf16 parameters themselves."""
    fsdp = _optimizer(model, precision="bf16-true", n_gpus=4, fsdp_version=2)
    assert fsdp == {"optimizer.states": PARAMS}


def test_pure_bf16_under_deepspeed_runs_autocast_by_default(model: ModelSpec) -> None:
    """DeepSpeed's documented low-precision config pairs bf16-true with torch_autocast: the
    LayerNorms, the s×s softmax and the loss then run in fp32 (+1.52 GB of activations on this
    model, 2.09 -> 3.62 GB); the knob turns it off, and setup_record shows it resolved."""
    auto = TrainingSetup.model_validate({**RUN, "precision": "bf16-true"})
    off = auto.model_copy(update={"torch_autocast": False})
    assert setup_record(auto)["torch_autocast"] is True
    assert setup_record(off)["torch_autocast"] is False
    assert estimate(model, auto).bucket("activations").bytes == 3_615_031_296
    assert estimate(model, off).bucket("activations").bytes == 2_094_661_632
    mixed = TrainingSetup.model_validate({**RUN, "precision": "bf16-mixed"})
    assert setup_record(mixed)["torch_autocast"] is False  # DeepSpeed's own default: off
    assert estimate(model, mixed).bucket("activations").bytes == 2_094_661_632


def test_autocast_runs_the_loss_in_fp32(model: ModelSpec) -> None:
    """Under autocast cross_entropy is on the fp32 list: 16-bit logits, then fp32 log-softmax
    and gradients (14 bytes per logit at the loss's backward), not 8 in bf16."""
    def loss(autocast: bool) -> int:
        result = estimate(model, TrainingSetup.model_validate(
            {**RUN, "precision": "bf16-true", "torch_autocast": autocast}))
        return next(i.bytes for i in result.bucket("activations").items
                    if i.key == "activations.loss")
    tokens, vocab = 4 * 512, 50_000
    assert loss(True) - loss(False) == 6 * tokens * vocab
