"""The "Make it fit" panel: my GPU and tokens to train in the sidebar, the verdict, the largest
batch and sequence, the lever path as a waterfall of memory, time and cost beside it.

The panel opens with a toggle (`plan=1` in the URL). Closed, it computes nothing: a plan is
dozens of estimates (40-150 ms of CPU for a new state), more than the rest of the page together,
and it ran on every rerun of every session (issue 13: at most 40 ms of server CPU a rerun).
A link that carries the panel's settings (`mygpu`, `mycount`, `tokens`) opens it too, so links
made before the toggle still show the plan.

Its four URL keys are read and written here, so the shared parameter registry needs no change:
on a session's first run `read_url` takes them out of the query string before the registry
reads it, and `write_url` puts them back after the page.
"""

from __future__ import annotations

import html
from typing import Any

import streamlit as st

import vram
from ui import data, plan_chart, render, results, text
from ui.charts import Unit, format_bytes

ANY = "any"
#: The toggle's key: the panel is drawn (and the plan computed) only while it is on.
OPEN = "plan"
#: key -> default; tokens are in millions.
DEFAULTS: dict[str, Any] = {OPEN: False, "mygpu": ANY, "mycount": 1, "tokens": 100.0}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
MAX_COUNT = 64
MAX_TOKENS_M = 1e9
_READY = "_plan_url_ready"
_ERRORS = "_plan_url_errors"


def _parse(key: str, text: str, gpu_ids: tuple[str, ...]) -> Any:
    if key == OPEN:
        word = text.strip().lower()
        if word not in (*_TRUE, *_FALSE):
            raise ValueError("use 1 or 0")
        return word in _TRUE
    if key == "mygpu":
        if text not in (ANY, *gpu_ids):
            raise ValueError(f"unknown GPU {text[:40]!r}")
        return text
    if key == "mycount":
        count = int(text)
        if not 1 <= count <= MAX_COUNT:
            raise ValueError(f"GPUs must be 1 to {MAX_COUNT}")
        return count
    value = float(text)
    if not 0 < value <= MAX_TOKENS_M:
        raise ValueError(f"tokens (millions) must be above 0 and at most {MAX_TOKENS_M:g}")
    return value


def read_url() -> None:
    """Call first on the page: take this panel's keys out of the URL (first run only)."""
    data.stop_if_gpu_list_is_bad()  # it reads the GPU list before the shared state does
    state = st.session_state
    if state.get(_READY):
        for key in DEFAULTS:  # keep the values alive across pages that do not draw them
            if key in state:
                state[key] = state[key]
        return
    gpu_ids = tuple(g.id for g in data.gpus())
    errors: list[str] = []
    given = {key for key in DEFAULTS if key in st.query_params}
    for key, default in DEFAULTS.items():
        state[key] = default
        if key in st.query_params:
            text = st.query_params[key]
            del st.query_params[key]
            try:
                state[key] = _parse(key, text, gpu_ids)
            except ValueError as exc:
                shown = int(default) if isinstance(default, bool) else default
                errors.append(f"URL parameter {key}: {exc}; using {shown}.")
    if OPEN not in given and given:  # a link with the panel's settings, from before the toggle
        state[OPEN] = True
    state[_ERRORS] = errors
    state[_READY] = True


def write_url() -> None:
    for key, default in DEFAULTS.items():
        value = st.session_state.get(key, default)
        if value == default:
            if key in st.query_params:
                del st.query_params[key]
        else:
            text = ("1" if value else "0") if isinstance(value, bool) else (
                f"{value:g}" if isinstance(value, float) else str(value))
            if st.query_params.get(key) != text:
                st.query_params[key] = text


def is_open() -> bool:
    return bool(st.session_state.get(OPEN, False))


def sidebar() -> None:
    """The panel's inputs, while it is open (closed, their values live on in the state)."""
    if not is_open():
        return
    gpus = {g.id: g for g in data.gpus()}
    with st.sidebar:
        st.header("My hardware and run")
        st.selectbox(
            "My GPU", (ANY, *gpus), key="mygpu",
            format_func=lambda i: "any in the list" if i == ANY
            else data.short_gpu_name(gpus[i].name),
            help="The verdict, the largest batch and sequence and the path are for this GPU; "
                 "'any' takes the cheapest option that holds the run.",
        )
        st.number_input("GPUs", 1, MAX_COUNT, key="mycount", step=1,
                        disabled=st.session_state["mygpu"] == ANY)
        st.number_input("Tokens to train (millions)", min_value=0.001, max_value=MAX_TOKENS_M,
                        key="tokens", step=100.0, format="%g",
                        help="Data-set tokens x epochs, or steps x global batch x sequence.")


def _money(value: float | None) -> str:
    return "price unknown" if value is None else f"${value:,.2f}"


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} h"


def panel(model: vram.ModelSpec, setup: vram.TrainingSetup, unit: Unit) -> None:
    """The toggle, and the panel itself while it is on; call after the calculator's tables."""
    state = st.session_state
    for message in state.pop(_ERRORS, []):
        text.error([message])
    st.subheader("Make it fit")
    st.toggle("On my GPU: the verdict, the largest batch and sequence, the path and the cost",
              key=OPEN, help="Computed only while this is on (also in the link: plan=1). "
                             "My GPU, how many and the tokens to train are in the sidebar.")
    if not is_open():
        return
    _plan_view(model, setup, unit)


def _plan_view(model: vram.ModelSpec, setup: vram.TrainingSetup, unit: Unit) -> None:
    state = st.session_state
    gpu_id = state.get("mygpu", ANY)
    hardware = None if gpu_id == ANY else vram.Hardware(gpu=gpu_id, count=int(state["mycount"]))
    tokens = float(state.get("tokens", DEFAULTS["tokens"])) * 1e6
    # Cached by its inputs (ui.results): a plan is dozens of estimates.
    result = results.plan(model, setup, hardware, tokens)

    where = f"{result.hardware.total}× {plan_chart.gpu_name(result)}"
    verdict, batch, seq, cost = st.columns(4)
    verdict.metric(
        f"On {where}" + ("" if result.hardware_given else " (cheapest run)"),
        "fits" if result.fits else "does not fit",
        delta=(f"{format_bytes(result.headroom_bytes, unit)} headroom" if result.fits
               else f"short by {format_bytes(result.shortfall_bytes, unit)}"),
        delta_color="normal" if result.fits else "inverse", delta_arrow="off",
        help="The device peak (what nvidia-smi shows) against the memory the driver reports.",
    )
    # The limits are the run as set up; the cost is the run after the path (when one is
    # needed): "largest micro-batch 0" beside a price said nothing of which run that was.
    batch.metric("Largest micro-batch, as set up", f"{result.max_micro_batch.value:,}",
                 delta="none fits before the path" if result.max_micro_batch.value == 0
                 else None, delta_color="off", delta_arrow="off",
                 help="The estimate at this batch fits; at one more it does not.")
    seq.metric("Longest sequence, as set up", f"{result.max_seq_len.value:,}",
               help="Tokens: the estimate at this length fits; one token more does not.")
    cost.metric("This run" + (", after the path" if result.path else ""),
                _money(result.usd_per_run), delta=_hours(result.hours),
                delta_color="off", delta_arrow="off",
                help="With the path below applied when it is needed; time from FLOPs, the "
                     "GPU's dense bf16 rate and an MFU calibrated on published throughputs.")
    st.write(f"**Path:** {result.path_summary}")
    chart, side = st.columns([3, 2])
    with chart:
        render.plot(results.plan_figure(model, setup, hardware, tokens, unit), key="plan_path")
    with side:
        # Markdown tables: lighter for the browser than data grids, and they wrap.
        if result.path:
            st.markdown(_table(["step", "saves", "time"], [
                [s.name, format_bytes(s.saved_bytes, unit), _pct(s.time_factor)]
                for s in result.path]))
        st.markdown(_table(["cheapest runs", "hours", "$ per run"], [
            [f"{o.count}× {data.short_gpu_name(o.name)}", _hours(o.hours),
             _money(o.usd_per_run)]
            for o in result.options if o.fits][:8]))
    with st.expander(f"Every lever that saves memory here ({len(result.levers)})"):
        st.markdown(_table(["lever", "saves", "time", "fits", "quality (source)"], [
            [lever.name, format_bytes(lever.saved_bytes, unit), _pct(lever.time_factor),
             "yes" if lever.fits else "no", lever.quality_note]
            for lever in result.levers]))
        if result.costly_levers:
            st.caption("Would cost memory here, not save it: " + "; ".join(
                f"{lever.name} (+{format_bytes(-lever.saved_bytes, unit)})"
                for lever in result.costly_levers) + ".")


def _pct(factor: float) -> str:
    return f"{(factor - 1) * 100:+.0f} %"


def _table(header: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return html.escape(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
