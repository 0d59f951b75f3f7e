"""What if a bucket were stored smaller (vram.step.what_if): the arithmetic, the new peak's
moment, the fit, bits per value, the presets, and the CLI's --compress."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout
from fractions import Fraction

import pytest

import vram
from vram.cli import main
from vram.result import BucketName
from vram.step import what_if as w

B = BucketName
SETUPS = [("llama-3.1-8b", {"method": "full"}), ("llama-3.1-8b", {"method": "qlora"}),
          ("llama-3.1-70b", {"method": "full", "n_gpus": 8, "sharding": "zero3",
                             "grad_ckpt": True}),
          ("llama-3.1-8b", {"method": "full", "n_gpus": 8, "sharding": "zero3",
                            "fsdp_version": 2, "framework": "torchtitan"}),
          ("llama-3.1-8b", {"method": "lora", "n_gpus": 4, "sharding": "zero2"})]


def _est(slug: str, **setup: object) -> vram.Estimate:
    return vram.estimate(vram.load_model(slug), vram.TrainingSetup(**setup))  # type: ignore[arg-type]


@pytest.mark.parametrize(("slug", "setup"), SETUPS)
def test_nothing_compressed_is_the_estimate(slug: str, setup: dict[str, object]) -> None:
    est = _est(slug, **setup)
    same = w.what_if(est, {})
    assert same.device_peak_bytes == est.device_peak_bytes
    assert same.allocated_peak_bytes == est.allocated_peak_bytes
    assert same.buckets == est.bucket_bytes and same.saved_bytes == 0


@pytest.mark.parametrize(("slug", "setup"), SETUPS)
def test_buckets_sum_to_the_peak_and_more_compression_never_costs(
        slug: str, setup: dict[str, object]) -> None:
    est = _est(slug, **setup)
    previous = est.device_peak_bytes
    for ratio in (Fraction(3, 2), Fraction(2), Fraction(4), Fraction(16)):
        what = w.what_if(est, dict.fromkeys(w.COMPRESSIBLE, ratio))
        assert sum(what.buckets.values()) == what.device_peak_bytes
        assert all(isinstance(v, int) and v >= 0 for v in what.buckets.values())
        assert what.device_peak_bytes <= previous
        previous = what.device_peak_bytes


def test_8b_full_optimizer_4x_activations_2x_by_hand() -> None:
    """8B full, AdamW bf16-mixed: 32.1 GB weights, 64.2 GB optimizer, 0 gradients and 34.1 GB
    activations at the loss. Optimizer ÷4 and activations ÷2: the loss would hold
    32.1 + 16.1 + 17.0, but the optimizer step holds 32.1 + 32.1 + 16.1 = 80.3 GB: the peak
    moves there; the context stays, the allocator's slack keeps its share (80.3 of 130.4)."""
    est = _est("llama-3.1-8b", method="full")
    ratios = w.parse_ratios(["optimizer=4", "activations=2"])
    what = w.what_if(est, ratios)
    weights, optimizer = est.bucket(B.WEIGHTS).bytes, est.bucket(B.OPTIMIZER).bytes
    assert what.moment == "the optimizer step"
    assert what.buckets["optimizer"] == math.ceil(optimizer / 4)
    assert what.buckets["gradients"] == est.gradient_bytes_total == weights
    assert what.allocated_peak_bytes == weights + math.ceil(optimizer / 4) + weights
    context = next(i.bytes for i in est.bucket(B.OVERHEAD).items if i.key == "overhead.context")
    slack = est.device_peak_bytes - est.allocated_peak_bytes - context
    assert what.buckets["overhead"] == context + math.ceil(
        slack * what.allocated_peak_bytes / est.allocated_peak_bytes)
    assert what.device_peak_bytes == what.allocated_peak_bytes + what.buckets["overhead"]


def test_the_fit_with_compression_is_fit_with_the_new_peak() -> None:
    model = vram.load_model("llama-3.1-70b")
    setup = vram.TrainingSetup(method="qlora")
    assert w.what_if_fit(model, setup, {}) == vram.fit(model, setup)
    squeezed = w.what_if_fit(model, setup, {B.ACTIVATIONS: Fraction(8)})
    # 196 GB without checkpointing: activations ÷8 bring one 80 GB GPU within the band (the
    # estimate fits, 76 GB, the high bound does not: borderline), two surely
    h100 = next(o for o in squeezed.borderline if o.gpu.id == "h100-sxm")
    assert h100.count == 1 and h100.likely and not h100.fits
    assert h100.device_low_bytes < h100.device_peak_bytes <= h100.usable_bytes \
        < h100.device_high_bytes
    assert next(o for o in squeezed.fits if o.gpu.id == "h100-sxm").count == 2
    # the what-if's band is the estimate's, relative to its figure
    est = vram.estimate(model, setup.model_copy(update={"n_gpus": 1}))
    ratio = h100.device_peak_bytes / est.device_peak_bytes
    assert h100.device_high_bytes == pytest.approx(est.bounds.device_high_bytes * ratio,
                                                   rel=1e-6, abs=2**20)
    assert not [o for o in (*vram.fit(model, setup).fits, *vram.fit(model, setup).borderline)
                if o.gpu.id == "h100-sxm" and o.count == 1]


def test_bits_per_value_now() -> None:
    full = _est("llama-3.1-8b", method="full")
    assert [w.element_bits(full, b) for b in w.COMPRESSIBLE] == [32.0, 32.0, 32.0, None]
    eight = _est("llama-3.1-8b", method="full", optimizer="adamw-8bit")
    assert 8.0 < (w.element_bits(eight, B.OPTIMIZER) or 0) < 8.3  # uint8 + absmax per block
    qlora = _est("llama-3.1-8b", method="qlora")
    # NF4 base (4.1 bits), the 128k-token embedding and head in 16 bits: 8.3 on average
    assert 4.0 < (w.element_bits(qlora, B.WEIGHTS) or 0) < 9.0
    sharded = _est("llama-3.1-8b", method="full", n_gpus=8, sharding="zero2")
    # ZeRO under bf16 mixed holds a 16-bit model and keeps the fp32 master copy with the
    # optimizer: 3 fp32 values per parameter over AdamW's 2 states, 48 bits each, per shard
    assert w.element_bits(sharded, B.OPTIMIZER) == pytest.approx(48.0)
    assert w.ratio_for_bits(full, B.OPTIMIZER, 8) == 4
    assert w.ratio_for_bits(eight, B.OPTIMIZER, 16) == 1  # never a ratio under 1


def test_presets_name_their_papers() -> None:
    full = _est("llama-3.1-8b", method="full")
    keys = {p.key for p in w.PRESETS}
    assert {"optimizer-8bit", "optimizer-4bit", "optimizer-lowrank", "optimizer-adam-mini",
            "activations-fp8", "weights-4bit"} <= keys
    for preset in w.PRESETS:
        assert "arXiv:" in preset.source and preset.quality
        assert preset.ratio_for(full) >= 1
    eight = next(p for p in w.PRESETS if p.key == "optimizer-8bit")
    assert float(eight.ratio_for(full)) == pytest.approx(32 / 8.125)


@pytest.mark.parametrize(("text", "message"), [
    ("optimizer", "is not BUCKET=RATIO"), ("overhead=2", "'overhead' is not one of"),
    ("optimizer=0.5", "must be from 1 to 1024"), ("optimizer=x", "'x' is not a number")])
def test_bad_compress_is_one_line_naming_the_flag(text: str, message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "llama-3.1-8b", "--compress", text]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--compress: " in err and message in err


def test_cli_json_gains_what_if() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["estimate", "--model", "llama-3.1-8b", "--method", "full",
                     "--compress", "optimizer=4", "--compress", "activations=2",
                     "--json"]) == 0
    what = json.loads(out.getvalue())["what_if"]
    assert set(what) >= {"buckets", "device_peak_bytes", "cheapest"}
    assert sum(what["buckets"].values()) == what["device_peak_bytes"]
    assert what["ratios"] == {"optimizer": 4.0, "activations": 2.0}
    assert what["cheapest"][0]["count"] >= 1
    assert w.ratios_text(w.parse_ratios(["activations=2", "optimizer=4"])) == (
        "optimizer=4,activations=2")


def test_what_compression_buys_on_one_gpu_is_proved_by_two_estimates() -> None:
    """8B full with checkpointing does not fit one H100 (0 everywhere); with the optimizer
    state 4x smaller a micro-batch of 3, 6,300 tokens (once a logits block outgrows the
    largest parameter, the loss's two idle fp32 blocks are reserved:
    `overhead.idle_loss_bytes`), and a 8.1B model fit (5.0B before).
    Each answer fits and the next one up does not."""
    from vram.plan.compressed import MODEL_STEP, compressed_limits

    model = vram.load_model("llama-3.1-8b")
    setup = vram.TrainingSetup(method="full", grad_ckpt=True)
    h100 = next(g for g in vram.load_gpus() if g.id == "h100-sxm")
    ratios = {B.OPTIMIZER: Fraction(4)}
    limits = compressed_limits(model, setup, ratios, h100)
    assert (limits.micro_batch_before.value, limits.seq_len_before.value) == (0, 0)
    assert (limits.micro_batch.value, limits.seq_len.value) == (3, 6300)
    assert (limits.model_params, limits.model_params_before) == (81 * MODEL_STEP,
                                                                50 * MODEL_STEP)

    def peak(**change: int) -> int:
        return w.what_if(vram.estimate(model, setup.model_copy(update=change)),
                         ratios).device_peak_bytes

    usable = limits.usable_bytes
    assert peak(micro_batch=3) <= usable < peak(micro_batch=4)
    assert peak(seq_len=6300) <= usable < peak(seq_len=6301)
