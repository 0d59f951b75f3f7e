"""The app's state as a flat dict of short keys: widget keys, URL query parameters, pins.

One key names one thing everywhere: ``batch`` is the slider's Streamlit key, the URL parameter
(``?batch=4``) and the field of a pinned setup. This module has no Streamlit import: it parses
and checks values (each error names the parameter), and turns a state dict into the `vram`
inputs (`ModelSpec`, `TrainingSetup`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ui import urlpack
from vram.io.knobs import (
    AUTO,
    MAX_NUMBER_CHARS,
    KnobError,
    SetupKnob,
    setup_knobs,
)
from vram.io.knobs import build_setup as build_knob_setup
from vram.setup import ALL_LINEAR, LORA_TARGETS, Sharding, TrainingSetup
from vram.step.what_if import CompressError, parse_ratios, ratios_text

State = dict[str, Any]

#: Uploaded or linked config.json files are small; anything bigger is refused before parsing.
MAX_CONFIG_BYTES = 256 * 1024
#: Upload choice and bare parameter count, next to the catalog slugs in the model list.
UPLOAD = "upload"
BY_SIZE = "params"
UNITS: tuple[str, ...] = ("GB", "GiB")

#: The setup's knobs by their app key (``batch``, ``opt``, ...), declared on `TrainingSetup`.
KNOBS: dict[str, SetupKnob] = {knob.key: knob for knob in setup_knobs()}


# --------------------------------------------------------------------------------------------
# A knob in the app: its value in the widget, its options and their labels
# --------------------------------------------------------------------------------------------


def app_value(knob: SetupKnob, value: object) -> Any:
    """A field's value as the widget holds it: ``"auto"`` for None, a list of LoRA targets,
    the opposite for inverse knobs, enum members as their text."""
    value = knob.outer(value)
    if value is None:
        return AUTO
    if knob.kind == "targets":
        return [ALL_LINEAR] if value == ALL_LINEAR else list(value)  # type: ignore[call-overload]
    return getattr(value, "value", value)


def field_value(knob: SetupKnob, value: Any) -> object:
    """The widget's value as the setup field takes it (`app_value` undone)."""
    if value == AUTO and knob.optional:
        return None
    if knob.kind == "targets":
        targets = list(value) or [ALL_LINEAR]
        return ALL_LINEAR if ALL_LINEAR in targets else tuple(targets)
    return knob.outer(value)


def options(key: str) -> tuple[Any, ...]:
    """The values a knob's control offers, in the order it shows them."""
    knob = KNOBS[key]
    auto: tuple[Any, ...] = (AUTO,) if knob.optional else ()
    if knob.meta.app_options:
        return (*auto, *knob.meta.app_options)
    if knob.kind == "bool":
        return (*auto, True, False)
    if knob.kind == "targets":
        return (ALL_LINEAR, *LORA_TARGETS)
    return (*auto, *knob.choices)


def label(key: str, value: object) -> str:
    """The human label of a choice (``"qlora"`` -> ``"QLoRA (4-bit base)"``)."""
    knob = KNOBS.get(key)
    if knob is None:
        return str(value)
    text = "true" if value is True else "false" if value is False else str(value)
    if text == AUTO and AUTO not in knob.labels:
        return "default"
    return knob.labels.get(text, text)


def title(key: str) -> str:
    return KNOBS[key].label


def applies(key: str, method: object) -> bool:
    """Whether a knob means something for a method (LoRA knobs, quantization)."""
    only = KNOBS[key].meta.only_for
    return not only or method in only


# --------------------------------------------------------------------------------------------
# Parsing one parameter
# --------------------------------------------------------------------------------------------


def _choice(choices: tuple[str, ...]) -> Callable[[str], Any]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
            raise ValueError(f"{text[:40]!r} is not one of: {shown}")
        return value

    return parse


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text[:40]!r} is not true or false")


def _size(text: str) -> float:
    try:
        if len(text) > MAX_NUMBER_CHARS:
            raise ValueError(text)
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a number of billions of parameters") from None
    if not math.isfinite(value) or not 0.01 <= value <= 10_000:
        raise ValueError(f"{text[:40]!r} must be between 0.01 and 10000 (billions)")
    return value


def _config(text: str) -> str:
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"too large ({len(text):,} characters; at most {MAX_CONFIG_BYTES:,})")
    return urlpack.unpack(text, MAX_CONFIG_BYTES)  # links carry it compressed (ui/urlpack.py)


def _knob_parser(knob: SetupKnob) -> Callable[[str], Any]:
    """The knob's own text parser, then the app's narrower choice of values."""
    offered = options(knob.key)

    numbers = [v for v in offered if isinstance(v, int) and not isinstance(v, bool)]
    contiguous = len(numbers) > 12 and numbers == list(range(numbers[0], numbers[-1] + 1))

    def outside(shown: str) -> ValueError:
        # One range per key, the control's: the library's wider one ("1 to 4,096") is the
        # CLI's, and naming both for one key read as a contradiction.
        if contiguous:
            return ValueError(f"{shown} is outside {numbers[0]:,} to {numbers[-1]:,}")
        return ValueError(f"{shown} is not one of: {', '.join(map(_option_text, offered))}")

    def parse(text: str) -> Any:
        try:
            value = app_value(knob, knob.parse(text))
        except ValueError:
            if numbers and _is_number(text):
                raise outside(text.strip()[:40]) from None
            raise
        if knob.kind == "targets" or value in offered:
            return value
        raise outside(_option_text(value))

    return parse


def _is_number(text: str) -> bool:
    try:
        return len(text) <= MAX_NUMBER_CHARS and math.isfinite(float(text.strip()))
    except ValueError:
        return False


def _option_text(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _knob_dumper(knob: SetupKnob) -> Callable[[Any], str]:
    def dump(value: Any) -> str:
        return knob.text(field_value(knob, value))

    return dump


@dataclass(frozen=True)
class Param:
    """One piece of state: its key (widget key and URL name), default and parser."""

    key: str
    default: Any
    parse: Callable[[str], Any]
    dump: Callable[[Any], str] = str
    title: str = ""


def _knob_param(knob: SetupKnob) -> Param:
    """A setup knob as app state; its default is the library's."""
    return Param(knob.key, app_value(knob, knob.default), _knob_parser(knob), _knob_dumper(knob),
                 title=knob.label)


def _dump_bool(value: bool) -> str:
    return "1" if value else "0"


def _dump_size(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Registry:
    """All parameters, given the model choices of the catalog in use."""

    params: tuple[Param, ...]
    model_options: tuple[str, ...] = field(default=())

    def __getitem__(self, key: str) -> Param:
        for param in self.params:
            if param.key == key:
                return param
        raise KeyError(key)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.params)

    def defaults(self) -> State:
        return {p.key: _copy(p.default) for p in self.params}


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def _names_in(choices: tuple[str, ...]) -> Callable[[str], Any]:
    """A comma-separated subset of `choices` (the GPU page's filters; empty means all)."""

    def parse(text: str) -> list[str]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        unknown = [p for p in parts if p not in choices]
        if unknown:
            raise ValueError(f"{unknown[0][:40]!r} is not one of: {', '.join(choices)}")
        return [o for o in choices if o in parts]

    return parse


def _dump_names(value: list[str]) -> str:
    return ",".join(value)


def _compress(text: str) -> str:
    """The what-if's buckets, as the CLI's --compress takes them: "optimizer=4,activations=2"
    (the bucket's values stored that many times smaller)."""
    try:
        return ratios_text(parse_ratios([t for t in text.split(",") if t.strip()]))
    except CompressError as exc:
        raise ValueError(str(exc)) from None


#: The what-if panel's keys: open or not, the buckets compressed, the GPU it is measured on.
WHAT_IF_KEYS = ("whatif", "compress", "wgpu")


def registry(model_slugs: tuple[str, ...], default_model: str, *,
             gpu_vendors: tuple[str, ...] = (), gpu_segments: tuple[str, ...] = (),
             gpu_ids: tuple[str, ...] = (), lesson_gpu: str = "") -> Registry:
    """The parameters: the model, every setup knob (from its declaration on `TrainingSetup`),
    then the view's own; `model_slugs` are the catalog's, in the order the list shows them;
    `gpu_vendors` and `gpu_segments` are the GPU list's (the GPU page filters by them), and
    `gpu_ids` its GPUs (the what-if measures on one, the lesson's by default)."""
    model_options = (*model_slugs, UPLOAD, BY_SIZE)
    default_gpu = lesson_gpu if lesson_gpu in gpu_ids else (gpu_ids[0] if gpu_ids else "")
    return Registry(
        params=(
            Param("model", default_model, _choice(model_options), title="Model"),
            Param("size", 7.0, _size, _dump_size, title="Parameters (billions)"),
            Param("config", "", _config, dump=urlpack.pack, title="Uploaded config.json"),
            *(_knob_param(knob) for knob in setup_knobs()),
            Param("vendor", [], _names_in(gpu_vendors), _dump_names, title="GPU vendors"),
            Param("segment", [], _names_in(gpu_segments), _dump_names, title="GPU segments"),
            Param("fits", False, _bool, _dump_bool, title="Only GPUs that hold this run"),
            Param("math", False, _bool, _dump_bool, title="Show the math"),
            Param("unit", "GB", _choice(("gb", "gib")), title="Units"),
            Param("present", False, _bool, _dump_bool, title="Presentation mode"),
            Param("whatif", False, _bool, _dump_bool, title="What if a bucket were compressed"),
            Param("compress", "", _compress, title="Buckets compressed (BUCKET=RATIO)"),
            Param("wgpu", default_gpu, _choice(gpu_ids) if gpu_ids else str,
                  title="The what-if's GPU"),
        ),
        model_options=model_options,
    )


def parse_query(reg: Registry, query: Mapping[str, str]) -> tuple[State, list[str]]:
    """Values from URL parameters, and one message per parameter that was ignored."""
    values: State = {}
    errors: list[str] = []
    for key, text in query.items():
        if key == "pin":
            continue  # pinned setups are read by `parse_pins`
        if key not in reg.keys:
            errors.append(f"URL parameter {key[:40]} is unknown and was ignored.")
            continue
        param = reg[key]
        try:
            value = param.parse(text)
        except ValueError as exc:
            errors.append(
                f"URL parameter {key} ({param.title}): {exc}. "
                f"Using the default, {param.dump(param.default) or 'none'}."
            )
            continue
        if key == "unit":
            value = "GiB" if value == "gib" else "GB"
        values[key] = value
    return values, errors


def to_query(reg: Registry, state: Mapping[str, Any]) -> dict[str, str]:
    """The URL parameters of a state: only the values that differ from the defaults."""
    out: dict[str, str] = {}
    for param in reg.params:
        value = state.get(param.key, param.default)
        if value == param.default or (param.key == "targets" and not value):
            continue
        if param.key == "size" and state.get("model") != BY_SIZE:
            continue
        if param.key == "config" and state.get("model") != UPLOAD:
            continue
        out[param.key] = param.dump(value)
    return out


def dump_pin(reg: Registry, state: Mapping[str, Any]) -> str:
    """A pinned setup as compact JSON of the non-default values (unit excluded)."""
    query = to_query(reg, state)
    for key in ("unit", "present", *WHAT_IF_KEYS):  # how it is shown, not the setup
        query.pop(key, None)
    return json.dumps(query, separators=(",", ":"), sort_keys=True)


def parse_pins(reg: Registry, texts: list[str], limit: int) -> tuple[list[State], list[str]]:
    """Pinned setups from their URL form; each bad one is skipped with a message."""
    pins: list[State] = []
    errors: list[str] = []
    for n, text in enumerate(texts[:limit], start=1):
        try:
            raw = json.loads(text) if len(text) <= MAX_CONFIG_BYTES else None
        except (ValueError, RecursionError):  # bad JSON, or an integer over 4,300 digits
            raw = None
        if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
            errors.append(f"URL parameter pin #{n}: not a pinned setup; it was ignored.")
            continue
        values, bad = parse_query(reg, raw)
        if bad:
            errors.append(f"URL parameter pin #{n}: " + " ".join(bad))
            continue
        pins.append({**reg.defaults(), **values})
    if len(texts) > limit:
        errors.append(f"URL parameter pin: at most {limit} setups; the rest were ignored.")
    return pins, errors


# --------------------------------------------------------------------------------------------
# State -> vram inputs
# --------------------------------------------------------------------------------------------


def setup_kwargs(state: Mapping[str, Any]) -> dict[str, object]:
    """TrainingSetup arguments from a state dict. A knob that means nothing for the method
    (LoRA's with full fine-tuning, quantization without QLoRA) keeps the library default."""
    return {knob.name: field_value(knob, state[key]) for key, knob in KNOBS.items()
            if key in state and applies(key, state.get("method"))}


def control_name(knob: SetupKnob) -> str:
    """How an error names a control: its title and key, "Sharding (shard)" (messages are
    shown as plain text, where backticks would stand as they are)."""
    return f"{knob.label} ({knob.key})"


def build_setup(state: Mapping[str, Any]) -> tuple[TrainingSetup | None, list[str]]:
    """A validated setup, or None and the messages that say what to change."""
    try:
        return build_knob_setup(setup_kwargs(state), control_name), []
    except KnobError as exc:
        return None, str(exc).splitlines()


def sharding_for(gpus: int, shard: str) -> str:
    """The sharding to switch to when the GPU count changes and the current one stops making sense.

    One GPU allows none or zero3 (FSDP on one card, for offload); several need a strategy.
    """
    if gpus == 1 and shard not in (Sharding.NONE, Sharding.ZERO3):
        return Sharding.NONE.value
    if gpus > 1 and shard == Sharding.NONE.value:
        return Sharding.DDP.value
    return shard


def pin_label(state: Mapping[str, Any], model_name: str) -> str:
    """A short name for a pinned setup: model, method, batch × sequence."""
    method = {"full": "full", "lora": "LoRA", "qlora": "QLoRA"}[state["method"]]
    seq = int(state["seq"])
    seq_text = f"{seq // 1024}k" if seq >= 1024 else str(seq)
    extra = " ckpt" if state.get("ckpt") else ""
    gpus = f" ×{state['gpus']}" if int(state["gpus"]) > 1 else ""
    return f"{model_name} · {method} · b{state['batch']}×{seq_text}{extra}{gpus}"
