"""The lesson's controls: teaching-size presets, the method and gradient checkpointing.

The lesson (the Learn page, the seeds) walks 70B from full fine-tuning to LoRA to QLoRA with
gradient checkpointing on, "the first lever you reach for". Here that walk is the calculator's
first path: one click on a teaching size loads the model with checkpointing on, as the
lesson's recipes train (`learn.TEACHING_STATE`); the checkpointing switch sits next to batch
and sequence with its cost in compute beside it. In presentation mode, where the sidebar is
hidden, the same controls form a bar above the headline, and the run on screen is named in
large type.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from ui import data, learn, params, text

#: The teaching-size presets' widget (a view control: not in the URL; it mirrors the model).
SIZE_KEY = "lesson_size"
#: Short method names for the bar.
SHORT_METHODS = {"full": "Full", "lora": "LoRA", "qlora": "QLoRA"}


def teaching_sizes() -> dict[str, str]:
    """The catalog's teaching models, smallest first: slug -> "70B"."""
    return {e.slug: e.teaching_size for e in data.catalog() if e.teaching_size}


def _on_size() -> None:
    # Runs before the rerun. A click on the size already chosen deselects it (None): the
    # preset is applied again to the same model.
    state = st.session_state
    chosen = state.get(SIZE_KEY)
    if chosen:
        state["model"] = chosen
    state.update(learn.TEACHING_STATE)


def size_presets(*, collapsed: bool = False) -> None:
    """One click: a teaching-size model with gradient checkpointing on."""
    sizes = teaching_sizes()
    if not sizes:
        return
    current = st.session_state.get("model")
    st.session_state[SIZE_KEY] = current if current in sizes else None
    st.segmented_control(
        "Teaching size (checkpointing on, as the lesson)", list(sizes), key=SIZE_KEY,
        format_func=lambda slug: sizes.get(slug, slug), on_change=_on_size,
        label_visibility="collapsed" if collapsed else "visible",
        help="The lesson's models in one click, with gradient checkpointing on as the "
             "lesson's recipes train (QLoRA's reference script turns it on by default).",
    )


def checkpointing(cost: float | None, *, short: bool = False) -> None:
    """The gradient checkpointing switch, with what it costs in compute beside it: in its
    label in the presentation bar (one line), in a caption under it in the sidebar."""
    more = f"+{cost:.0%} compute" if cost is not None else ""
    label = (f"Checkpointing ({more})" if more else "Checkpointing") if short else \
        params.title("ckpt")
    # The key is the toggle's identity: its label may change with the cost.
    st.toggle(label, key="ckpt", help=params.KNOBS["ckpt"].meta.help or None, width="content")
    if more and not short:
        st.caption(f"{more}: the forward runs again in the backward; one input kept per "
                   "layer instead of all its activations.")


def method_switch() -> None:
    """Full / LoRA / QLoRA as one row of buttons (presentation mode); one is always chosen."""
    st.segmented_control("Method", list(SHORT_METHODS), key="method", required=True,
                         format_func=lambda m: SHORT_METHODS.get(m, m),
                         label_visibility="collapsed")


def run_summary(model_name: str, state: dict[str, Any], n_params: int,
                ckpt_cost: float | None = None) -> str:
    """The run on screen in one line of Markdown: model, method and the key knobs, with what
    checkpointing costs in compute."""
    cost = f" (+{ckpt_cost:.0%} compute)" if ckpt_cost is not None else ""
    ckpt = (f"checkpointing on{cost}" if state.get("ckpt")
            else f"checkpointing off (on: {cost.strip(' ()')})" if cost else "checkpointing off")
    gpus = int(state.get("gpus", 1))
    billions = f"{n_params / 1e9:.1f}B parameters"
    return (f"**{text.plain(model_name)}** ({billions}) · "
            f"**{text.plain(params.label('method', state['method']))}** · "
            f"{text.plain(params.label('opt', state['opt']))} · batch {int(state['batch'])} × "
            f"{int(state['seq']):,} tokens · **{ckpt}** · {gpus} GPU{'s' if gpus > 1 else ''}")
