"""Checks on a config.json that hold for every architecture, before and after it is read.

Before: every number in the config is in a sane range, so a 5,000-digit integer or a dropout
of 7 is refused with the key and the range, whatever family reads it. After: the shape the
family built is one a model can have: every head is at least one unit wide (more heads than
hidden units gives a head width of 0), and the key/value heads divide the query heads (grouped
attention shares each KV head among a whole number of query heads).

`checked_model` is the one entry point; `vram.model.architecture.model_from_config` calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from vram.errors import ConfigError

if TYPE_CHECKING:
    from vram.model.spec import ModelSpec

#: No count in a config is anywhere near this; bigger integers are refused before any use
#: (their text alone would be thousands of digits in a message).
MAX_CONFIG_INTEGER = 10**18

#: Fractions and scales the readers use: (low, high), inclusive.
FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "dropout_rate": (0.0, 1.0),
    "attention_probs_dropout_prob": (0.0, 1.0),
    "hidden_dropout_prob": (0.0, 1.0),
    "attention_dropout": (0.0, 1.0),
    "residual_dropout": (0.0, 1.0),
    "lora_dropout": (0.0, 1.0),
    "attn_logit_softcapping": (0.0, 1_000_000.0),
    "final_logit_softcapping": (0.0, 1_000_000.0),
}

_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "multi_query")


def _present(config: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    return next((k for k in keys if config.get(k) is not None), keys[0])


def check_values(config: Mapping[str, Any]) -> None:
    """Every top-level number is finite and in range; named by key, with the range."""
    for key, value in config.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        name = str(key)[:60]
        if isinstance(value, int) and abs(value) >= MAX_CONFIG_INTEGER:
            raise ConfigError(name, "must be below 10^18, got a number of 19 or more digits")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(name, f"must be a finite number, got {value}")
        if key in FLOAT_RANGES:
            low, high = FLOAT_RANGES[key]
            if not low <= value <= high:
                raise ConfigError(name, f"must be between {low:g} and {high:g}, got {value:.6g}")


def check_shape(config: Mapping[str, Any], spec: ModelSpec) -> None:
    """Every stack has heads at least one unit wide and KV heads that divide the heads."""
    for stack in spec.stacks:
        if stack.head_dim < 1:
            key = _present(config, _HEAD_KEYS)
            raise ConfigError(
                key, f"must be at most the hidden size ({spec.hidden_size:,}): "
                f"{stack.n_heads:,} heads leave each head {stack.head_dim} units wide")
        if stack.n_kv_heads < 1 or stack.n_heads % stack.n_kv_heads:
            key = _present(config, _KV_KEYS)
            raise ConfigError(
                key, f"must divide num_attention_heads ({stack.n_heads:,}); got "
                f"{stack.n_kv_heads:,} key/value heads")


def checked_model(config: Mapping[str, Any], build: Callable[[], ModelSpec]) -> ModelSpec:
    """`build()`'s model, with the config's values checked before and its shape after."""
    if isinstance(config, Mapping):
        check_values(config)
    spec = build()
    check_shape(config, spec)
    return spec


def config_name(config: Mapping[str, Any], default: str) -> str:
    """The name a config gives itself (`_name_or_path`): printable, at most 80 characters."""
    raw = config.get("_name_or_path")
    if not isinstance(raw, str):
        return default
    # Printable, and no angle brackets: chart labels (plotly) render a subset of HTML.
    text = "".join(ch for ch in raw if ch.isprintable() and ch not in "<>").strip()
    return text[-80:] if text else default
