"""Fuzz the API and TrainingSetup: any config, model text and setup gives a sound estimate or
a documented error (VramError for a model, ValidationError for a setup), within 5 s."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.surfaces import MODEL_TEXT, check_api, configs, setup_fields

FUZZ = settings.get_profile("fuzz")


@FUZZ
@given(config=configs(), fields=setup_fields())
def test_any_config_with_any_setup(config: dict[str, Any], fields: dict[str, Any]) -> None:
    check_api(config, fields)


@FUZZ
@given(text=MODEL_TEXT, fields=setup_fields())
def test_any_model_text_with_any_setup(text: str, fields: dict[str, Any]) -> None:
    check_api(text, fields)


@FUZZ
@given(slug=st.sampled_from(["llama-3.2-1b", "llama-3.1-70b", "mixtral-8x7b", "t5-base",
                             "bert-base-uncased", "gemma-2-9b", "70B"]),
       fields=setup_fields())
def test_any_setup_on_real_models_fits(slug: str, fields: dict[str, Any]) -> None:
    check_api(slug, fields, with_fit=True)
