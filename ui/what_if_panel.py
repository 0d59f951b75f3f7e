""""What if a bucket were compressed?": for each bucket (weights, gradients, optimizer state,
activations) the times smaller it is stored, shown with the bits per value that makes; presets
named after published methods; the new peak and its moment, the cheapest fit, the fewest 80 GB
GPUs, and what then fits one GPU (the largest micro-batch, sequence and model).

The numbers are `vram.step.what_if` and `vram.plan.compressed`, the same the CLI prints with
``--compress``. The state is the URL's `compress` ("optimizer=4,activations=2", the CLI's
form), `whatif` (open) and `wgpu` (the GPU); like "Make it fit", nothing is computed while the
panel is closed, and a link with `compress` opens it.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import streamlit as st

from ui import data, headline, results, text
from ui.charts import Unit, format_bytes
from vram.result import BucketName, Estimate
from vram.step.what_if import (
    COMPRESSIBLE,
    PRESETS,
    element_bits,
    parse_ratios,
    ratios_text,
)

#: The ratios each bucket's control offers (1: as it is).
RATIO_STEPS: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0)
_PRESETS = "cmp_presets"
NAMES = {BucketName.WEIGHTS: "Weights", BucketName.GRADIENTS: "Gradients",
         BucketName.OPTIMIZER: "Optimizer state", BucketName.ACTIVATIONS: "Activations"}


def _key(bucket: BucketName) -> str:
    return f"cmp_{bucket.value}"


def _ratios() -> dict[BucketName, Fraction]:
    compress = str(st.session_state.get("compress") or "")
    return parse_ratios([t for t in compress.split(",") if t])


def _set(ratios: dict[BucketName, Fraction]) -> None:
    st.session_state["compress"] = ratios_text(ratios)


def _on_bucket() -> None:
    state = st.session_state
    _set({b: Fraction(str(state[_key(b)])).limit_denominator(10_000) for b in COMPRESSIBLE
          if _key(b) in state})


def _on_presets(est: Estimate) -> None:
    chosen = set(st.session_state.get(_PRESETS) or [])
    ratios = _ratios()
    for preset in PRESETS:
        if preset.key in chosen:
            ratios[preset.bucket] = preset.ratio_for(est)
        elif _matches(preset.key, ratios, est):
            ratios[preset.bucket] = Fraction(1)
    _set({b: r for b, r in ratios.items() if r != 1})


def _matches(key: str, ratios: dict[BucketName, Fraction], est: Estimate) -> bool:
    preset = next(p for p in PRESETS if p.key == key)
    ratio = ratios.get(preset.bucket)
    return ratio is not None and abs(float(ratio) - float(preset.ratio_for(est))) < 1e-3


def is_open() -> bool:
    return bool(st.session_state.get("whatif") or st.session_state.get("compress"))


def panel(est: Estimate, state: dict[str, Any], unit: Unit) -> None:
    """The toggle, and while it is on the controls and what they buy (`state`: the page's)."""
    st.subheader("What if a bucket were compressed?")
    if st.session_state.get("compress"):
        st.session_state["whatif"] = True  # a link with compress opens the panel
    st.toggle("Store a bucket in fewer bits: the new peak, its fit, and what then fits one "
              "GPU", key="whatif", help="Computed only while this is on (also in the link: "
              "whatif=1, compress=optimizer=4,...).")
    if not st.session_state.get("whatif"):
        return
    _controls(est)
    found = results.what_if_result(state)
    if found is None:
        st.caption("Choose a method, or how many times smaller a bucket is stored.")
        return
    _verdict(found, unit)
    _limits(state, unit)
    _sources(est)


def _controls(est: Estimate) -> None:
    ratios = _ratios()
    st.session_state[_PRESETS] = [p.key for p in PRESETS if _matches(p.key, ratios, est)]
    st.pills("Known methods", [p.key for p in PRESETS], key=_PRESETS, selection_mode="multi",
             format_func=lambda k: next(p.name for p in PRESETS if p.key == k),
             on_change=_on_presets, args=(est,),
             help="Each stores one bucket as its paper does; their sources are below.")
    columns = st.columns(len(COMPRESSIBLE))
    for column, bucket in zip(columns, COMPRESSIBLE, strict=True):
        now = element_bits(est, bucket)
        ratio = float(ratios.get(bucket, Fraction(1)))
        options = sorted({*RATIO_STEPS, ratio})
        st.session_state[_key(bucket)] = ratio
        label = NAMES[bucket] + (f" ({now:.3g} bits now)" if now else "")
        column.select_slider(label, options, key=_key(bucket), on_change=_on_bucket,
                             format_func=_ratio_label(now))


def _ratio_label(bits_now: float | None) -> Callable[[float], str]:
    """"÷4 (8 bits)": the ratio, and the bits per value it leaves where they are known."""
    def label(ratio: float) -> str:
        if ratio == 1:
            return "as is"
        shown = f"÷{ratio:.3g}"
        return f"{shown} ({bits_now / ratio:.3g} bits)" if bits_now else shown

    return label


def _verdict(found: results.WhatIfResult, unit: Unit) -> None:
    what, fitted = found.what, found.report
    peak, cheapest, lesson = st.columns(3)
    peak.metric("Peak with compression", format_bytes(what.device_peak_bytes, unit),
                delta=(f"saves {format_bytes(what.saved_bytes, unit)}, at {what.moment}"),
                delta_color="off", delta_arrow="off",
                help=f"Was {format_bytes(what.before_device_peak_bytes, unit)}. Every moment "
                     "of the step with these buckets smaller; the peak may move.")
    best = next((o for o in fitted.fits if o.usd_per_hour is not None), None)
    if best is not None:
        cheapest.metric("Cheapest per hour, then",
                        f"{best.count}× {data.short_gpu_name(best.gpu.name)}",
                        delta=headline.gpu_price(best.usd_per_hour), delta_color="off",
                        delta_arrow="off")
    else:
        cheapest.metric("Cheapest per hour, then", "none in the list")
    if found.lesson is not None:
        value = f"{found.lesson.count}× 80 GB"
        line = "fits one 80 GB GPU" if found.lesson.count == 1 else "as the fit shards it"
        lesson.metric("80 GB GPUs then", value, delta=line, delta_color="off",
                      delta_arrow="off")
    st.caption("Bytes at the new peak: " + ", ".join(
        f"{name} {format_bytes(n, unit)}" for name, n in what.buckets.items()) + ".")


def _limits(state: dict[str, Any], unit: Unit) -> None:
    gpus = data.gpus()
    ids = [g.id for g in gpus]
    st.selectbox("What then fits one", ids, key="wgpu",
                 format_func=lambda i: data.short_gpu_name(next(g.name for g in gpus
                                                                if g.id == i)))
    found = results.limits(state)
    if found is None:
        return
    batch, seq, size = st.columns(3)
    batch.metric("Largest micro-batch", f"{found.micro_batch.value:,}",
                 delta=f"was {found.micro_batch_before.value:,}", delta_color="off",
                 delta_arrow="off")
    seq.metric("Longest sequence (tokens)", f"{found.seq_len.value:,}",
               delta=f"was {found.seq_len_before.value:,}", delta_color="off",
               delta_arrow="off")
    size.metric("Largest model (Llama-shaped)", f"{found.model_params / 1e9:,.1f}B",
                delta=f"was {found.model_params_before / 1e9:,.1f}B", delta_color="off",
                delta_arrow="off",
                help="This setup with a Llama-shaped model of that many parameters: the "
                     "estimate there fits, a tenth of a billion more does not.")


def _sources(est: Estimate) -> None:
    chosen = [p for p in PRESETS if _matches(p.key, _ratios(), est)]
    if chosen:
        st.markdown("\n".join(f"- **{p.name}**: {text.plain(p.quality)}. "
                              f"*{text.plain(p.source)}*" for p in chosen))
    st.caption("A what-if, not a method: each bucket's bytes at every moment of the step, "
               "divided; the allocator's slack keeps its share, the CUDA context stays. "
               "The same as python -m vram estimate ... --compress BUCKET=RATIO.")
