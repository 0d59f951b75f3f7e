"""Buckets at the peak against the most each holds through the step (vram.step.through_step)."""

from __future__ import annotations

import vram
from vram.result import BucketName
from vram.step.through_step import peak_moment, peak_text, through_step


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


def test_the_moment_a_bucket_is_at_its_most_is_named() -> None:
    """8B full: no gradients at the loss, all 32.1 GB at the optimizer step; 70B full without
    checkpointing: the activations are greatest at the loss (the saved activations and the
    logits' gradient), 221 GB, while the peak, at the embedding's backward, holds 4.2 GB."""
    est = vram.estimate(vram.load_model("llama-3.1-8b"), vram.TrainingSetup(method="full"))
    rows = {r.name: r for r in through_step(est)}
    assert rows[BucketName.GRADIENTS].most_at == "the optimizer step"
    assert rows[BucketName.WEIGHTS].most_at == ""
    big = vram.estimate(vram.load_model("llama-3.1-70b"), vram.TrainingSetup(method="full"))
    acts = next(r for r in through_step(big) if r.name is BucketName.ACTIVATIONS)
    assert acts.most_at == "the loss" and "greatest at the loss" in acts.why
    assert acts.most_bytes > 50 * acts.at_peak_bytes  # 221 GB against 4.2 GB at the peak


def test_the_headline_names_the_moment_of_the_note() -> None:
    """The headline's phrase and the estimate's note name the same moment ("at the loss"), and
    the loss is where the backward pass begins, never "during the backward pass" beside a
    note that says "at the loss"."""
    est = vram.estimate(vram.load_model("llama-3.1-8b"), vram.TrainingSetup(method="full"))
    assert peak_text(est) == "at the loss (the backward pass)"
    assert any("The peak is at the loss" in note for note in est.notes)
    for method in ("full", "lora", "qlora"):
        for ckpt in (False, True):
            est = vram.estimate(vram.load_model("llama-3.2-1b"),
                                vram.TrainingSetup(method=method, grad_ckpt=ckpt))
            moment = peak_moment(est)
            assert moment is not None and moment.phase is est.phase
            for note in est.notes:
                if note.startswith("The peak is at "):
                    assert note.startswith(f"The peak is at {moment.label}:")
