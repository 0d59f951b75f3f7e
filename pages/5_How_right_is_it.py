"""How right is it? Predicted against measured, for published runs (the README's table) and,
apart, for the project's own H200 steps; and the exact trace's agreement (computations in
ui.accuracy)."""

from __future__ import annotations

import streamlit as st

from ui import accuracy, inputs, present, render

st.set_page_config(page_title="vram · how right is it?", page_icon="🧮", layout="wide")


@st.cache_data(show_spinner="Estimating every measured run…")
def _points() -> tuple[list[accuracy.Point], bool]:
    shared, _ = accuracy.shared_points()
    return shared + accuracy.h200_points(), accuracy.CASES_CSV.exists()


def main() -> None:
    inputs.init_state()
    render.page_style()
    present.style()
    st.title("How right is it?")
    inputs.show_url_errors()
    points, have_shared = _points()
    if not have_shared:
        st.info("The shared case file (../shared/validation/cases.csv) is not beside this copy "
                "(the Docker image does not carry it): only our own H200 runs are shown. Run "
                "`python -m vram validate ../shared/validation/cases.csv` from a checkout for "
                "the published runs.")
    source = st.segmented_control(
        "Runs", accuracy.SOURCES, key="acc_source", default=accuracy.PUBLISHED, required=True,
        help="Published runs: others measured them, one figure each; the README's accuracy "
             "table and `vram validate` count these. Ours: the project's own H200 steps, "
             "each measured three ways (allocated, reserved, nvidia-smi).")
    mine = [p for p in points if p.source == source]
    stacks = sorted({p.stack for p in mine})
    methods = sorted({p.method for p in mine})
    metrics = sorted({p.metric for p in mine})
    a, b, c = st.columns(3)
    chosen_stacks = a.multiselect("Stack", stacks, placeholder="all stacks")
    chosen_methods = b.multiselect("Method", methods, placeholder="all methods")
    chosen_metrics = c.multiselect("Metric", metrics, placeholder="all metrics",
                                   help="allocated: torch.cuda.max_memory_allocated; reserved: "
                                        "max_memory_reserved; device: nvidia-smi.")
    shown = accuracy.filter_points(points, stacks=chosen_stacks, methods=chosen_methods,
                                   metrics=chosen_metrics, source=source)
    summary = accuracy.error_summary(shown)
    m1, m2, m3 = st.columns(3)
    unit = "runs" if source == accuracy.PUBLISHED else "figures"
    m1.metric(f"{unit.capitalize()} shown", f"{summary['cases']:,}")
    m2.metric("Median error", f"{summary['median_abs_pct']:.1f} %")
    m3.metric("Largest error", f"{summary['max_abs_pct']:.1f} %")
    st.caption(accuracy.source_note(source, points))
    render.plot(accuracy.scatter_figure(shown), key="accuracy")
    st.caption("On the dashed line the estimate equals the measurement; above it the estimate "
               "is high (safe), below it low. Hover a point for the run.")
    grid = accuracy.trace_agreement()
    if grid is not None:
        st.subheader("Against the exact trace")
        st.markdown(
            f"The estimate against an exact trace of the step on fake tensors "
            f"(benchmarks/trace_grid.txt): **{grid.agreeing} of {grid.rows}** setups agree "
            f"within tolerance; the largest peak difference is **{grid.max_abs_peak_pct:.1f} %**.")


main()
