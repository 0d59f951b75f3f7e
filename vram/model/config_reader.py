"""Reading a Hugging Face `config.json` safely: size-capped text, typed access by key.

Every problem raises a `ConfigError` that names the key and the allowed range.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vram.errors import ConfigError

#: Largest config.json accepted: real ones are a few KB; anything bigger is not a config.
MAX_CONFIG_BYTES = 1_000_000

_LIMITS: dict[str, int] = {
    "vocab_size": 10_000_000,
    "hidden_size": 1_000_000,
    "intermediate_size": 4_000_000,
    "num_hidden_layers": 10_000,
    "num_attention_heads": 100_000,
    "num_key_value_heads": 100_000,
    "head_dim": 100_000,
    "max_position_embeddings": 100_000_000,
    "num_local_experts": 100_000,
    "num_experts_per_tok": 100_000,
}



class ConfigReader:
    """Typed access to a config dict; every problem names the key."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def int(self, key: str, *alternatives: str, default: int | None = None) -> int:
        for name in (key, *alternatives):
            value = self.config.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    raise ConfigError(name, f"must be a whole number, got {value!r:.40}")
            limit = _LIMITS.get(name, 100_000_000)
            if not 1 <= value <= limit:
                raise ConfigError(name, f"must be between 1 and {limit:,}, got {value:,}")
            return value
        if default is not None:
            return default
        raise ConfigError(key, "missing: this architecture needs it")

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false, got {value!r:.40}")
        return value

    def float(self, key: str, default: float) -> float:
        value = self.config.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value
        ):
            raise ConfigError(key, f"must be a number, got {value!r:.40}")
        return float(value)

    def str(self, key: str, default: str) -> str:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(key, f"must be text, got {value!r:.40}")
        return value



#: Keys whose values may hold JSON's non-standard Infinity: transformers writes the Mamba-2
#: configs' default `time_step_limit = (0.0, float("inf"))` as `[0.0, Infinity]`
#: (transformers/models/nemotron_h/configuration_nemotron_h.py@v5.24.0, Falcon-H1 and
#: GraniteMoeHybrid alike); no memory figure reads it.
NON_FINITE_KEYS = frozenset({"time_step_limit"})


@dataclass(frozen=True)
class _NonFinite:
    """JSON's NaN, Infinity or -Infinity as read, kept apart until its key is known
    (`_check_non_finite`)."""

    name: str


def _check_non_finite(value: object, key: str = "") -> object:
    """`value` with every non-standard constant refused by its key, unless the key may hold
    one (`NON_FINITE_KEYS`, then Infinity stays a float and NaN is still refused)."""
    if isinstance(value, dict):
        return {k: _check_non_finite(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_check_non_finite(v, key) for v in value]
    if isinstance(value, _NonFinite):
        if key in NON_FINITE_KEYS and value.name != "NaN":
            return float(value.name.replace("Infinity", "inf"))
        raise ConfigError(key or "config.json", f"{value.name} is not a valid number")
    return value


def read_config_text(text: str | bytes) -> dict[str, Any]:
    """Parse config.json text safely: size-capped, JSON only, no NaN, and Infinity only where
    transformers writes it (`NON_FINITE_KEYS`)."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            "config.json", f"too large ({len(text):,} bytes; a config is at most "
            f"{MAX_CONFIG_BYTES:,} bytes)"
        )
    try:
        data = _check_non_finite(json.loads(text, parse_constant=_NonFinite))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ConfigError("config.json", f"not valid JSON ({str(exc)[:80]})") from None
    except ConfigError:
        raise
    except ValueError:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits)
        raise ConfigError("config.json", "a number is too long (no config value has more "
                          "than 4,300 digits)") from None
    if not isinstance(data, dict):
        raise ConfigError("config.json", "must be a JSON object")
    return data

