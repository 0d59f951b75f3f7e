"""RL post-training: policy, reference, reward, critic and the rollout engine, phase by phase."""

from __future__ import annotations

import streamlit as st

import vram.rl as rl
from ui import data, render, text
from ui.charts import format_bytes
from ui.rl_view import (
    ALGOS,
    LEARN_RL,
    METHODS,
    RL_KEYS,
    ROLLOUTS,
    batch_limit,
    checked_choice,
    clamp_batch,
    default_gpu,
    parse_rl_query,
    phases_figure,
    rl_defaults,
    rl_query,
    rl_setup,
)

st.set_page_config(page_title="vram · RL", page_icon="🧮", layout="wide")


def _init_state() -> list[str]:
    state = st.session_state
    if state.get("_rl_ready"):
        for key in RL_KEYS:
            if key in state:
                state[key] = state[key]
        return []
    values = rl_defaults()
    parsed, errors = parse_rl_query({k: st.query_params[k] for k in st.query_params})
    values.update(parsed)
    for key, value in values.items():
        state[key] = value
    state["_rl_from_url"] = frozenset(parsed)
    state["_rl_ready"] = True
    return errors


def _widgets() -> None:
    a, b, c, d = st.columns(4)
    a.selectbox("Algorithm", ALGOS, key="rl_algo")
    b.selectbox("Policy method", METHODS, key="rl_method")
    c.selectbox("Rollout placement", ROLLOUTS, key="rl_rollout")
    d.selectbox("Gradient checkpointing", ("on", "off"), key="rl_ckpt")
    a, b, c, d = st.columns(4)
    a.number_input("Generations per prompt (G)", 1, 1024, key="rl_gens")
    b.number_input("Prompt tokens", 1, 131072, key="rl_plen")
    c.number_input("Completion tokens", 1, 131072, key="rl_clen")
    # batch x generations is the policy step's micro-batch: its bound depends on both
    d.number_input("Prompts per GPU", 1, batch_limit(st.session_state), key="rl_batch")
    a, b, c = st.columns(3)
    a.number_input("KL weight (beta)", 0.0, 100.0, key="rl_beta", step=0.01, format="%.3f")
    b.number_input("gpu_memory_utilization", 0.05, 1.0, key="rl_util", step=0.05)
    c.selectbox("Sleep level", (0, 1, 2), key="rl_sleep")


def main() -> None:
    data.stop_if_gpu_list_is_bad()
    errors = _init_state()
    st.title("RL post-training: generation and training, phase by phase")
    if errors:
        text.error(errors, lead="**Some settings in the link could not be used.**")
    models = [e.slug for e in data.catalog()]
    gpus = data.gpus()
    gpu_ids = [g.id for g in gpus]
    state = st.session_state
    from_url = state.get("_rl_from_url", frozenset())
    for key, options, default in (("rl_model", models, rl_defaults()["rl_model"]),
                                  ("rl_gpu", gpu_ids, default_gpu(gpu_ids))):
        state[key], message = checked_choice(key, state[key], options, default, key in from_url)
        if message:
            text.error([message])
    if message := clamp_batch(state):
        text.error([message])
    a, b = st.columns(2)
    names = {g.id: data.short_gpu_name(g.name) for g in gpus}
    model_slug = a.selectbox("Model", models, key="rl_model", format_func=data.model_label)
    gpu_id = b.selectbox("GPU", gpu_ids, key="rl_gpu", format_func=lambda i: names.get(i, i))
    _widgets()
    state = {key: st.session_state[key] for key in RL_KEYS}
    st.query_params.from_dict(rl_query(state))
    setup, message = rl_setup(state)
    if setup is None:
        text.error([message])
        return
    gpu = next(g for g in gpus if g.id == gpu_id)
    model = data.catalog_model(model_slug)
    result = rl.estimate(model, setup, gpu.memory_bytes)
    verdict = result.verdict.text()
    st.markdown(  # the GPU's name comes from a team's list: text, never Markdown
        f"**{text.plain(model.name)}**, {setup.algo.value}: peak "
        f"**{format_bytes(result.device_peak_bytes, 'GB')}** per GPU in the "
        f"**{result.peak_phase.value}** phase; {verdict} on {text.plain(gpu.name)}. Host RAM: "
        f"{format_bytes(result.host_bytes, 'GB')}.")
    render.plot(phases_figure(result, "GB"), key="rl_phases")
    if result.peak_by_sleep:
        st.caption("Training GPUs' peak by sleep level: " + ", ".join(
            f"{level}: {format_bytes(peak, 'GB')}" for level, peak in result.peak_by_sleep.items()))
    for warning in result.warnings:
        st.warning(warning)
    if result.advice:
        st.markdown("**Advice**\n\n" + "\n".join(f"- {a}" for a in result.advice))
    st.dataframe([{"role": m.role, "method": m.method,
                   "GB": round(m.bytes / 1e9, 2), "note": m.note} for m in result.models])
    with st.expander("Learn: why RL multiplies memory"):
        st.markdown(LEARN_RL)


main()
