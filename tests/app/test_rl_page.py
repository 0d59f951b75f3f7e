"""The RL page: both phases drawn, its state round-trips through the URL, bad input named."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

import vram
import vram.rl as rl
from ui.rl_view import parse_rl_query, rl_query
from ui.text import shown

ROOT = Path(__file__).resolve().parents[2]


def _page() -> AppTest:
    return AppTest.from_file(str(ROOT / "pages" / "4_RL.py"), default_timeout=60)


def test_rl_page_draws_both_phases_as_vram_rl_says() -> None:
    at = _page()
    at.run()
    assert not at.error
    chart = at.get("plotly_chart")
    assert len(chart) == 1
    model = vram.load_model("qwen2.5-7b-instruct")
    setup = rl.RLSetup(policy=vram.TrainingSetup(method="lora", precision="bf16-true",
                                                 grad_ckpt=True),
                       num_generations=8, prompt_len=512, completion_len=1024,
                       gpu_memory_utilization=0.3)
    gpu = next(g for g in vram.load_gpus() if g.id == "h100-sxm")
    result = rl.estimate(model, setup, gpu.memory_bytes, with_advice=False)
    text = " ".join(m.value for m in at.markdown)
    assert f"{result.device_peak_bytes / 1e9:.3g}" in text or \
        f"{result.device_peak_bytes / 1e9:.1f}" in text
    assert result.peak_phase.value in text


def test_rl_page_url_round_trip() -> None:
    query = {"rl_algo": "grpo", "rl_gens": "16", "rl_clen": "2048", "rl_util": "0.5",
             "rl_sleep": "2", "rl_beta": "0.04"}
    at = _page()
    at.query_params.update(query)
    at.run()
    assert not at.error
    assert at.number_input(key="rl_gens").value == 16
    assert at.selectbox(key="rl_sleep").value == 2
    assert dict(at.query_params) == {k: v for k, v in query.items() if k != "rl_algo"}


def test_rl_page_bad_combination_names_the_field() -> None:
    at = _page()
    at.query_params.update({"rl_rollout": "server", "rl_sleep": "1"})
    at.run()
    assert any("sleep" in e.value for e in at.error)


def test_rl_page_bad_url_value_is_named() -> None:
    at = _page()
    at.query_params.update({"rl_gens": "99999", "rl_model": "no-such-model"})
    at.run()
    messages = " ".join(shown(e.value) for e in at.error)  # as a reader sees the escaped text
    assert "rl_gens" in messages and "rl_model" in messages


def test_rl_query_round_trips() -> None:
    values, errors = parse_rl_query({"rl_gens": "4", "rl_util": "0.25", "rl_algo": "dpo"})
    assert not errors
    assert rl_query(values) == {"rl_gens": "4", "rl_util": "0.25", "rl_algo": "dpo"}


def test_rl_numbers_in_the_link_are_the_whole_text() -> None:
    values, errors = parse_rl_query({"rl_util": "0.3000000000junk", "rl_beta": "0.04"})
    assert values == {"rl_beta": 0.04}
    assert len(errors) == 1 and "rl_util" in errors[0]
    for text in ("nan", "inf", "1e999", "0.5 " * 20, "0x1p-2"):
        values, errors = parse_rl_query({"rl_util": text})
        assert "rl_util" not in values and errors, text


def test_prompts_per_gpu_offers_what_the_model_accepts() -> None:
    at = _page()
    at.query_params.update({"rl_gens": "8"})
    at.run()
    batch = at.number_input(key="rl_batch")
    assert batch.max == rl.max_batch("grpo", 8) == 512
    batch.set_value(512).run()
    assert not at.error and not at.exception
    # more generations lower the bound; the value is brought within it, and said so
    at.number_input(key="rl_gens").set_value(16).run()
    assert not at.exception
    assert at.number_input(key="rl_batch").value == 256
    assert any("256" in shown(e.value) for e in at.error)
    # a link over the bound is named, not a traceback
    at = _page()
    at.query_params.update({"rl_gens": "64", "rl_batch": "1024"})
    at.run()
    assert not at.exception and at.number_input(key="rl_batch").value == 64
