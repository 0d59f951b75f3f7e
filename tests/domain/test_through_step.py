"""Buckets at the peak against the most each holds through the step (vram.step.through_step)."""

from __future__ import annotations

import vram
from vram.result import BucketName
from vram.step.through_step import through_step


def test_a_peak_at_the_loss_holds_no_gradients_but_the_step_holds_them_all() -> None:
    est = vram.estimate(vram.load_model("llama-3.1-8b"), vram.TrainingSetup(method="full"))
    rows = {r.name: r for r in through_step(est)}
    grads = rows[BucketName.GRADIENTS]
    assert grads.at_peak_bytes == 0
    # mixed precision keeps fp32 parameters, and .grad takes the parameter's dtype: 4 bytes each
    assert grads.most_bytes == 4 * est.params.trainable == 32_121_044_992
    assert "the loss" in grads.why and "none yet" in grads.why
    assert sum(r.at_peak_bytes for r in rows.values()) == sum(est.bucket_bytes.values())
    for name in (BucketName.WEIGHTS, BucketName.OPTIMIZER, BucketName.OVERHEAD):
        assert rows[name].most_bytes == rows[name].at_peak_bytes and not rows[name].why


def test_most_is_never_below_the_peak_figure() -> None:
    for method in ("full", "lora", "qlora"):
        for ckpt in (False, True):
            est = vram.estimate(vram.load_model("llama-3.2-1b"),
                                vram.TrainingSetup(method=method, grad_ckpt=ckpt))
            for row in through_step(est):
                assert row.most_bytes >= row.at_peak_bytes
                assert bool(row.why) == (row.most_bytes > row.at_peak_bytes)
