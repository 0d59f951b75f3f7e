"""'Verify with an exact trace': the estimate and a real PyTorch step on fake tensors, side by side.

The trace needs the optional `trace` extra (torch, transformers, peft); without it the panel
says how to install it. A trace takes seconds, so it runs only when the button is pressed and
its result is cached per (model config, setup).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import streamlit as st

from ui import charts, render, step_charts, text
from ui.charts import Unit
from vram.result import Estimate
from vram.setup import TrainingSetup
from vram.trace import INSTALL_HINT, trace_available

BUCKETS = ("weights", "gradients", "optimizer", "activations")


@st.cache_data(show_spinner=False, max_entries=32)
def _trace(config_json: str, setup_json: str) -> dict[str, Any]:
    from vram.trace import trace_step

    setup = TrainingSetup.model_validate_json(setup_json)
    return trace_step(json.loads(config_json), setup).to_json()


def comparison_table(est: Estimate, traced: dict[str, Any], unit: Unit) -> pd.DataFrame:
    """Bucket by bucket at the allocated peak: estimate, trace, difference."""
    rows = []
    ours = est.bucket_bytes
    for name in BUCKETS:
        theirs = int(traced["buckets"].get(name, 0))
        rows.append(_row(name, ours[name], theirs, unit))
    rows.append(_row("allocated peak", est.allocated_peak_bytes,
                     int(traced["allocated_peak_bytes"]), unit))
    return pd.DataFrame(rows)


def signed_pct(value: float) -> str:
    """``+1.2 %``, ``-3.4 %``, and ``0.0 %`` for anything that rounds to zero (never -0.0)."""
    rounded = round(value, 1)
    return "0.0 %" if rounded == 0 else f"{rounded:+.1f} %"


def _row(name: str, ours: int, theirs: int, unit: Unit) -> dict[str, str]:
    diff = "—" if not theirs else signed_pct(100 * (ours - theirs) / theirs)
    return {"": name, "estimate": charts.format_bytes(ours, unit),
            "exact trace": charts.format_bytes(theirs, unit), "difference": diff}


def panel(est: Estimate, config: dict[str, Any] | None, unit: Unit) -> None:
    """The button and, once pressed, the comparison and the timeline."""
    with st.expander("Verify with an exact trace", expanded=False):
        if not trace_available():
            st.info("The exact trace runs the real Hugging Face model's training step on fake "
                    "tensors (no GPU, no weights downloaded). It needs the trace extra: "
                    f"`{INSTALL_HINT}`.")
            return
        if config is None:
            st.info("The trace needs the model's config.json: pick a catalog model, upload a "
                    "config, or give a size.")
            return
        st.caption("Runs the model's real forward, loss, backward and two optimizer steps on "
                   "fake tensors and counts every live byte. Single GPU only: sharding and "
                   "offload are not traced.")
        if not st.button("Run the exact trace", key="trace"):
            return
        try:
            with st.spinner("Tracing one training step…"):
                traced = _trace(json.dumps(config, sort_keys=True), est.setup.model_dump_json())
        except Exception as exc:
            text.error([f"The trace could not run this setup: {str(exc).splitlines()[0][:200]}"])
            return
        st.dataframe(comparison_table(est, traced, unit), hide_index=True)
        layers = traced["n_layers_traced"]
        st.caption(f"Peak during: estimate {est.phase.value}, trace {traced['phase']}. Traced "
                   f"with {' and '.join(map(str, layers))} layers and extended exactly to "
                   f"{traced['n_layers']} (past the first, layers are identical); the "
                   f"timeline shows the {traced['timeline_n_layers']}-layer trace.")
        points = [(int(e), int(b), str(ph)) for e, b, ph in traced["timeline"]]
        render.plot(step_charts.timeline_figure(points, peak_bytes=int(
            traced["allocated_peak_bytes"]), peak_phase=str(traced["phase"]), unit=unit),
            key="timeline")
