"""The Learn page's content: seed figures, and exercises with checkable typed answers."""

from __future__ import annotations

import pytest

import vram
from ui import data, learn, params
from vram.result import BucketName

GB = 10**9


def _estimate(state: dict[str, object]) -> vram.Estimate:
    full = {**data.registry().defaults(), **state}
    model, _ = data.resolve_model(full)
    setup, errors = params.build_setup(full)
    assert model is not None and setup is not None, errors
    return vram.estimate(model, setup)


def test_seed_figures_are_the_course_numbers() -> None:
    by_key = {s.key: learn.seed_range_bytes(s) for s in learn.SEEDS}
    assert by_key["7b-full"] == (112 * GB, 112 * GB)
    assert by_key["70b-full-16"] == (1_120 * GB, 1_120 * GB)
    assert by_key["70b-full-12"] == (840 * GB, 840 * GB)
    assert by_key["70b-lora"] == (140 * GB, 140 * GB)
    low, high = by_key["70b-qlora"]
    assert 35 * GB <= low < high <= 40 * GB
    twelve = next(s for s in learn.SEEDS if s.key == "70b-full-12")
    assert "no fp32 master copy" in twelve.recipe and "280 GB" in twelve.why


def test_at_least_ten_exercises_cover_every_bucket_and_the_hard_parts() -> None:
    exercises = learn.EXERCISES
    assert len(exercises) >= 10
    targets = {ex.target.split(":")[-1] for ex in exercises}
    assert {b.value for b in BucketName} <= targets | {"gradients"}  # every bucket
    assert any(ex.target.startswith("most:") for ex in exercises)  # peak vs steady state
    assert any(ex.target == "item:overhead.allocator" for ex in exercises)  # fragmentation
    assert any(ex.target == "item:activations.loss" for ex in exercises)  # logits
    assert any(ex.baseline is not None for ex in exercises)  # the price of a lever


@pytest.mark.parametrize("ex", learn.EXERCISES, ids=lambda ex: ex.key)
def test_every_exercise_grades_its_own_answer_right_and_a_wrong_one_wrong(
    ex: learn.Exercise,
) -> None:
    est = _estimate(ex.state)
    baseline = _estimate(ex.baseline) if ex.baseline is not None else None
    answer = learn.answer_bytes(ex, est, baseline)
    assert answer > 0, f"{ex.key}: the answer is zero, nothing to learn"
    assert learn.grade(answer / GB, answer).ok
    assert not learn.grade(2 * answer / GB, answer).ok
    assert learn.explanation(est, ex.target)
