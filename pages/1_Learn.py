"""Learn: where training memory goes, which lever shrinks which bucket, and exercises.

Every number on this page is computed live by `vram.estimate`, so the text can never disagree
with the calculator.
"""

from __future__ import annotations

import streamlit as st

import vram
from ui import (
    charts,
    compare,
    compare_chart,
    data,
    inputs,
    learn,
    lesson_bar,
    params,
    present,
    render,
    tables,
    text,
)

st.set_page_config(page_title="vram · learn", page_icon="🧮", layout="wide")


def examples(unit: charts.Unit) -> None:
    """Full vs LoRA vs QLoRA of one teaching-size model, live."""
    teaching = [e for e in data.catalog() if e.teaching_size]
    slugs = [e.slug for e in teaching] or [data.default_model()]
    if "learn_model" not in st.session_state:  # a link's model, if it is a teaching size
        linked = st.session_state.get("model")
        st.session_state["learn_model"] = linked if linked in slugs else data.default_model()
    st.segmented_control(
        "Model",
        slugs,
        key="learn_model",
        format_func=data.model_label,
    )
    slug = st.session_state.get("learn_model") or data.default_model()
    base = {**data.registry().defaults(), "model": slug, "opt": "adamw", **learn.TEACHING_STATE}
    labelled: list[tuple[str, vram.Estimate]] = []
    model = data.catalog_model(slug)
    for method in ("full", "lora", "qlora"):
        state = {**base, "method": method}
        setup, errors = params.build_setup(state)
        if setup is None:
            text.error(errors)
            return
        labelled.append((lesson_bar.SHORT_METHODS[method], vram.estimate(model, setup)))
    st.markdown(compare_chart.legend_markdown(), unsafe_allow_html=True)
    render.plot(compare.figure(labelled, unit, present=present.is_on(), height=480),
                key="learn_examples")
    st.caption(learn.TEACHING_NOTE)
    st.table(tables.bucket_table(labelled, unit), hide_index=True)


def seeds(unit: charts.Unit) -> None:
    """The seed figures in one click: parameters × bytes per parameter, the recipe named, and
    what the calculator says for the same run."""
    reg = data.registry()
    by_key = {seed.key: seed for seed in learn.SEEDS}
    if "learn_seed" not in st.session_state:
        st.session_state["learn_seed"] = learn.SEEDS[0].key
    st.segmented_control("Seed figure", list(by_key), key="learn_seed",
                         format_func=lambda k: by_key[k].title)
    seed = by_key.get(st.session_state.get("learn_seed") or "", learn.SEEDS[0])
    low, high = learn.seed_range_bytes(seed)
    figure = (charts.format_bytes(low, unit) if low == high else
              f"{charts.format_bytes(low, unit)} to {charts.format_bytes(high, unit)}")
    st.markdown(f"### {seed.params_billions:g}B × {seed.bytes_per_param:g} B/param ≈ {figure}")
    st.markdown(f"**Recipe.** {seed.recipe}\n\n**Why it matters.** {seed.why}")
    state = {**reg.defaults(), **seed.state}
    model, _ = data.resolve_model(state)
    setup, _ = params.build_setup(state)
    if model is not None and setup is not None:
        est = vram.estimate(model, setup)
        held = learn.model_state_bytes(est)
        link = learn.seed_link(reg, seed, present=present.is_on())
        st.caption(
            f"The calculator for {model.name} ({params.label('method', state['method'])}, "
            f"{state['prec']}): weights + all gradients + optimizer state = "
            f"{charts.format_bytes(held, unit)} ({held / est.params.total:.1f} B per "
            f"parameter of {est.params.total:,}), peak "
            f"{charts.format_bytes(est.device_peak_bytes, unit)} per GPU with activations and "
            "overhead."
        )
        if seed.calculator_note:
            st.caption(seed.calculator_note)
        # The app's own link (built from the seed's constants), kept out of the caption, where
        # the page echoes state and no link belongs.
        st.markdown(f"[Open it in the calculator]({link})")


def _run(state: dict[str, object]) -> vram.Estimate | None:
    """The estimate of the defaults with an exercise's overrides (None: it cannot be built)."""
    full = {**data.registry().defaults(), **state}
    model, _ = data.resolve_model(full)
    setup, errors = params.build_setup(full)
    if model is None or setup is None:
        text.error(errors)
        return None
    return vram.estimate(model, setup)


def what_if_example(unit: charts.Unit) -> None:
    """8B full with checkpointing, with 8-bit optimizer states and FP8 activations, live."""
    est = _run(learn.WHAT_IF_STATE)
    if est is None:
        return
    compress, what = learn.what_if_example(est)
    st.markdown(
        f"For example, {text.plain(est.model_name)} fully fine-tuned (AdamW, bf16 mixed, "
        f"checkpointing on) peaks at **{charts.format_bytes(est.device_peak_bytes, unit)}**; "
        f"with 8-bit optimizer states and FP8 activations, "
        f"**{charts.format_bytes(what.device_peak_bytes, unit)}** (at {what.moment}). "
        f"[Open this what-if in the calculator]({learn.what_if_link(data.registry(), compress)})")


def vlm_example(unit: charts.Unit) -> None:
    """The issue's Qwen2.5-VL-7B LoRA run with two 1080p images, live, and frozen."""
    est = _run(learn.VLM_STATE)
    frozen = _run({**learn.VLM_STATE, "vfreeze": True})
    if est is None or frozen is None:
        return
    st.markdown(learn.vlm_example_text(est, frozen, unit) +
                f" [Open this VLM run in the calculator]({learn.vlm_link(data.registry())})")


def exercises() -> None:
    for n, ex in enumerate(learn.EXERCISES, start=1):
        with st.container(border=True):
            st.markdown(f"**Exercise {n}.** {ex.question}")
            answer = st.number_input(
                "Your estimate (GB)",
                min_value=0.0,
                max_value=100_000.0,
                value=None,
                step=0.5,
                key=ex.key,
                placeholder="type a number of GB",
            )
            if answer is None:
                st.caption(f"Hint: {ex.hint}")
                continue
            checked = learn.check(ex, float(answer), _run)
            if checked is None:
                continue
            result, est = checked
            (st.success if result.ok else st.warning)(result.message)
            st.markdown(learn.explanation(est, ex.target))


def main() -> None:
    inputs.init_state()
    render.page_style()
    present.style()
    st.title("Where does training memory go?")
    units, mode = st.columns(2)
    with units:
        unit = inputs.unit_switch()
    with mode:
        present.toggle()
    inputs.show_url_errors()
    inputs.write_url()
    st.markdown(
        """
One training step keeps four kinds of things on the GPU at its peak, plus some overhead:

1. **Weights**: the model itself, in whatever precision (and quantization) it is held.
2. **Gradients**: one per *trained* parameter; a frozen base (LoRA, QLoRA) has none.
3. **Optimizer state**: AdamW keeps two running averages per trained parameter, usually fp32.
4. **Activations**: what the forward pass saves for the backward pass. It grows with
   batch × sequence length, and with the vocabulary for the logits.
5. **Overhead**: the CUDA context and the allocator's cache, which nvidia-smi counts.

Below, the same model three ways, computed live:
"""
    )
    examples(unit)
    st.header("Seed figures in one click")
    st.markdown("The back-of-the-envelope numbers a course starts from, each with its recipe, "
                "beside what the calculator says for the same run. " + learn.TEACHING_NOTE)
    seeds(unit)
    st.header("The levers: which technique shrinks which bucket")
    st.markdown(learn.LEVERS_MARKDOWN)
    st.header("What if the training state were compressed?")
    st.markdown(learn.WHAT_IF_MARKDOWN)
    what_if_example(unit)
    st.header("A vision-language model's token budget")
    st.markdown(learn.VLM_MARKDOWN)
    vlm_example(unit)
    st.header("Common wrong beliefs")
    st.markdown(learn.BELIEFS_MARKDOWN)
    st.header("Try it yourself")
    st.markdown(
        "Type your estimate (GB = 10⁹ bytes); the page checks it against the calculator "
        "(within 15 %) and shows where the number comes from."
    )
    exercises()


main()
