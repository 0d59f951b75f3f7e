"""Pinned setups for the Compare page: pin, preset comparisons, remove.

Pins live in `st.session_state["pins"]` as state dicts and in the URL as ``pin`` parameters.
Buttons change them in callbacks, which run before the rerun, so the page and the URL agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from ui import compare_chart, data, inputs, params, text
from ui import present as present_mode
from ui.charts import SMALL_FONT_SIZE, Unit
from vram.result import Estimate
from vram.setup import TrainingSetup


def _pins() -> list[dict[str, Any]]:
    return list(st.session_state.get("pins") or [])


def _set(pins: list[dict[str, Any]]) -> None:
    st.session_state["pins"] = pins[: inputs.MAX_PINS]


def pin_current() -> None:
    _set([*_pins(), inputs.current()])


def pin_methods() -> None:
    now = inputs.current()
    _set([{**now, "method": method} for method in ("full", "lora", "qlora")])


def pin_lengths() -> None:
    now = inputs.current()
    _set([{**now, "seq": seq} for seq in (512, 2048, 8192, 32768)])


def clear() -> None:
    _set([])


def remove(index: int) -> None:
    pins = _pins()
    if 0 <= index < len(pins):
        del pins[index]
    _set(pins)


def pin_buttons() -> None:
    full = len(_pins()) >= inputs.MAX_PINS
    a, b, c, d = st.columns(4)
    a.button("Pin the current setup", on_click=pin_current, disabled=full, key="pin_now")
    b.button("Full vs LoRA vs QLoRA", on_click=pin_methods, key="pin_methods")
    c.button("4 sequence lengths", on_click=pin_lengths, key="pin_lengths")
    d.button("Clear", on_click=clear, key="pin_clear", disabled=not _pins())


def remove_buttons(labelled: Sequence[tuple[str, Estimate]]) -> None:
    cols = st.columns(max(1, len(labelled)))
    for n, (col, (name, _)) in enumerate(zip(cols, labelled, strict=False)):
        col.button(f"✕ Remove {n + 1}", on_click=remove, args=(n,), key=f"unpin_{n}",
                   help=text.plain(name))


def figure(labelled: Sequence[tuple[str, Estimate]], unit: Unit, *, present: bool,
           height: int = 560) -> go.Figure:
    """The side-by-side chart of Compare and Learn, sized for the mode."""
    return compare_chart.compare_figure(
        labelled, unit=unit, capacities=data.capacities(), height=height,
        font_px=present_mode.FONT_PX if present else SMALL_FONT_SIZE,
        keep_labelled=data.lesson_capacities(),
        min_figure_px=present_mode.MIN_FIGURE_PX if present else compare_chart.FIGURE_MIN_PX)


def build(pin: Mapping[str, Any]) -> tuple[TrainingSetup | None, list[str]]:
    return params.build_setup(pin)


def label(pin: Mapping[str, Any], model_name: str, index: int) -> str:
    return f"{index + 1}. {params.pin_label(pin, model_name)}"
