"""The sidebar's "Import a training config": it fills the controls, shows the mapping table,
and the state goes into the URL."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui.import_config import OPEN, state_from_loaded
from ui.text import shown
from vram.io.readers import load_training_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _import(app: AppTest, text: str, fmt: str = "auto") -> AppTest:
    app.session_state[OPEN] = True  # its contents are drawn only while it is open
    app.run()
    app.text_area(key="import_text").set_value(text)
    app.selectbox(key="import_format").set_value(fmt)
    app.button(key="import_go").click()
    return app.run()


def test_import_fills_the_controls_and_the_url(app: AppTest) -> None:
    _import(app, (CONFIGS / "axolotl/llama3-qlora.yml").read_text())
    assert not app.exception
    state = app.session_state
    assert state["model"] == "meta-llama-3-8b"
    assert (state["method"], state["seq"], state["batch"], state["rank"]) == (
        "qlora", 4096, 2, 32)
    assert (state["opt"], state["accum"], state["attn"]) == ("paged-adamw", 4, "flash")
    assert app.query_params["seq"] == "4096"
    # The report is a list in the sidebar, each value whole (a grid there showed one letter
    # a value): "- **sequence_len** = 4096: seq_len=4096".
    report = "\n".join(shown(m.value) for m in app.sidebar.markdown)
    assert "- **sequence_len** = 4096: " in report
    assert "- **micro_batch_size** = 2: " in report
    assert not [t for t in app.sidebar.dataframe]
    assert app.metric  # the page estimated the imported run


def test_import_rounds_to_the_controls_and_says_so() -> None:
    loaded = load_training_config(CONFIGS / "trl/smollm3-sft.yaml")
    keys = ("seq", "batch", "rank", "model", "method")
    values, notes = state_from_loaded(loaded, keys)
    assert values["seq"] == 65536 and "model" not in values
    assert any("model kept" in note for note in notes)
    odd = load_training_config("base_model: x/y\nsequence_len: 3000\nmicro_batch_size: 3\n")
    values, notes = state_from_loaded(odd, keys)
    assert values["seq"] == 2048 and values["batch"] == 3
    assert any("seq_len 3000" in note for note in notes)


def test_bad_import_shows_a_message(app: AppTest) -> None:
    _import(app, "base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: lots\n")
    assert not app.exception
    assert any("micro_batch_size: must be a whole number" in shown(e.value) for e in app.error)
    _import(app, "a: !!python/object/apply:os.system [echo]\n", "axolotl")
    assert any("not valid YAML" in shown(e.value) for e in app.error)


def test_export_buttons_are_offered(app: AppTest) -> None:
    app.run()
    assert not app.exception
    labels = [e.proto.label for e in app.get("download_button")]
    assert "This run as an axolotl config" in labels
    assert "This run as a TRL config" in labels


def test_closed_import_panel_draws_nothing_inside(app: AppTest) -> None:
    app.run()
    assert "import_format" not in [s.key for s in app.selectbox]
    assert not [t for t in app.text_area if t.key == "import_text"]
    app.session_state[OPEN] = True
    app.run()
    assert app.selectbox(key="import_format").value == "auto"
