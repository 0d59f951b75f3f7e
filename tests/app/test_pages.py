"""AppTest for every page: loads, controls move the numbers the way `vram` says, URL, bad input."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

import vram
from tests.app.conftest import PAGES, open_advanced
from ui import params
from ui.charts import format_bytes
from ui.text import shown
from vram.setup import TrainingSetup

DEFAULT_MODEL = "llama-3.1-8b"


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _peak(at: AppTest) -> str:
    return _metric(at, "Peak memory per GPU")


def _expected_peak(unit: str = "GB", model: str = DEFAULT_MODEL, **setup: object) -> str:
    """The library's figure; the app starts from the library's defaults (one source)."""
    est = vram.estimate(vram.load_model(model), TrainingSetup(**setup))  # type: ignore[arg-type]
    return format_bytes(est.device_peak_bytes, unit)  # type: ignore[arg-type]


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def test_calculator_loads_with_sensible_defaults(app: AppTest) -> None:
    app.run()
    _clean(app)
    assert not app.error
    assert app.selectbox(key="model").value == DEFAULT_MODEL
    assert _peak(app) == _expected_peak()
    # the default run's cheapest card, its name shortened for the big type, in full below it
    cheapest = next(m for m in app.metric if m.label == "Cheapest per hour")
    assert cheapest.value == "1× RTX 6000"
    assert str(cheapest.delta).startswith("RTX 6000 Ada Generation · $")
    # why the peak holds no gradients yet is said once, in the through-step caption
    captions = [c.value for c in app.caption]
    assert sum("gradients" in c and "The peak is at" in c for c in captions) == 1, captions
    # the breakdown and training against inference; "Make it fit" is closed until asked for
    assert [c.key for c in app.get("plotly_chart")] == ["breakdown", "inference"]
    assert app.get("download_button")


@pytest.mark.parametrize("page", PAGES)
def test_every_page_loads(app: AppTest, page: str) -> None:
    app.run()
    app.switch_page(page).run()
    _clean(app)
    assert not app.error


@pytest.mark.parametrize(
    ("key", "value", "setup"),
    [
        ("batch", 8, {"micro_batch": 8}),
        ("seq", 16384, {"seq_len": 16384}),
        ("method", "full", {"method": "full"}),
        ("opt", "sgd", {"optimizer": "sgd"}),
        ("ckpt", True, {"grad_ckpt": True}),
        ("once", True, {"longest_batch_repeats": False, "framework": "litgpt"}),
    ],
)
def test_controls_change_the_numbers_as_vram_says(
    app: AppTest, key: str, value: object, setup: dict[str, object]
) -> None:
    open_advanced(app).run()
    if "framework" in setup:  # the previous-step graph that `once` drops is LitGPT's
        app.selectbox(key="stack").set_value(setup["framework"]).run()
    before = _peak(app)
    widget = {
        "batch": app.slider,
        "seq": app.select_slider,
        "method": app.radio,
        "opt": app.selectbox,
        "ckpt": app.toggle,
        "once": app.toggle,
    }[key](key=key)
    widget.set_value(value).run()
    _clean(app)
    assert _peak(app) == _expected_peak(**setup)
    assert _peak(app) != before
    assert app.query_params[key] == params.registry(("x",), "x")[key].dump(value)


def test_gpu_count_picks_a_sharding(app: AppTest) -> None:
    open_advanced(app).run()
    app.select_slider(key="gpus").set_value(8).run()
    _clean(app)
    assert not app.error
    assert app.selectbox(key="shard").value == "ddp"


def test_advanced_controls_are_drawn_only_while_open(app: AppTest) -> None:
    # Closed, its twenty controls are not drawn (issue 13: server CPU a rerun), and the values
    # they hold still count, in the numbers and in the link.
    app.query_params["attn"] = "eager"
    app.run()
    _clean(app)
    assert "attn" not in [s.key for s in app.selectbox]
    assert _peak(app) == _expected_peak(attention="eager")
    app.slider(key="batch").set_value(2).run()
    assert _peak(app) == _expected_peak(attention="eager", micro_batch=2)
    assert app.query_params["attn"] in ("eager", ["eager"])
    open_advanced(app).run()
    assert app.selectbox(key="attn").value == "eager"


def test_checkpointing_sits_by_batch_and_sequence_with_its_cost(app: AppTest) -> None:
    """The lesson's first lever is drawn with Advanced closed, its compute cost beside it, and
    it is not drawn a second time under Advanced."""
    app.run()
    _clean(app)
    assert app.toggle(key="ckpt").value is False
    assert any("+48% compute" in c.value for c in app.sidebar.caption)
    app.toggle(key="ckpt").set_value(True).run()
    assert _peak(app) == _expected_peak(grad_ckpt=True)
    app.radio(key="method").set_value("full").run()
    assert any("+33% compute" in c.value for c in app.sidebar.caption)
    open_advanced(app).run()
    assert [t.key for t in app.toggle].count("ckpt") == 1


def test_unit_switch(app: AppTest) -> None:
    app.run()
    app.radio(key="unit").set_value("GiB").run()
    assert _peak(app) == _expected_peak("GiB")
    assert _peak(app).endswith("GiB")


def test_url_round_trip(app: AppTest) -> None:
    query = {
        "model": "llama-3.2-1b",
        "method": "full",
        "batch": "4",
        "seq": "8192",
        "ckpt": "true",
        "opt": "adamw-8bit",
        "unit": "GiB",
    }
    app.query_params.update(query)
    open_advanced(app).run()
    _clean(app)
    assert not app.error
    assert app.slider(key="batch").value == 4
    assert app.select_slider(key="seq").value == 8192
    assert app.toggle(key="ckpt").value is True
    assert _peak(app) == _expected_peak(
        "GiB",
        "llama-3.2-1b",
        method="full",
        micro_batch=4,
        seq_len=8192,
        grad_ckpt=True,
        optimizer="adamw-8bit",
    )
    assert dict(app.query_params) == query


def test_invalid_url_parameters_show_a_message(app: AppTest) -> None:
    app.query_params.update(
        {"batch": "9999", "seq": "abc", "model": "no-such-model", "method": "<script>"}
    )
    app.run()
    _clean(app)
    message = shown(app.error[0].value)  # user text is escaped Markdown; check what shows
    for key in ("parameter batch ", "parameter seq ", "parameter model ", "parameter method "):
        assert key in message
    assert "`" not in message  # plain text: a backtick would show as it is
    assert _peak(app) == _expected_peak()  # fell back to the defaults


def test_impossible_setup_shows_what_to_change(app: AppTest) -> None:
    app.query_params.update({"method": "full", "offload": "optimizer"})
    app.run()
    _clean(app)
    assert "Offload (offload)" in shown(app.error[0].value)
    assert not app.metric


def _upload(app: AppTest, content: bytes) -> AppTest:
    app.query_params["model"] = "upload"
    app.run()
    app.file_uploader(key="upload").set_value(("config.json", content, "application/json"))
    return app.run()


def test_good_upload_is_estimated(app: AppTest) -> None:
    text = (vram_data_dir() / "models" / "llama-3.2-1b.json").read_bytes()
    _upload(app, text)
    _clean(app)
    assert not app.error
    assert _peak(app) == _expected_peak(model="llama-3.2-1b")
    assert "config" in app.query_params  # the link carries the config


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"model_type": "nonsense"}).encode(), "model_type"),
        (b"\xff\xfe\x00", "UTF-8"),
        (b"{" + b" " * 300_000 + b"}", "at most"),
    ],
)
def test_bad_upload_shows_a_message(app: AppTest, content: bytes, fragment: str) -> None:
    _upload(app, content)
    _clean(app)
    assert any(fragment in shown(e.value) for e in app.error), [e.value for e in app.error]


def test_compare_pins_and_round_trips(app: AppTest) -> None:
    app.run()
    app.switch_page("pages/2_Compare.py").run()
    app.button(key="pin_methods").click().run()
    _clean(app)
    table = app.table[0].value
    assert len(table) == 3
    expected = [_expected_peak(method=m) for m in ("full", "lora", "qlora")]
    assert list(table["peak per GPU"]) == expected
    pins = app.query_params["pin"]
    assert len(pins) == 3

    again = AppTest.from_file(app._script_path, default_timeout=60)
    again.query_params["pin"] = pins
    again.run()
    again.switch_page("pages/2_Compare.py").run()
    assert list(again.table[0].value["peak per GPU"]) == expected


def test_gpus_page_shows_what_the_run_needs(app: AppTest) -> None:
    app.run()
    app.switch_page("pages/3_GPUs.py").run()
    _clean(app)
    table = app.dataframe[0].value
    assert len(table) == len(vram.load_gpus())
    assert set(table["holds it"]) <= {"yes", "no", "?"}
    assert "yes" in set(table["holds it"])
    # The answer first (visible without a sideways scroll at 1280 px), and no cell the grid
    # would draw as a grey "None": a gap is empty or a word.
    assert list(table.columns[:5]) == ["GPU", "holds it", "GPUs needed", "$/h, all",
                                       "headroom (GB)"]
    assert not table.isna().any().any()
    t4 = table[table["GPU"] == "Tesla T4"].iloc[0]
    assert t4["bf16 TFLOPS"] == "no bf16"


def test_learn_exercise_checks_an_answer(app: AppTest) -> None:
    app.run()
    app.switch_page("pages/1_Learn.py").run()
    app.number_input(key="ex1").set_value(1.0).run()
    _clean(app)
    assert any("Not quite" in w.value for w in app.warning)


def vram_data_dir():
    from vram.paths import data_dir

    return data_dir()


def test_gpu_page_filters_come_from_the_link(app: AppTest) -> None:
    """`?vendor=AMD&fits=1` opens the GPU page on AMD cards that hold the run, and the
    controls show what the link chose."""
    app.query_params.update({"vendor": "AMD", "fits": "1"})
    app.run()
    app.switch_page("pages/3_GPUs.py").run()
    _clean(app)
    assert app.multiselect(key="vendor").value == ["AMD"]
    assert app.toggle(key="fits").value is True
    table = app.dataframe[0].value
    assert len(table) > 0 and set(table["GPU"]) <= _short_names("AMD")
    assert set(table["holds it"]) == {"yes"}


def _short_names(vendor: str) -> set[str]:
    from ui.data import short_gpu_name

    return {short_gpu_name(g.name) for g in vram.load_gpus(None) if g.vendor == vendor}
