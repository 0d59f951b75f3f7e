"""The RL page's state, figure and Learn text: pure functions, no Streamlit.

The page's own URL parameters (short keys, parsed with a message naming the parameter), the
side-by-side stacked bars of the generation and training phases, and the worked GRPO example.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

import vram
import vram.rl as rl
from ui.charts import (
    BUCKET_COLORS,
    FONT_FAMILY,
    KV_CACHE_COLOR,
    SMALL_FONT_SIZE,
    UNIT_BYTES,
    WORKING_COLOR,
    Unit,
)
from vram.result import BucketName


@dataclass(frozen=True)
class RLParam:
    key: str
    default: Any
    parse: Callable[[str], Any]
    title: str


def _choice(values: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        text = text.strip().lower()
        if text not in values:
            raise ValueError(f"allowed: {', '.join(values)}")
        return text

    return parse


def _int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"between {low} and {high}")
        return value

    return parse


def _float(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text[:12])
        if not low <= value <= high:
            raise ValueError(f"between {low} and {high}")
        return value

    return parse


def _slug(text: str) -> str:
    text = text.strip().lower()
    if not text or len(text) > 80 or not all(ch.isalnum() or ch in "-._" for ch in text):
        raise ValueError("a catalog name such as qwen2.5-7b-instruct")
    return text


ALGOS = tuple(a.value for a in rl.Algo)
ROLLOUTS = tuple(r.value for r in rl.Rollout)
METHODS = ("full", "lora", "qlora")

#: The page's parameters; every key is also the widget key and the URL parameter (prefixed
#: `rl_`, so the calculator's own parameters never collide with them).
RL_PARAMS: tuple[RLParam, ...] = (
    RLParam("rl_model", "qwen2.5-7b-instruct", _slug, "Model"),
    RLParam("rl_gpu", "h100-sxm", _slug, "GPU"),
    RLParam("rl_algo", "grpo", _choice(ALGOS), "Algorithm"),
    RLParam("rl_method", "lora", _choice(METHODS), "Policy method"),
    RLParam("rl_gens", 8, _int(1, 1024), "Generations per prompt"),
    RLParam("rl_plen", 512, _int(1, 131072), "Prompt tokens"),
    RLParam("rl_clen", 1024, _int(1, 131072), "Completion tokens"),
    RLParam("rl_batch", 1, _int(1, 1024), "Prompts per GPU"),
    RLParam("rl_beta", 0.0, _float(0.0, 100.0), "KL weight (beta)"),
    RLParam("rl_rollout", "colocate", _choice(ROLLOUTS), "Rollout placement"),
    RLParam("rl_util", 0.3, _float(0.05, 1.0), "gpu_memory_utilization"),
    RLParam("rl_sleep", 0, _int(0, 2), "Sleep level"),
    RLParam("rl_ckpt", "on", _choice(("on", "off")), "Gradient checkpointing"),
)
RL_KEYS = tuple(p.key for p in RL_PARAMS)


def rl_defaults() -> dict[str, Any]:
    return {p.key: p.default for p in RL_PARAMS}


def parse_rl_query(query: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The page's values from the URL, and one message per parameter that was ignored."""
    values: dict[str, Any] = {}
    errors: list[str] = [
        f"URL parameter {key[:40]!r} (= {str(query[key])[:60]!r}) is unknown on this page; it "
        "reads " + ", ".join(RL_KEYS) + "." for key in query if key not in RL_KEYS]
    for param in RL_PARAMS:
        if param.key not in query:
            continue
        try:
            values[param.key] = param.parse(query[param.key])
        except ValueError as exc:
            errors.append(f"URL parameter {param.key} ({param.title}): {exc}. "
                          f"Using the default, {param.default}.")
    return values, errors


def rl_query(state: Mapping[str, Any]) -> dict[str, str]:
    """The URL parameters of the page's state: only values that differ from the defaults."""
    return {p.key: str(state[p.key]) for p in RL_PARAMS
            if p.key in state and state[p.key] != p.default}


def rl_setup(state: Mapping[str, Any]) -> tuple[rl.RLSetup | None, str]:
    """The RLSetup of the page's state, or the message naming the field that is wrong."""
    algo = state["rl_algo"]
    offline = algo in ("dpo", "kto", "orpo", "simpo")
    try:
        policy = vram.TrainingSetup(method=state["rl_method"], precision="bf16-true",
                                    grad_ckpt=state["rl_ckpt"] == "on")
        setup = rl.RLSetup(
            algo=algo, policy=policy, num_generations=int(state["rl_gens"]),
            prompt_len=int(state["rl_plen"]), completion_len=int(state["rl_clen"]),
            batch=int(state["rl_batch"]), beta=float(state["rl_beta"]),
            rollout="none" if offline else state["rl_rollout"],
            gpu_memory_utilization=float(state["rl_util"]), sleep=int(state["rl_sleep"]))
    except ValueError as exc:
        errors = getattr(exc, "errors", None)
        if callable(errors):
            first = errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            message = str(first["msg"]).removeprefix("Value error, ")
            return None, f"{where}: {message}" if where else message
        return None, str(exc)
    return setup, ""


RL_COLORS: dict[str, str] = {
    **{b.value: c for b, c in BUCKET_COLORS.items()},
    "rollout_weights": WORKING_COLOR,
    "kv_cache": KV_CACHE_COLOR,
}
RL_LABELS: dict[str, str] = {
    "weights": "Weights", "gradients": "Gradients", "optimizer": "Optimizer state",
    "activations": "Activations", "rollout_weights": "Rollout weights",
    "kv_cache": "KV cache", "overhead": "Overhead",
}


def phases_figure(result: rl.RLEstimate, unit: Unit = "GB") -> go.Figure:
    """Both phases side by side, stacked by bucket, with the GPU's memory as a line."""
    scale = UNIT_BYTES[unit]
    phases = (result.generation, result.training)
    names = [f"{p.name.value}<br>({p.gpu_group} GPUs)" for p in phases]
    fig = go.Figure()
    for bucket in rl.RLBucket:
        fig.add_bar(name=RL_LABELS[bucket.value], x=names,
                    y=[p.buckets[bucket.value] / scale for p in phases],
                    marker_color=RL_COLORS[bucket.value])
    fig.add_hline(y=result.gpu_memory_bytes / scale, line_dash="dash",
                  annotation_text=f"GPU memory {result.gpu_memory_bytes / scale:.0f} {unit}",
                  annotation_font={"size": SMALL_FONT_SIZE, "color": "#333"})
    # The app shows it with the figure's own fonts (theme=None): with Streamlit's theme the
    # ticks and legend were 11-12 px and the phase names turned sideways on a phone. The
    # legend sits above the plot, so the bars keep the width.
    fig.update_layout(barmode="stack", yaxis_title=f"memory per GPU ({unit})", height=520,
                      legend={"traceorder": "normal", "orientation": "h", "y": 1.02,
                              "yanchor": "bottom", "x": 0, "font": {"size": SMALL_FONT_SIZE}},
                      font={"size": SMALL_FONT_SIZE, "family": FONT_FAMILY},
                      xaxis={"tickangle": 0, "tickfont": {"size": SMALL_FONT_SIZE}},
                      yaxis={"tickfont": {"size": SMALL_FONT_SIZE}},
                      margin={"l": 80, "r": 16, "t": 110, "b": 70},
                      plot_bgcolor="white", paper_bgcolor="white")
    return fig


assert set(RL_COLORS) >= {b.value for b in BucketName}

LEARN_RL = """
### Why RL needs more memory than fine-tuning

Supervised fine-tuning holds one model and its training state. RL post-training holds up to
**four models** and a **generation engine**:

- the **policy** (trained: weights, gradients, optimizer, activations);
- a **reference** (frozen; only when the KL weight `beta` > 0 for GRPO; free under LoRA,
  where it is the base with the adapters switched off);
- a **reward model** and a **critic** for PPO;
- the **rollout engine** (vLLM), with its own copy of the weights and a **KV cache** it
  reserves up front: `gpu_memory_utilization × total memory`.

And the batch multiplies: GRPO samples **G completions per prompt**, so the loss sees
`prompts × G × completion` rows of logits over the whole vocabulary (×4 in fp32).

**Worked example** (Qwen2.5-7B, LoRA, 1 prompt × G = 8 × (512 + 1024) tokens, vLLM colocated
at 0.3 on an 80 GB H100):

| piece | size |
|---|---|
| policy weights, bf16 | 7.6 B × 2 B ≈ 15.2 GB |
| vLLM weights, a second bf16 copy | ≈ 15.2 GB |
| vLLM budget 0.3 × 85.5 GB ≈ 25.7 GB; the KV pool is what is left | ≈ 8.1 GB |
| KV needed: 8 × ⌈1536 / 16⌉ blocks × 28 layers × 32 KiB per block | ≈ 0.70 GB |
| loss logits (bf16, traced): 4 B × 8 × 1024 × 152,064 | ≈ 5.0 GB |

The KV pool is 11× larger than needed here: lower `gpu_memory_utilization`, or use the
difference for more generations. Sleep mode frees the engine's weights and KV while training.
"""
