"""The "Make it fit" panel: my GPU and tokens in the sidebar and the URL, the verdict and the
path as `vram.plan` computes them."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

import vram
from ui import results
from ui.charts import format_bytes
from ui.text import shown


def _metric(at: AppTest, label_start: str) -> tuple[str, str]:
    found = next(m for m in at.metric if m.label.startswith(label_start))
    return found.value, str(found.delta)


def test_my_gpu_from_the_link_gives_the_plan(app: AppTest) -> None:
    app.query_params["mygpu"] = "rtx-4090"
    app.query_params["seq"] = "4096"
    app.query_params["batch"] = "4"
    app.query_params["ckpt"] = "1"
    app.query_params["tokens"] = "1000"
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]
    setup = vram.TrainingSetup(method="qlora", seq_len=4096, micro_batch=4, grad_ckpt=True)
    expected = vram.plan(vram.load_model("llama-3.1-8b"), setup,
                         hardware=vram.Hardware(gpu="rtx-4090"), tokens=1e9)
    value, delta = _metric(app, "On 1× RTX 4090")  # the GPU's name, not its catalog id
    assert value == "does not fit"
    assert delta == f"short by {format_bytes(expected.shortfall_bytes, 'GB')}"
    assert _metric(app, "Longest sequence, as set up")[0] == f"{expected.max_seq_len.value:,}"
    # the limits are the run as set up, the cost the run after the path, and each says so
    if expected.path:
        assert _metric(app, "This run, after the path")[0]
    if expected.max_micro_batch.value == 0:
        assert _metric(app, "Largest micro-batch, as set up")[1] == "none fits before the path"
    assert any(expected.path_summary in m.value for m in app.markdown)
    assert app.session_state["mygpu"] == "rtx-4090" and app.session_state["tokens"] == 1000.0
    # the link keeps the panel's keys beside the registry's
    assert app.query_params["mygpu"] == ["rtx-4090"] or app.query_params["mygpu"] == "rtx-4090"


def test_bad_panel_link_is_reported_not_raised(app: AppTest) -> None:
    app.query_params["mygpu"] = "rtx-9999"
    app.query_params["mycount"] = "0"
    app.run()
    assert not app.exception
    messages = " ".join(shown(e.value) for e in app.error)  # user text is escaped Markdown
    assert "URL parameter mygpu: unknown GPU 'rtx-9999'" in messages
    assert "URL parameter mycount" in messages
    assert app.session_state["mygpu"] == "any"


def test_changing_my_gpu_moves_the_verdict(app: AppTest) -> None:
    app.run()
    app.toggle(key="plan").set_value(True).run()
    app.selectbox(key="mygpu").select("h100-sxm").run()
    assert not app.exception
    value, _ = _metric(app, "On 1× H100")
    assert value == "fits"


def test_path_chart_rows_add_up() -> None:
    from ui.plan_chart import path_figure, path_rows

    setup = vram.TrainingSetup(method="qlora", seq_len=4096, micro_batch=4, grad_ckpt=True)
    result = vram.plan(vram.load_model("llama-3.1-8b"), setup,
                       hardware=vram.Hardware(gpu="rtx-4090"))
    rows = path_rows(result)
    assert rows[0]["bytes"] == result.device_peak_bytes
    assert rows[0]["bytes"] + sum(r["bytes"] for r in rows[1:-1]) == rows[-1]["bytes"]
    assert rows[-1]["bytes"] == result.path[-1].device_peak_bytes <= result.usable_bytes
    fig = path_figure(result)
    assert len(fig.data[0].y) == len(result.path) + 2
    assert fig.layout.annotations[0].text.startswith("RTX 4090: ")


def test_closed_panel_computes_no_plan(app: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    # A plan is dozens of estimates; closed (the default), the page must not pay for it
    # (issue 13: at most 40 ms of server CPU a rerun).
    calls: list[object] = []
    real = vram.plan

    def counted(*args: object, **kwargs: object) -> vram.Plan:
        calls.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(vram, "plan", counted)
    results._plan.cache_clear()  # so opening the panel computes its plan here
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert calls == []
    assert not any(m.label.startswith("Largest micro-batch") for m in app.metric)
    assert "mygpu" not in [s.key for s in app.selectbox]
    assert "plan" not in app.query_params

    app.toggle(key="plan").set_value(True).run()
    assert len(calls) == 1
    assert any(m.label.startswith("Largest micro-batch") for m in app.metric)
    assert "plan_path" in [c.key for c in app.get("plotly_chart")]
    assert "mygpu" in [s.key for s in app.selectbox]
    assert app.query_params["plan"] in ("1", ["1"])  # a shared link reopens it


def test_plan_key_in_the_link_opens_and_closes(app: AppTest) -> None:
    app.query_params["plan"] = "1"
    app.run()
    assert app.toggle(key="plan").value is True
    assert any(m.label.startswith("Largest micro-batch") for m in app.metric)
    app.toggle(key="plan").set_value(False).run()
    assert not any(m.label.startswith("Largest micro-batch") for m in app.metric)
    assert "plan" not in app.query_params


def test_bad_plan_key_is_reported(app: AppTest) -> None:
    app.query_params["plan"] = "maybe"
    app.run()
    assert not app.exception
    assert "URL parameter plan: use 1 or 0; using 0." in " ".join(shown(e.value)
                                                                     for e in app.error)
    assert app.toggle(key="plan").value is False
