""""Import a training config" in the sidebar: read an axolotl, torchtune, LLaMA-Factory, TRL
or ms-swift file (upload or paste), fill the controls from it, and show what each key set.

`state_from_loaded` is pure (no Streamlit): it turns a read config into widget values, snapping
a number that no control offers to the nearest one and saying so. The state then goes into the
URL as any other change does.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from ui import data, params, text
from vram.errors import VramError
from vram.io.knobs import setup_knobs
from vram.io.readers import FORMATS, LoadedTrainingConfig, load_training_config
from vram.model.catalog import catalog_entry
from vram.setup import TrainingSetup

MAX_IMPORT_BYTES = 512_000
_REPORT = "_import_report"
_ERROR = "_import_error"
#: The expander's open state (not in the URL).
OPEN = "_import_open"

def _nearest(offered: tuple[Any, ...], value: float) -> Any:
    numbers = [v for v in offered if isinstance(v, int | float) and not isinstance(v, bool)]
    return min(numbers, key=lambda option: (abs(option - value), option))


def state_from_loaded(loaded: LoadedTrainingConfig,
                      keys: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """Widget values for a read config, and notes on values the controls had to round."""
    state: dict[str, Any] = {}
    notes: list[str] = []
    for knob in setup_knobs():
        if knob.key not in keys:
            continue
        value = params.app_value(knob, getattr(loaded.setup, knob.name))
        offered = params.options(knob.key)
        if knob.kind in ("int", "float") and value not in offered:
            near = _nearest(offered, value)
            notes.append(f"{knob.name} {value} is not on the {knob.label} control: set to "
                         f"{near}; the CLI takes the exact value (`--from`)")
            value = near
        elif knob.kind == "choice" and value not in offered:
            notes.append(f"{knob.name} {value} is not offered by the app; left as it was")
            continue
        state[knob.key] = value
    if loaded.model_slug is not None:
        state["model"] = loaded.model_slug
    elif loaded.model_problem:
        notes.append(f"model kept as it was: {loaded.model_problem}")
    return state, notes


def _on_import() -> None:
    session = st.session_state
    upload = session.get("import_file")
    text: str | bytes | None = None
    if upload is not None:
        if upload.size > MAX_IMPORT_BYTES:
            session[_ERROR] = f"file: {upload.size:,} bytes; at most {MAX_IMPORT_BYTES:,}"
            return
        text = upload.getvalue()
    elif (session.get("import_text") or "").strip():
        text = session["import_text"]
    if text is None:
        session[_ERROR] = "upload a file or paste its text first"
        return
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            session[_ERROR] = "file: not UTF-8 text"
            return
    chosen = session.get("import_format", "auto")
    try:
        # Text, never a path, and a model named only from the catalog: a pasted name must not
        # read, or tell what is at, a path on the server.
        loaded = load_training_config(text, format=None if chosen == "auto" else chosen,
                                      allow_file_reads=False, filesystem=False)
    except VramError as exc:
        session[_ERROR] = str(exc)
        return
    values, notes = state_from_loaded(loaded, data.registry().keys)
    for key, value in values.items():
        session[key] = value
    session.pop(_ERROR, None)
    session[_REPORT] = {"report": loaded.report, "notes": notes}


def panel() -> None:
    """The sidebar expander; call inside `with st.sidebar`. Its contents are drawn only while
    it is open (closed, they would cost about 1.5 ms of server CPU on every rerun, issue 13)."""
    with st.expander("Import a training config", key=OPEN, on_change="rerun") as expander:
        if expander.open:
            _contents()


def _contents() -> None:
    st.caption("axolotl, torchtune, LLaMA-Factory, TRL or ms-swift (YAML/JSON), or an ms-swift "
               "`swift sft` script. Read as data only; nothing in it is run or fetched.")
    st.file_uploader("Config file", type=["yaml", "yml", "json", "sh"], key="import_file")
    st.text_area("…or paste it", key="import_text", height=120)
    st.selectbox("Format", ("auto", *FORMATS), key="import_format")
    st.button("Import", key="import_go", on_click=_on_import)
    if st.session_state.get(_ERROR):
        text.error([st.session_state[_ERROR]])  # quotes the file: shown as text
    shown = st.session_state.get(_REPORT)
    if shown:
        report = shown["report"]
        st.caption(f"Read as {report.format} ({text.plain(report.tool_version)})")
        # Lists, not grids: three grid columns in the sidebar's 300 px were cut to one
        # letter a value; a list wraps.
        st.markdown(report_markdown([(r.key, r.value, r.sets) for r in report.mapped]))
        if report.defaults:
            st.caption("Defaults the file leaves out")
            st.markdown(report_markdown([(d.field, d.value, d.source)
                                         for d in report.defaults]))
        if report.not_modelled:
            st.caption("Read, not yet modelled")
            st.markdown(report_markdown([(n.field, n.value, n.note)
                                         for n in report.not_modelled]))
        if report.ignored:
            st.caption("Ignored")
            st.markdown(report_markdown([(i.key, "", i.reason) for i in report.ignored]))
        for note in [*report.notes, *shown["notes"]]:
            st.caption(text.plain(note))


def report_markdown(rows: list[tuple[str, str, str]]) -> str:
    """One bullet per key: "**key** = value: what it sets", every value whole and shown as
    text (the file is the user's)."""
    return "\n".join(
        f"- **{text.plain(key)}**" + (f" = {text.plain(value)}" if value else "")
        + (f": {text.plain(note)}" if note else "") for key, value, note in rows)


def export_downloads(setup: TrainingSetup, model_choice: str) -> None:
    """Download buttons: this run as an axolotl YAML and as a TRL config."""
    from vram.io.export import to_axolotl_yaml, to_trl_yaml

    model = model_choice if catalog_entry(model_choice) else "YOUR-ORG/YOUR-MODEL"
    left, right = st.columns(2)
    # Deferred: the YAML is written when someone clicks, not stored on every rerun.
    left.download_button("This run as an axolotl config",
                         lambda: to_axolotl_yaml(setup, model)[0], "axolotl.yml",
                         mime="application/yaml", key="export_axolotl")
    right.download_button("This run as a TRL config",
                          lambda: to_trl_yaml(setup, model)[0], "trl_sft.yml",
                          mime="application/yaml", key="export_trl")
