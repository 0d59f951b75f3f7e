""""Import a training config" in the sidebar: read an axolotl, torchtune, LLaMA-Factory or
TRL file (upload or paste), fill the controls from it, and show what each key set.

`state_from_loaded` is pure (no Streamlit): it turns a read config into widget values, snapping
a number that no control offers to the nearest one and saying so. The state then goes into the
URL as any other change does.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from ui import data, params
from vram.catalog import catalog_entry
from vram.errors import VramError
from vram.readers import FORMATS, LoadedTrainingConfig, load_training_config
from vram.setup import ALL_LINEAR, TrainingSetup

MAX_IMPORT_BYTES = 512_000
_REPORT = "_import_report"
_ERROR = "_import_error"

#: setup field -> state key (the app's controls), for fields the app shows.
KEY_FOR_FIELD: dict[str, str] = dict(params.FIELD_TO_KEY)

_NUMERIC_OPTIONS: dict[str, tuple[Any, ...]] = {
    "batch": tuple(range(1, params.BATCH_MAX + 1)),
    "seq": params.SEQ_OPTIONS,
    "rank": params.RANK_OPTIONS,
    "accum": params.ACCUM_OPTIONS,
    "dropout": params.DROPOUT_OPTIONS,
    "gpus": params.GPU_OPTIONS,
}


def _nearest(options: tuple[Any, ...], value: float) -> Any:
    return min(options, key=lambda option: (abs(option - value), option))


def _state_value(key: str, value: Any) -> Any:
    if key == "targets":
        return [ALL_LINEAR] if value == ALL_LINEAR else list(value)
    if key == "compile":
        return {None: "auto", True: "on", False: "off"}[value]
    if key == "loss":
        return "auto" if value is None else value
    if key == "quant" and value in (None, "none"):
        return None
    return value


def state_from_loaded(loaded: LoadedTrainingConfig,
                      keys: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """Widget values for a read config, and notes on values the controls had to round."""
    state: dict[str, Any] = {}
    notes: list[str] = []
    setup = loaded.setup.model_dump(mode="json")
    for field, value in setup.items():
        key = KEY_FOR_FIELD.get(field)
        if key is None or key not in keys:
            continue
        value = _state_value(key, value)
        if value is None:
            continue
        options = _NUMERIC_OPTIONS.get(key)
        if options is not None and value not in options:
            near = _nearest(options, value)
            notes.append(f"{field} {value} is not on the {key} control: set to {near}; the "
                         "CLI takes the exact value (`--from`)")
            value = near
        state[key] = value
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
        # Text, never a path: a pasted name must not read the server's files.
        loaded = load_training_config("\n" + text if "\n" not in text else text,
                                      format=None if chosen == "auto" else chosen,
                                      allow_file_reads=False)
    except VramError as exc:
        session[_ERROR] = str(exc)
        return
    values, notes = state_from_loaded(loaded, data.registry().keys)
    for key, value in values.items():
        session[key] = value
    session.pop(_ERROR, None)
    session[_REPORT] = {"report": loaded.report, "notes": notes}


def panel() -> None:
    """The sidebar expander; call inside `with st.sidebar`."""
    with st.expander("Import a training config", expanded=False):
        st.caption("axolotl, torchtune, LLaMA-Factory or TRL (YAML/JSON). Read as data only; "
                   "nothing in it is run or fetched.")
        st.file_uploader("Config file", type=["yaml", "yml", "json"], key="import_file")
        st.text_area("…or paste it", key="import_text", height=120)
        st.selectbox("Format", ("auto", *FORMATS), key="import_format")
        st.button("Import", key="import_go", on_click=_on_import)
        if st.session_state.get(_ERROR):
            st.error(st.session_state[_ERROR])
        shown = st.session_state.get(_REPORT)
        if shown:
            report = shown["report"]
            st.caption(f"Read as {report.format} ({report.tool_version})")
            st.dataframe([row.model_dump() for row in report.mapped], hide_index=True)
            if report.defaults:
                st.caption("Defaults the file leaves out")
                st.dataframe([d.model_dump() for d in report.defaults], hide_index=True)
            if report.not_modelled:
                st.caption("Read, not yet modelled")
                st.dataframe([n.model_dump() for n in report.not_modelled], hide_index=True)
            if report.ignored:
                st.caption("Ignored")
                st.dataframe([i.model_dump() for i in report.ignored], hide_index=True)
            for note in [*report.notes, *shown["notes"]]:
                st.caption(note)


def export_downloads(setup: TrainingSetup, model_choice: str) -> None:
    """Download buttons: this run as an axolotl YAML and as a TRL config."""
    from vram.export import to_axolotl_yaml, to_trl_yaml

    model = model_choice if catalog_entry(model_choice) else "YOUR-ORG/YOUR-MODEL"
    axolotl_text, _ = to_axolotl_yaml(setup, model)
    trl_text, _ = to_trl_yaml(setup, model)
    left, right = st.columns(2)
    left.download_button("This run as an axolotl config", axolotl_text, "axolotl.yml",
                         mime="application/yaml", key="export_axolotl")
    right.download_button("This run as a TRL config", trl_text, "trl_sft.yml",
                          mime="application/yaml", key="export_trl")
