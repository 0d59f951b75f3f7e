"""The calculator: how much GPU memory one training step needs, where it goes, what holds it.

Served as the first page of ``streamlit run app.py`` (app.py lists the pages). Streamlit reruns
this script from the top on every widget change; it only reads the widgets, calls `vram`, and
displays the result.
"""

from __future__ import annotations

import streamlit as st

import vram
from ui import (
    data,
    headline,
    import_config,
    inputs,
    lesson_bar,
    plan_panel,
    present,
    render,
    results,
    tables,
    text,
    verify,
    what_if_panel,
)

st.set_page_config(page_title="vram · training memory calculator", page_icon="🧮", layout="wide")


def main() -> None:
    data.stop_if_gpu_list_is_bad()  # the plan panel reads the GPU list first
    plan_panel.read_url()  # before the shared URL registry reads the query string
    state, unit = inputs.page_start("How much GPU memory does this training run need?",
                                    lesson=True)
    plan_panel.sidebar()
    plan_panel.write_url()

    # The estimate, the fit, the figures and the tables are cached by the state (ui.results).
    res = results.result(state)
    if res.errors:
        text.error(res.errors)
        return
    model, est, report = res.model, res.estimate, res.report
    assert model is not None and est is not None and report is not None
    caption = (f"{text.plain(model.name)}: {est.params.total:,} parameters, "
               f"{est.params.trainable:,} trained. Figures are per GPU.")
    on = present.is_on()
    if on:  # the run, the headline and one big chart above a projector's fold
        st.markdown(lesson_bar.run_summary(model.name, state, est.params.total,
                                           res.ckpt_compute))
        headline.metrics(est, report, res.class_fit, unit)
        render.plot(results.breakdown_figure(state, unit, present=True), key="breakdown")
        headline.why(res.class_fit, unit)
        st.caption(caption)
        st.markdown("**At the peak, and through the step**")
        tables.through_step_table(*results.through_step(state, unit), unit, present=True)
        render.plot(results.inference_figure(state, unit), key="inference")
    else:
        st.caption(caption)
        headline.metrics(est, report, res.class_fit, unit)
        headline.why(res.class_fit, unit)
        chart, compare = st.columns([3, 2])
        with chart:
            st.subheader("Where the memory goes")
            render.plot(results.breakdown_figure(state, unit), key="breakdown")
            st.markdown("**At the peak, and through the step**")
            tables.through_step_table(*results.through_step(state, unit), unit)
        with compare:
            st.subheader("Training against inference")
            render.plot(results.inference_figure(state, unit), key="inference")
    render.notes(est)
    tables.fit_tables(
        *results.fit_tables(state, unit), unit, n_gpus=est.setup.n_gpus,
        unsupported=report.unsupported, bf16=est.setup.precision in vram.gpus.BF16_PRECISIONS,
        present=on,
    )
    plan_panel.panel(model, est.setup, unit)
    what_if_panel.panel(est, state, unit)
    render.show_math(est, unit)
    verify.panel(est, results.model_config(state), unit)
    render.download(lambda: results.download_json(state))
    import_config.export_downloads(est.setup, state["model"])


main()
