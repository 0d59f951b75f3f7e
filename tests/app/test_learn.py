"""The Learn page's content: seed figures, and exercises with checkable typed answers."""

from __future__ import annotations

import urllib.parse

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


def _seed(key: str) -> learn.Seed:
    return next(s for s in learn.SEEDS if s.key == key)


def test_seed_runs_in_the_calculator_match_the_seed_figures() -> None:
    """Each seed's calculator run holds the seed's bytes per parameter in weights + gradients +
    optimizer state (within 6 %: the catalog's exact parameter counts), or the page says why
    not; LoRA's run is on a 16-bit base as its title says."""
    for seed in learn.SEEDS:
        est = _estimate(seed.state)
        per_param = learn.model_state_bytes(est) / est.params.total
        upper = seed.upper_bytes_per_param or seed.bytes_per_param
        if seed.key == "70b-full-12":
            assert per_param == pytest.approx(8.0, rel=0.02), seed.key  # pure bf16 AdamW
            assert "8 B per parameter" in seed.calculator_note
        elif seed.key == "70b-qlora":  # the unquantized head and embeddings come on top
            assert upper < per_param < upper + 0.25, seed.key
        else:
            assert per_param == pytest.approx(seed.bytes_per_param, rel=0.06), seed.key


def test_the_qlora_lesson_fits_one_80gb_gpu_only_with_the_teaching_presets() -> None:
    """70B QLoRA fits one 80 GB GPU with checkpointing on, as the seed's recipe trains; with
    the app's default (off) its activations push it past 190 GB. The presets say so."""
    h100 = next(g for g in data.gpus() if g.id == data.LESSON_GPU_ID)
    seed = _seed("70b-qlora")
    assert seed.state["ckpt"] is True
    assert _estimate(seed.state).device_peak_bytes < h100.memory_bytes
    plain = {k: v for k, v in seed.state.items() if k != "ckpt"}
    assert _estimate(plain).device_peak_bytes > 190 * GB
    assert learn.TEACHING_STATE == {"ckpt": True} and "checkpointing on" in learn.TEACHING_NOTE


def test_seed_links_spell_out_the_teaching_settings_and_keep_presentation() -> None:
    reg = data.registry()
    link = learn.seed_link(reg, _seed("70b-qlora"), present=True)
    query = dict(urllib.parse.parse_qsl(link.removeprefix("./?")))
    assert query == {"model": "llama-3.1-70b", "method": "qlora", "ckpt": "true", "present": "1"}
    values, errors = params.parse_query(reg, query)
    assert not errors and values["ckpt"] is True and values["method"] == "qlora"
    assert "present" not in dict(urllib.parse.parse_qsl(
        learn.seed_link(reg, _seed("7b-full")).removeprefix("./?")))


@pytest.mark.parametrize("base", ["", "/vram", "/team/vram"])
def test_seed_links_keep_the_path_the_app_is_served_under(base: str) -> None:
    """From the Learn page under `--server.baseUrlPath` the link opens the calculator under the
    same path, never the server's root ("Not Found" behind a proxy)."""
    link = learn.seed_link(data.registry(), _seed("70b-qlora"))
    opened = urllib.parse.urljoin(f"http://host{base}/Learn", link)
    assert opened.startswith(f"http://host{base}/?model=llama-3.1-70b")


def _ex(key: str) -> learn.Exercise:
    return next(e for e in learn.EXERCISES if e.key == key)


def _run(state: dict[str, object]) -> vram.Estimate:
    return _estimate(state)


@pytest.mark.parametrize(("answer", "ok", "words"), [
    (16.0, True, ("Right for the weights in bf16", "16.1 GB", "fp32", "master", "32.1 GB")),
    (32.0, True, ("Right: the calculator says 32.12 GB",)),
    (64.0, False, ("Not quite",)),
])
def test_exercise_2_takes_the_seeds_16_gb_as_the_bf16_weights(answer: float, ok: bool,
                                                               words: tuple[str, ...]) -> None:
    """The seed's "16-bit weights (2 B)" gives 16 GB for 8B: right for the weights in bf16,
    and the feedback says why this run (bf16 mixed) holds the fp32 master copy, 32.1 GB; the
    7B seed's note says the same, and both count 16 B per parameter."""
    checked = learn.check(_ex("ex2"), answer, _run)
    assert checked is not None
    result, _ = checked
    assert result.ok is ok
    for word in words:
        assert word in result.message, result.message
    assert "32 GB, not the 16 GB" in _seed("7b-full").calculator_note


def test_a_wrong_peak_names_the_bucket_where_the_gap_is() -> None:
    """8B full (142 GB at the loss): an answer without the activations is told so; one that
    counts every gradient is told the peak's moment holds none yet; a gap that is no bucket
    falls back to the factor hint."""
    est = _estimate({"method": "full"})
    peak = est.device_peak_bytes / GB
    acts = est.bucket("activations").bytes / GB
    low = learn.grade(peak - acts, est.device_peak_bytes, gap=learn.gap_hint(peak - acts, est))
    assert not low.ok and "the activations (34.1 GB): did you leave them out?" in low.message
    high_answer = peak + 32.12
    high = learn.grade(high_answer, est.device_peak_bytes,
                       gap=learn.gap_hint(high_answer, est))
    assert "gradients add after the peak's moment" in high.message
    assert "only at the optimizer step" in high.message
    quarter = learn.grade(peak / 4, est.device_peak_bytes, gap=learn.gap_hint(peak / 4, est))
    assert "factor of 4" in quarter.message  # 107 GB short: no one bucket
    checked = learn.check(_ex("ex3"), 1.0, _run)
    assert checked is not None and not checked[0].ok


def test_learn_asks_what_compression_would_buy() -> None:
    """The Learn page's what-if: 8B full with checkpointing, 8-bit optimizer states and FP8
    activations, from the presets; its link opens the calculator's panel with them."""
    est = _estimate(learn.WHAT_IF_STATE)
    compress, what = learn.what_if_example(est)
    assert compress.startswith("optimizer=3.93") and compress.endswith(",activations=2")
    assert what.device_peak_bytes < est.device_peak_bytes
    link = learn.what_if_link(data.registry(), compress)
    query = dict(urllib.parse.parse_qsl(link.removeprefix("./?")))
    assert query["whatif"] == "1" and query["compress"] == compress
    values, errors = params.parse_query(data.registry(), query)
    assert not errors and values["compress"] == compress and values["ckpt"] is True
