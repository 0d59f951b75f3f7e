"""Compare: pin up to four setups and see them side by side in one chart and one table."""

from __future__ import annotations

import streamlit as st

import vram
from ui import compare, compare_chart, data, inputs, present, render, tables, text

st.set_page_config(page_title="vram · compare", page_icon="🧮", layout="wide")


def main() -> None:
    _, unit = inputs.page_start("Compare setups", sync_url=False)
    st.markdown(
        f"Pin up to {inputs.MAX_PINS} setups from the sidebar, or pin a ready-made comparison "
        "of the current model."
    )
    compare.pin_buttons()
    inputs.write_url()

    pins = st.session_state.get("pins") or []
    if not pins:
        st.info("Nothing pinned yet: set up a run in the sidebar and press **Pin**.")
        return
    labelled: list[tuple[str, vram.Estimate]] = []
    for n, pin in enumerate(pins):
        model, model_error = data.resolve_model(pin)
        setup, errors = compare.build(pin)
        if model is None or setup is None:
            text.error([" ".join(([model_error] if model_error else []) + errors)],
                       lead=f"Pinned setup {n + 1}:")
            continue
        labelled.append((compare.label(pin, model.name, n), vram.estimate(model, setup)))
    if not labelled:
        return
    st.markdown(compare_chart.legend_markdown(), unsafe_allow_html=True)
    render.plot(compare.figure(labelled, unit, present=present.is_on()), key="compare")
    st.table(tables.bucket_table(labelled, unit), hide_index=True)
    compare.remove_buttons(labelled)


main()
