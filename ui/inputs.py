"""The sidebar and the URL: widgets with short keys that are also the query parameter names.

Streamlit reruns the page script from the top on every change. The state lives in
`st.session_state` under the keys of `ui.params`; on a session's first run it is filled from
the URL (bad parameters are reported and ignored), and after the widgets are drawn the URL is
rewritten from it, so a copied link reproduces the view.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import streamlit as st

from ui import data, import_config, lesson_bar, params, present, render, results, text
from ui.charts import Unit
from vram.errors import VramError
from vram.model.architecture import read_config_text

#: Bigger than the default 1 MB cap would allow for nothing: a real config.json is a few KB.
MAX_UPLOAD_BYTES = params.MAX_CONFIG_BYTES
MAX_PINS = 4
_ERRORS = "_url_errors"
_READY = "_state_ready"
#: The sidebar's Advanced expander (its open state; not in the URL).
ADVANCED = "_advanced"


def init_state() -> None:
    """Call at the top of every page, before any widget.

    Reads the URL on the session's first run. On later runs it re-assigns every value, which
    keeps widget state alive when the person moves to a page that does not draw that widget
    (Streamlit drops the state of widgets that were not drawn in a run).
    """
    data.stop_if_gpu_list_is_bad()
    reg = data.registry()
    state = st.session_state
    if not state.get(_READY):
        values = reg.defaults()
        query = {k: st.query_params[k] for k in st.query_params if k != "pin"}
        parsed, errors = params.parse_query(reg, query)
        values.update(parsed)
        pins, pin_errors = params.parse_pins(reg, st.query_params.get_all("pin"), MAX_PINS)
        for key, value in values.items():
            state[key] = value
        state["pins"] = pins
        state[_ERRORS] = errors + pin_errors
        state[_READY] = True
    else:
        for key in reg.keys:
            if key in state:
                state[key] = state[key]


def show_url_errors() -> None:
    """Report URL parameters that were ignored (once, on the run that read them)."""
    errors = st.session_state.pop(_ERRORS, [])
    if errors:
        st.error(  # each line quotes the URL: shown as plain text, never as Markdown
            "Some settings in the link could not be used:\n\n"
            + "\n".join(f"- {text.plain(line)}" for line in errors)
        )


def current() -> dict[str, Any]:
    """The state dict of the current run."""
    reg = data.registry()
    return {key: st.session_state.get(key, reg[key].default) for key in reg.keys}


def write_url() -> None:
    """Rewrite the URL from the state: only values that differ from the defaults, plus pins."""
    reg = data.registry()
    query: dict[str, str | list[str]] = dict(params.to_query(reg, current()))
    pins = st.session_state.get("pins") or []
    if pins:
        query["pin"] = [params.dump_pin(reg, pin) for pin in pins]
    if dict(st.query_params.to_dict()) != query or pins:
        st.query_params.from_dict(query)


def _on_gpus_change() -> None:
    # Runs before the rerun: pick a sharding that makes sense for the new count, so moving
    # the GPU control never lands on a setup that cannot be estimated.
    state = st.session_state
    state["shard"] = params.sharding_for(int(state["gpus"]), state["shard"])


def _on_upload() -> None:
    file = st.session_state.get("upload")
    if file is None:
        return
    if file.size > MAX_UPLOAD_BYTES:
        st.session_state["_upload_error"] = (
            f"config.json: the file is {file.size:,} bytes; a config.json is at most "
            f"{MAX_UPLOAD_BYTES:,} bytes."
        )
        return
    raw = file.getvalue()
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        st.session_state["_upload_error"] = "config.json: the file is not UTF-8 text."
        return
    try:
        config = read_config_text(decoded)  # JSON only; nothing in the file is executed
    except VramError as exc:
        st.session_state["_upload_error"] = str(exc)
        return
    st.session_state.pop("_upload_error", None)
    # Compact JSON keeps the link short; the state (and so the URL) carries the config.
    st.session_state["config"] = json.dumps(config, separators=(",", ":"))


def _knob_control(key: str, method: str) -> None:
    """The control of one setup knob, built from its declaration on `TrainingSetup`."""
    knob = params.KNOBS[key]
    choices = params.options(key)
    common: dict[str, Any] = {
        "key": key,
        "help": knob.meta.help or None,
        "disabled": not params.applies(key, method),
    }
    if key in _ON_CHANGE:
        common["on_change"] = _ON_CHANGE[key]
    if knob.kind == "bool" and not knob.optional:
        st.toggle(knob.label, **common)
    elif knob.kind == "targets":
        st.multiselect(knob.label, choices, **common)
    elif knob.kind in ("int", "float") and knob.meta.app_options and not knob.optional:
        st.select_slider(knob.label, choices, format_func=_number_label, **common)
    else:
        st.selectbox(knob.label, choices, format_func=lambda v: params.label(key, v), **common)


def _number_label(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


#: Controls that adjust another when they move.
_ON_CHANGE: dict[str, Callable[[], None]] = {"gpus": _on_gpus_change}


#: Knobs drawn above Advanced, in this order: the lesson's path (method, optimizer, batch,
#: sequence and gradient checkpointing, "the first lever you reach for").
FRONT_KEYS = ("method", "opt", "batch", "seq", "ckpt")


def _checkpointing_cost() -> float | None:
    """What checkpointing adds to this run's compute (cached with the run's estimate)."""
    return results.result(current()).ckpt_compute


def sidebar(*, bar: bool = False) -> dict[str, Any]:
    """Draw the setup controls in the sidebar; return the state dict they produce.

    The model and its teaching-size presets, then method, optimizer, batch, sequence and
    gradient checkpointing; every other knob of `TrainingSetup` is drawn under Advanced from
    its declaration, so a new knob appears there by itself. With `bar` (presentation mode)
    the presets, the method and checkpointing are drawn in the bar instead (`lesson_bar`).
    """
    reg = data.registry()
    with st.sidebar:
        st.header("Training setup")
        import_config.panel()
        st.selectbox(
            "Model",
            reg.model_options,
            key="model",
            format_func=data.model_label,
            help="The teaching sizes come first; type to search the catalog.",
        )
        model = st.session_state["model"]
        if model == params.UPLOAD:
            st.file_uploader(
                "config.json",
                type=["json"],
                key="upload",
                on_change=_on_upload,
                help=f"A Hugging Face config.json, at most {MAX_UPLOAD_BYTES // 1024} KB. "
                "It is read as JSON only.",
            )
            if st.session_state.get("_upload_error"):
                text.error([st.session_state["_upload_error"]])
        elif model == params.BY_SIZE:
            st.number_input(
                "Parameters (billions)",
                min_value=0.01,
                max_value=10_000.0,
                step=1.0,
                key="size",
                help="A Llama-shaped model of this size (approximate).",
            )
        if not bar:
            lesson_bar.size_presets()
            st.radio(
                params.title("method"),
                params.options("method"),
                key="method",
                horizontal=True,
                format_func=lambda v: params.label("method", v),
            )
        method = str(st.session_state["method"])
        _knob_control("opt", method)
        batches = params.options("batch")
        st.slider(params.title("batch"), batches[0], batches[-1], key="batch")
        _knob_control("seq", method)
        if not bar:
            lesson_bar.checkpointing(_checkpointing_cost())
        # Drawn only while open: closed, its twenty controls would still cost about 12 ms of
        # server CPU a rerun (issue 13). Their values live on in the state (`init_state`).
        with st.expander("Advanced", key=ADVANCED, on_change="rerun") as advanced:
            if advanced.open:
                for key, knob in params.KNOBS.items():
                    if not knob.meta.basic and key not in FRONT_KEYS:
                        _knob_control(key, method)
    return current()


def unit_switch(*, collapsed: bool = False) -> Unit:
    """GB (10^9 bytes) or GiB (2^30 bytes), for every figure on the page."""
    st.radio(
        "Units",
        params.UNITS,
        key="unit",
        horizontal=True,
        help="GB = 10⁹ bytes (vendors), GiB = 2³⁰ bytes (nvidia-smi).",
        label_visibility="collapsed" if collapsed else "visible",
        width="content",
    )
    return "GiB" if st.session_state["unit"] == "GiB" else "GB"



def page_start(title: str, *, sync_url: bool = True, lesson: bool = False,
               ) -> tuple[dict[str, Any], Unit]:
    """What every calculator page does first: state, style, sidebar, the title with the unit
    switch beside it, URL problems, and (unless the page writes it later) the URL.

    With `lesson` (the calculator), presentation mode puts the teaching sizes, the method and
    checkpointing in a bar above the headline, since the sidebar is hidden there."""
    init_state()
    render.page_style()
    present.style()
    bar = lesson and present.is_on()
    state = sidebar(bar=bar)
    if bar:  # one row, each control as wide as its content (wraps on a narrow screen)
        with st.container(horizontal=True, vertical_alignment="center", gap="medium"):
            lesson_bar.size_presets(collapsed=True)
            lesson_bar.method_switch()
            lesson_bar.checkpointing(None, short=True)  # its cost: in the run's summary
            present.toggle()
        # The units are set before the lesson (and kept in the link): no room in the row.
        unit: Unit = "GiB" if st.session_state.get("unit") == "GiB" else "GB"
        state = current()
    else:
        head, units = st.columns([3, 1])
        head.title(title)
        with units:
            unit = unit_switch()
            present.toggle()
    show_url_errors()
    if sync_url:
        write_url()
    return state, unit
