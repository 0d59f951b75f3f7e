"""The calculator: how much GPU memory one training step needs, where it goes, what holds it.

Run with ``streamlit run app.py``. Streamlit reruns this script from the top on every widget
change; it only reads the widgets, calls `vram`, and displays the result.
"""

from __future__ import annotations

import streamlit as st

import vram
from ui import charts, data, inputs, params, render, text, verify

st.set_page_config(page_title="vram · training memory calculator", page_icon="🧮", layout="wide")


def main() -> None:
    state, unit = inputs.page_start("How much GPU memory does this training run need?")

    model, model_error = data.resolve_model(state)
    setup, setup_errors = params.build_setup(state)
    if model_error or setup_errors:
        text.error(([model_error] if model_error else []) + setup_errors)
        return
    assert model is not None and setup is not None

    est = vram.estimate(model, setup)
    report = vram.fit(model, setup, data.gpus())
    st.caption(
        f"{text.plain(model.name)}: {est.params.total:,} parameters, "
        f"{est.params.trainable:,} trained. Figures are per GPU."
    )
    render.metrics(est, report, unit)

    chart, compare = st.columns([3, 2])
    with chart:
        st.subheader("Where the memory goes")
        render.plot(
            charts.breakdown_figure(est, unit=unit, capacities=data.capacities()),
            key="breakdown",
        )
    with compare:
        st.subheader("Training against inference")
        render.plot(charts.inference_figure(est, unit=unit), key="inference")
    render.notes(est)
    render.fit_tables(report, unit)
    render.show_math(est, unit)
    verify.panel(est, data.model_config(state), unit)
    render.download(est, report)


main()
