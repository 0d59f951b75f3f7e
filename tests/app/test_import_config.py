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


def test_an_imported_config_never_looks_at_the_servers_files(tmp_path: Path) -> None:
    """A path in a pasted config gets the same note whatever is at it (issue 25)."""
    import os

    config = tmp_path / "config.json"
    config.write_text((CONFIGS.parents[1] / "data" / "configs").name)  # any file
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    notes = {}
    for kind, path in (("file", config), ("folder", tmp_path / "folder"),
                       ("fifo", tmp_path / "fifo"), ("device", Path("/dev/zero")),
                       ("passwd", Path("/etc/passwd")), ("missing", tmp_path / "nothing")):
        app = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"),
                                default_timeout=60)
        _import(app, f"base_model: {path}\nsequence_len: 1024\nmicro_batch_size: 1\n",
                "axolotl")
        assert not app.exception and not app.error, kind
        captions = [shown(c.value) for c in app.caption if "model kept" in shown(c.value)]
        assert len(captions) == 1, kind
        notes[kind] = captions[0].replace(str(path), "PATH")
    assert set(notes.values()) == {
        "model kept as it was: 'PATH': not in the catalog: upload its config.json"}, notes


def test_a_null_key_is_named_in_the_import_panel(app: AppTest) -> None:
    _import(app, "base_model: llama-3.1-8b\n~: 1\nsequence_len: 1024\n")
    assert not app.exception
    assert any("~ (null): a key must be text" in shown(e.value) for e in app.error)


def test_a_pasted_ms_swift_script_is_read_not_run(app: AppTest, tmp_path: Path) -> None:
    """ms-swift's examples/train/packing/qwen2_5_vl.sh, pasted, plus a command substitution
    that must never run."""
    marker = tmp_path / "ran"
    text = (CONFIGS / "ms-swift/packing-qwen2_5_vl.sh").read_text()
    _import(app, text.replace("--lora_rank 8", f"--lora_rank 8 --system $(touch {marker})"))
    assert not app.exception and not marker.exists()
    state = app.session_state
    assert state["model"] == "qwen2.5-vl-7b"
    assert (state["method"], state["seq"], state["gpus"], state["maxpx"]) == (
        "lora", 8192, 4, 1_003_520)
    report = "\n".join(shown(m.value) for m in app.sidebar.markdown)
    assert "- **MAX_PIXELS** = 1003520: " in report
