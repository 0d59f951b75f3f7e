"""GPUs: the catalog as a sortable, filterable table, and what the current setup needs on each."""

from __future__ import annotations

import streamlit as st

from ui import data, inputs, params, present, render, results, tables, text

st.set_page_config(page_title="vram · GPUs", page_icon="🧮", layout="wide")


def main() -> None:
    state, unit = inputs.page_start("GPUs: memory, speed, price, and what this run needs")

    gpus = data.gpus()
    # The estimate and the fit are cached by the state, shared with the calculator page.
    res = results.result(state)
    model, setup, est, report = res.model, res.setup, res.estimate, res.report
    if model is None or setup is None or est is None:
        text.error(res.errors)
    else:
        st.markdown(
            f"**{text.plain(model.name)}**, {params.label('method', state['method'])}: needs "
            f"**{render.format_bytes(est.device_peak_bytes, unit)}** per GPU "
            f"with {setup.n_gpus} GPU{'' if setup.n_gpus == 1 else 's'}. "
            "Click a column header to sort."
        )
    vendors = sorted({g.vendor for g in gpus})
    segments = sorted({g.segment for g in gpus})
    a, b, c = st.columns(3)
    # Filters live in the URL like the setup (vendor=, segment=, fits=); none chosen = all.
    a.multiselect("Vendor", vendors, key="vendor", placeholder="all vendors")
    b.multiselect("Segment", segments, key="segment", placeholder="all segments")
    c.toggle("Only GPUs that hold this run", key="fits", disabled=report is None)
    table = tables.gpu_table(
        data.filter_gpus(gpus, state["vendor"], state["segment"]),
        report,
        unit,
        only_fits=bool(state["fits"]) and report is not None,
    )
    tables.gpu_dataframe(table, unit, present=present.is_on())
    source = "your VRAM_GPUS_CSV" if data.custom_gpu_list() else "data/gpus.csv"
    st.caption(
        f"From {source}. Memory is what the driver reports; prices are typical on-demand "
        "figures per GPU-hour and vary by provider and region."
    )


main()
