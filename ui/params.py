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

from pydantic import ValidationError

from ui import urlpack
from vram.setup import (
    ALL_LINEAR,
    Attention,
    Framework,
    Loss,
    Method,
    Offload,
    Optimizer,
    Precision,
    Quant,
    Sharding,
    TrainingSetup,
)

State = dict[str, Any]

#: Uploaded or linked config.json files are small; anything bigger is refused before parsing.
MAX_CONFIG_BYTES = 256 * 1024
#: Upload choice and bare parameter count, next to the catalog slugs in the model list.
UPLOAD = "upload"
BY_SIZE = "params"

BATCH_MAX = 128
SEQ_OPTIONS: tuple[int, ...] = tuple(2**k for k in range(7, 18))  # 128 .. 131,072
RANK_OPTIONS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GPU_OPTIONS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TARGET_OPTIONS: tuple[str, ...] = (
    ALL_LINEAR,
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
)
QUANT_OPTIONS: tuple[str, ...] = (Quant.NF4.value, Quant.NF4_DQ.value, Quant.INT8.value)
LOSS_OPTIONS: tuple[str, ...] = ("auto", Loss.STANDARD.value, Loss.CHUNKED.value)
COMPILE_OPTIONS: tuple[str, ...] = ("auto", "on", "off")
ACCUM_OPTIONS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
DROPOUT_OPTIONS: tuple[float, ...] = (0.0, 0.05, 0.1)
UNITS: tuple[str, ...] = ("GB", "GiB")

LABELS: dict[str, dict[str, str]] = {
    "method": {"full": "Full fine-tuning", "lora": "LoRA", "qlora": "QLoRA (4-bit base)"},
    "opt": {
        "adamw": "AdamW",
        "adamw-8bit": "AdamW 8-bit",
        "paged-adamw": "Paged AdamW",
        "paged-adamw-8bit": "Paged AdamW 8-bit",
        "sgd": "SGD",
        "sgd-momentum": "SGD + momentum",
        "adafactor": "Adafactor",
        "lion": "Lion",
        "adamw-in-backward": "AdamW fused in backward",
    },
    "prec": {
        "fp32": "fp32",
        "fp16-mixed": "fp16 mixed (AMP)",
        "bf16-mixed": "bf16 mixed (AMP)",
        "bf16-true": "pure bf16",
    },
    "quant": {"nf4": "NF4", "nf4-dq": "NF4 + double quant", "int8": "int8"},
    "attn": {"sdpa": "SDPA", "eager": "eager (keeps s×s scores)", "flash": "FlashAttention"},
    "compile": {"auto": "stack default", "on": "compiled", "off": "eager (not compiled)"},
    "loss": {
        "auto": "stack default",
        "standard": "standard (fp32 logits)",
        "chunked": "chunked / fused",
    },
    "shard": {
        "none": "none",
        "ddp": "DDP",
        "zero1": "ZeRO-1",
        "zero2": "ZeRO-2",
        "zero3": "ZeRO-3 / FSDP",
    },
    "offload": {
        "none": "none",
        "optimizer": "optimizer → CPU",
        "params+optimizer": "params + optimizer → CPU",
        "activations": "activations → CPU",
    },
    "stack": {
        "hf-trainer": "HF Trainer",
        "litgpt": "LitGPT",
        "torchtune": "torchtune",
        "peft-accelerate": "PEFT + Accelerate",
        "fsdp-qlora": "FSDP-QLoRA",
        "unsloth": "Unsloth",
        "other": "other",
    },
}

#: TrainingSetup field -> our key, so validation errors name what the person sees.
FIELD_TO_KEY: dict[str, str] = {
    "method": "method",
    "lora_rank": "rank",
    "lora_targets": "targets",
    "quant": "quant",
    "optimizer": "opt",
    "precision": "prec",
    "micro_batch": "batch",
    "seq_len": "seq",
    "grad_ckpt": "ckpt",
    "grad_accum": "accum",
    "lora_dropout": "dropout",
    "longest_batch_repeats": "repeats",
    "compile": "compile",
    "attention": "attn",
    "loss": "loss",
    "n_gpus": "gpus",
    "sharding": "shard",
    "offload": "offload",
    "framework": "stack",
}


def label(key: str, value: object) -> str:
    """The human label of a choice (``"qlora"`` -> ``"QLoRA (4-bit base)"``)."""
    return LABELS.get(key, {}).get(str(value), str(value))


# --------------------------------------------------------------------------------------------
# Parsing one parameter
# --------------------------------------------------------------------------------------------


def _choice(options: tuple[str, ...]) -> Callable[[str], Any]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            shown = ", ".join(options[:12]) + (", ..." if len(options) > 12 else "")
            raise ValueError(f"{text[:40]!r} is not one of: {shown}")
        return value

    return parse


def _number_in(options: tuple[Any, ...] | range, cast: Callable[[str], Any],
               noun: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = cast(text.strip())
        except ValueError:
            raise ValueError(f"{text[:40]!r} is not {noun}") from None
        if value not in options:
            if isinstance(options, range):
                raise ValueError(f"{value} is outside {options.start}..{options.stop - 1}")
            raise ValueError(f"{value} is not one of: {', '.join(map(str, options))}")
        return value

    return parse


def _int_in(options: tuple[int, ...] | range) -> Callable[[str], Any]:
    return _number_in(options, int, "a whole number")


def _float_in(options: tuple[float, ...]) -> Callable[[str], Any]:
    return _number_in(options, float, "a number")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text[:40]!r} is not true or false")


def _size(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a number of billions of parameters") from None
    if not math.isfinite(value) or not 0.01 <= value <= 10_000:
        raise ValueError(f"{text[:40]!r} must be between 0.01 and 10000 (billions)")
    return value


def _targets(text: str) -> list[str]:
    parts = [p.strip().lower() for p in text.replace(";", ",").split(",") if p.strip()]
    if not parts:
        raise ValueError("give at least one module, or all-linear")
    unknown = [p for p in parts if p not in TARGET_OPTIONS]
    if unknown:
        raise ValueError(f"{unknown[0][:40]!r} is not one of: {', '.join(TARGET_OPTIONS)}")
    return [ALL_LINEAR] if ALL_LINEAR in parts else [t for t in TARGET_OPTIONS if t in parts]


def _config(text: str) -> str:
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"too large ({len(text):,} characters; at most {MAX_CONFIG_BYTES:,})")
    return urlpack.unpack(text, MAX_CONFIG_BYTES)  # links carry it compressed (ui/urlpack.py)


@dataclass(frozen=True)
class Param:
    """One piece of state: its key (widget key and URL name), default and parser."""

    key: str
    default: Any
    parse: Callable[[str], Any]
    dump: Callable[[Any], str] = str
    title: str = ""


def _dump_targets(value: list[str]) -> str:
    return ",".join(value)


def _dump_bool(value: bool) -> str:
    return "1" if value else "0"


def _dump_size(value: float) -> str:
    return f"{value:g}"


def _enum_values(enum: Any) -> tuple[str, ...]:
    return tuple(member.value for member in enum)


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


def _names_in(options: tuple[str, ...]) -> Callable[[str], Any]:
    """A comma-separated subset of `options` (the GPU page's filters; empty means all)."""

    def parse(text: str) -> list[str]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        unknown = [p for p in parts if p not in options]
        if unknown:
            raise ValueError(f"{unknown[0][:40]!r} is not one of: {', '.join(options)}")
        return [o for o in options if o in parts]

    return parse


def _dump_names(value: list[str]) -> str:
    return ",".join(value)


def registry(model_slugs: tuple[str, ...], default_model: str, *,
             gpu_vendors: tuple[str, ...] = (), gpu_segments: tuple[str, ...] = ()) -> Registry:
    """The parameters; `model_slugs` are the catalog's, in the order the list shows them;
    `gpu_vendors` and `gpu_segments` are the GPU list's (the GPU page filters by them)."""
    options = (*model_slugs, UPLOAD, BY_SIZE)
    return Registry(
        params=(
            Param("model", default_model, _choice(options), title="Model"),
            Param("size", 7.0, _size, _dump_size, title="Parameters (billions)"),
            Param("config", "", _config, dump=urlpack.pack, title="Uploaded config.json"),
            Param("method", Method.QLORA.value, _choice(_enum_values(Method)), title="Method"),
            Param(
                "opt", Optimizer.ADAMW.value, _choice(_enum_values(Optimizer)), title="Optimizer"
            ),
            Param("batch", 1, _int_in(range(1, BATCH_MAX + 1)), title="Micro-batch"),
            Param("seq", 2048, _int_in(SEQ_OPTIONS), title="Sequence length"),
            Param(
                "prec",
                Precision.BF16_MIXED.value,
                _choice(_enum_values(Precision)),
                title="Precision",
            ),
            Param("rank", 16, _int_in(RANK_OPTIONS), title="LoRA rank"),
            Param("targets", [ALL_LINEAR], _targets, _dump_targets, title="LoRA targets"),
            Param("quant", Quant.NF4.value, _choice(QUANT_OPTIONS), title="Quantization"),
            Param("ckpt", True, _bool, _dump_bool, title="Gradient checkpointing"),
            Param("accum", 1, _int_in(ACCUM_OPTIONS), title="Gradient accumulation steps"),
            Param("dropout", 0.05, _float_in(DROPOUT_OPTIONS), title="LoRA dropout"),
            Param("repeats", True, _bool, _dump_bool, title="Long batches can follow each other"),
            Param("compile", "auto", _choice(COMPILE_OPTIONS), title="torch.compile"),
            Param(
                "attn",
                Attention.SDPA.value,
                _choice(_enum_values(Attention)),
                title="Attention kernel",
            ),
            Param("loss", "auto", _choice(LOSS_OPTIONS), title="Loss"),
            Param("gpus", 1, _int_in(GPU_OPTIONS), title="GPUs"),
            Param("shard", Sharding.NONE.value, _choice(_enum_values(Sharding)), title="Sharding"),
            Param("offload", Offload.NONE.value, _choice(_enum_values(Offload)), title="Offload"),
            Param(
                "stack",
                Framework.HF_TRAINER.value,
                _choice(_enum_values(Framework)),
                title="Training stack",
            ),
            Param("vendor", [], _names_in(gpu_vendors), _dump_names, title="GPU vendors"),
            Param("segment", [], _names_in(gpu_segments), _dump_names, title="GPU segments"),
            Param("fits", False, _bool, _dump_bool, title="Only GPUs that hold this run"),
            Param("math", False, _bool, _dump_bool, title="Show the math"),
            Param("unit", "GB", _choice(("gb", "gib")), title="Units"),
        ),
        model_options=options,
    )


def parse_query(reg: Registry, query: Mapping[str, str]) -> tuple[State, list[str]]:
    """Values from URL parameters, and one message per parameter that was ignored."""
    values: State = {}
    errors: list[str] = []
    for key, text in query.items():
        if key == "pin":
            continue  # pinned setups are read by `parse_pins`
        if key not in reg.keys:
            errors.append(f"URL parameter `{key[:40]}` is unknown and was ignored.")
            continue
        param = reg[key]
        try:
            value = param.parse(text)
        except ValueError as exc:
            errors.append(
                f"URL parameter `{key}` ({param.title}): {exc}. "
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
    query.pop("unit", None)
    return json.dumps(query, separators=(",", ":"), sort_keys=True)


def parse_pins(reg: Registry, texts: list[str], limit: int) -> tuple[list[State], list[str]]:
    """Pinned setups from their URL form; each bad one is skipped with a message."""
    pins: list[State] = []
    errors: list[str] = []
    for n, text in enumerate(texts[:limit], start=1):
        try:
            raw = json.loads(text) if len(text) <= MAX_CONFIG_BYTES else None
        except json.JSONDecodeError:
            raw = None
        if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
            errors.append(f"URL parameter `pin` #{n}: not a pinned setup; it was ignored.")
            continue
        values, bad = parse_query(reg, raw)
        if bad:
            errors.append(f"URL parameter `pin` #{n}: " + " ".join(bad))
            continue
        pins.append({**reg.defaults(), **values})
    if len(texts) > limit:
        errors.append(f"URL parameter `pin`: at most {limit} setups; the rest were ignored.")
    return pins, errors


# --------------------------------------------------------------------------------------------
# State -> vram inputs
# --------------------------------------------------------------------------------------------


def setup_kwargs(state: Mapping[str, Any]) -> dict[str, Any]:
    """TrainingSetup arguments from a state dict (values the setup ignores are left out)."""
    method = state["method"]
    targets = list(state["targets"]) or [ALL_LINEAR]
    return {
        "method": method,
        "lora_rank": int(state["rank"]),
        "lora_targets": ALL_LINEAR if ALL_LINEAR in targets else tuple(targets),
        "quant": state["quant"] if method == Method.QLORA.value else None,
        "optimizer": state["opt"],
        "precision": state["prec"],
        "micro_batch": int(state["batch"]),
        "seq_len": int(state["seq"]),
        "grad_ckpt": bool(state["ckpt"]),
        "grad_accum": int(state["accum"]),
        "lora_dropout": float(state["dropout"]),
        "longest_batch_repeats": bool(state["repeats"]),
        "compile": {"auto": None, "on": True, "off": False}[state["compile"]],
        "attention": state["attn"],
        "loss": None if state["loss"] == "auto" else state["loss"],
        "n_gpus": int(state["gpus"]),
        "sharding": state["shard"],
        "offload": state["offload"],
        "framework": state["stack"],
    }


def validation_messages(exc: ValidationError) -> list[str]:
    """One line per problem, naming the control (``Sharding (shard): ...``)."""
    titles = {p.key: p.title for p in registry((), "").params}
    lines: list[str] = []
    for error in exc.errors():
        message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
        loc = error.get("loc") or ()
        field_name = str(loc[0]) if loc else message.split(":", 1)[0].strip()
        key = FIELD_TO_KEY.get(field_name, field_name)
        if key in titles:
            message = message.removeprefix(f"{field_name}: ")
            lines.append(f"{titles[key]} (`{key}`): {message}")
        else:
            lines.append(message)
    return lines


def build_setup(state: Mapping[str, Any]) -> tuple[TrainingSetup | None, list[str]]:
    """A validated setup, or None and the messages that say what to change."""
    try:
        return TrainingSetup(**setup_kwargs(state)), []
    except ValidationError as exc:
        return None, validation_messages(exc)


def sharding_for(gpus: int, shard: str) -> str:
    """The sharding to switch to when the GPU count changes and the current one stops making sense.

    One GPU allows none or zero3 (FSDP on one card, for offload); several need a strategy.
    """
    if gpus == 1 and shard in ("ddp", "zero1", "zero2"):
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
