"""A vision-language model's inputs in the app (issue 22): drawn only for such a model, set
from a link, and its token budget said under the result."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.app.conftest import open_advanced
from ui.inputs import IMAGES


def _keys(app: AppTest) -> set[str]:
    widgets = [*app.selectbox, *app.select_slider, *app.slider, *app.toggle]
    return {str(w.key) for w in widgets}


def test_image_controls_only_for_a_vision_language_model(app: AppTest) -> None:
    open_advanced(app)
    app.session_state[IMAGES] = True
    app.run()
    assert not app.exception
    assert not {"img", "maxpx", "vframes", "vfreeze"} & _keys(app)  # a text model's sidebar


def test_a_link_sets_the_images_and_the_budget_is_said(app: AppTest) -> None:
    for key, value in {"model": "qwen2.5-vl-7b", "method": "lora", "seq": "4096", "img": "2",
                       "imgh": "1080", "imgw": "1920", "maxpx": "1003520"}.items():
        app.query_params[key] = value
    app.session_state[IMAGES] = True
    app.run()
    assert not app.exception
    assert {"img", "imgh", "imgw", "maxpx", "vframes", "vfreeze"} <= _keys(app)
    said = " ".join(info.value for info in app.info)
    assert "728x1316" in said and "1,222 language-model tokens" in said
    assert "2,444 of the 4,096 tokens" in said
