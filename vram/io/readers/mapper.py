"""The bookkeeping every reader shares: typed access to keys, and the mapping report.

A reader asks for keys (`get`, `int_key`, `bool_key`, ...), states what each one sets (`set`),
records settings that are read but not part of the setup (`record`), names the tool default
for what the file leaves out (`default`), and `finish` turns that into a `ReadResult`.
Keys the reader never asked for are reported as ignored, with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from vram.errors import TrainingConfigError
from vram.io.readers.report import (
    AppliedDefault,
    Format,
    IgnoredKey,
    MappedKey,
    MappingReport,
    NotModelled,
    ReadResult,
)
from vram.io.readers.vocab import map_targets
from vram.setup import TrainingSetup

#: Values a field may take in the readers' vocabulary that the current TrainingSetup may not
#: accept yet, and the nearest value it does accept (the report says when one was used).
FALLBACKS: dict[tuple[str, str], tuple[str, str]] = {
    ("loss", "fused-linear"): (
        "chunked", "fused linear+cross-entropy never holds the full logits; modelled as chunked"),
}

#: A base that every setup field can be checked against one at a time.
_PROBE_BASE: dict[str, Any] = {"method": "full", "optimizer": "adamw"}

_MAX_SHOWN = 60


def shown(value: object) -> str:
    """A short, printable form of a file value."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def accepts(field: str, value: object) -> bool:
    """Whether the current TrainingSetup has `field` and takes `value` for it."""
    if field not in TrainingSetup.model_fields:
        return False
    probe = dict(_PROBE_BASE)
    if field == "quant":
        probe["method"] = "qlora"
    probe[field] = value
    try:
        TrainingSetup.model_validate(probe)
    except ValidationError as exc:
        return not any(err["loc"] and err["loc"][0] == field for err in exc.errors())
    return True


_MULTI_GPU_SHARDING = ("ddp", "zero1", "zero2")


def split_fields(fields: Mapping[str, Any]) -> tuple[dict[str, Any], list[NotModelled], list[str]]:
    """The fields and values the current TrainingSetup takes, what waits, and notes.

    A value it does not take falls back to the nearest it does (`FALLBACKS`), or waits in the
    report. Data-parallel sharding read from a file needs a GPU count the file cannot give: on
    one GPU it waits for `gpus`.
    """
    accepted: dict[str, Any] = {}
    waiting: list[NotModelled] = []
    notes: list[str] = []
    for field, value in fields.items():
        if accepts(field, value):
            accepted[field] = value
            continue
        fallback = FALLBACKS.get((field, str(value)))
        if fallback is not None and accepts(field, fallback[0]):
            accepted[field] = fallback[0]
            waiting.append(NotModelled(field=field, value=shown(value),
                                       note=f"used {fallback[0]}: {fallback[1]}"))
            continue
        why = ("no such setup field yet" if field not in TrainingSetup.model_fields
               else "the setup does not take this value yet")
        waiting.append(NotModelled(field=field, value=shown(value), note=why))
    if "optimizer" in fields and "optimizer" not in accepted:
        accepted["optimizer"] = "adamw"
        notes.append(f"optimizer {fields['optimizer']} is not modelled yet; estimated as adamw "
                     "(two fp32 moments), which may be more than it holds")
    if accepted.get("n_gpus", 1) > 1 and accepted.get("sharding", "none") == "none":
        accepted["sharding"] = "ddp"
        notes.append("several GPUs and no sharding in the file: data parallel (DDP), what "
                     "accelerate/torchrun launch by default")
    if accepted.get("sharding") in _MULTI_GPU_SHARDING and accepted.get("n_gpus", 1) == 1:
        sharding = accepted.pop("sharding")
        waiting.append(NotModelled(field="sharding", value=sharding,
                                   note="needs more than one GPU: give the GPU count (--gpus N)"))
        if accepted.get("offload") == "optimizer":
            waiting.append(NotModelled(field="offload", value=accepted.pop("offload"),
                                       note="needs the sharding above"))
    return accepted, waiting, notes


def setup_from_fields(fields: Mapping[str, Any],
                      overrides: Mapping[str, Any] | None = None) -> TrainingSetup:
    """A TrainingSetup from a reader's fields, with `overrides` (flags, the GPU count) on top.
    Raises pydantic's ValidationError naming the setup field."""
    merged = {**fields, **(overrides or {})}
    accepted, _, _ = split_fields(merged)
    return TrainingSetup.model_validate(accepted)


class Mapper:
    """Collects what a reader maps; one per file."""

    def __init__(self, fmt: Format, tool_version: str, data: Mapping[str, Any],
                 irrelevant: frozenset[str] = frozenset()) -> None:
        self.format = fmt
        self.tool_version = tool_version
        self.data = data
        self._irrelevant = irrelevant
        self._seen: set[str] = set()
        self.fields: dict[str, Any] = {}
        self._key_for_field: dict[str, str] = {}
        self._mapped: list[MappedKey] = []
        self._ignored: list[IgnoredKey] = []
        self._defaults: list[AppliedDefault] = []
        self._notes: list[str] = []

    # ---- reading -------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """A top-level value (None counts as absent: YAML `key:` with nothing after it)."""
        self._seen.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def seen(self, *keys: str) -> None:
        self._seen.update(keys)

    def int_key(self, key: str, value: Any = None, *, low: int = 1,
                high: int = 10_000_000) -> int | None:
        value = self.get(key) if value is None else value
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                value = int(value)
            else:
                raise TrainingConfigError(key, f"must be a whole number, got {shown(value)}")
        number = int(value)
        if not low <= number <= high:
            raise TrainingConfigError(key, f"must be between {low} and {high:,}, got "
                                      f"{shown(number)}")
        return number

    def bool_key(self, key: str, value: Any = None) -> bool | None:
        value = self.get(key) if value is None else value
        if value is None:
            return None
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise TrainingConfigError(key, f"must be true or false, got {shown(value)}")

    def str_key(self, key: str, value: Any = None) -> str | None:
        value = self.get(key) if value is None else value
        if value is None:
            return None
        if not isinstance(value, str):
            raise TrainingConfigError(key, f"must be text, got {shown(value)}")
        return value.strip()

    def float_key(self, key: str, value: Any = None, *, low: float = 0.0,
                  high: float = 1.0) -> float | None:
        value = self.get(key) if value is None else value
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TrainingConfigError(key, f"must be a number, got {shown(value)}")
        if not math.isfinite(value) or not low <= value <= high:
            raise TrainingConfigError(key, f"must be between {low} and {high}, got {value}")
        return float(value)

    # ---- recording -----------------------------------------------------------------------

    def set(self, field: str, value: Any, key: str, raw: Any = None, why: str = "") -> None:
        """`key` (whose file value is `raw`) sets `field` to `value`."""
        self.fields[field] = value
        self._key_for_field[field] = key
        sets = f"{field}={shown(value)}" + (f" ({why})" if why else "")
        self._mapped.append(MappedKey(key=key, value=shown(raw if raw is not None else value),
                                      sets=sets))

    def record(self, key: str, raw: Any, what: str) -> None:
        """A key that is read and reported but sets no setup field (RL settings, ...)."""
        self._seen.add(key)
        self._mapped.append(MappedKey(key=key, value=shown(raw), sets=what))

    def int_or_default(self, field: str, key: str, default: int, source: str, *,
                       high: int = 10_000_000) -> None:
        """`key` as a whole number into `field`, or the tool's `default` (from `source`) when
        the file leaves the key out."""
        if self.has(key):
            self.set(field, self.int_key(key, high=high), key)
        else:
            self.default(field, default, source)

    def default(self, field: str, value: Any, source: str) -> None:
        """The tool's own default for a field the file leaves out."""
        if field in self.fields:
            return
        self.fields[field] = value
        self._defaults.append(AppliedDefault(field=field, value=shown(value), source=source))

    def redefault(self, field: str, value: Any, source: str) -> None:
        """Replace a default applied earlier, when a later key changes what the tool does."""
        if field in self._key_for_field:
            return  # the file set it
        self._defaults = [d for d in self._defaults if d.field != field]
        self.fields.pop(field, None)
        self.default(field, value, source)

    def ignore(self, key: str, reason: str) -> None:
        self._seen.add(key)
        self._ignored.append(IgnoredKey(key=key, reason=reason))

    def note(self, text: str) -> None:
        self._notes.append(text)

    def lora_targets(self, key: str, names: Any, raw: Any = None, source: str = "") -> None:
        """LoRA target modules named under `key` (`raw`: as the file writes them; `source`:
        the keys to credit, `key` by default) in the setup's names; names with no counterpart
        are noted, and none known is an error naming `key`."""
        raw = names if raw is None else raw
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TrainingConfigError(key, "must be a list of module names")
        known, unknown = map_targets(names)
        if not known:
            raise TrainingConfigError(key, f"none of {shown(raw)} is a module vram knows")
        self.set("lora_targets", known, source or key, raw)
        if unknown:
            self.note(f"{key} {unknown} not modelled (no Llama-style counterpart)")

    # ---- result --------------------------------------------------------------------------

    def _report_unread_keys(self) -> None:
        for key in self.data:
            if key in self._seen:
                continue
            if self.data[key] is None:
                continue  # `key:` with no value changes nothing
            if key in self._irrelevant:
                reason = "does not change training memory (data, logging, schedule, saving)"
            else:
                reason = f"not a key vram reads for {self.format}; check its spelling"
            self._ignored.append(IgnoredKey(key=key, reason=reason))

    def finish(self, model_ref: str | None, model_slug: str | None) -> ReadResult:
        self._report_unread_keys()
        setup_fields, waiting, notes = split_fields(self.fields)
        self._notes.extend(notes)
        try:
            TrainingSetup.model_validate(setup_fields)
        except ValidationError as exc:
            raise self._setup_error(exc) from None
        report = MappingReport(
            format=self.format, tool_version=self.tool_version, mapped=tuple(self._mapped),
            ignored=tuple(self._ignored), defaults=tuple(self._defaults),
            not_modelled=tuple(waiting), notes=tuple(self._notes),
        )
        return ReadResult(format=self.format, model_ref=model_ref, model_slug=model_slug,
                          fields=dict(self.fields), setup_fields=setup_fields, report=report)

    def _setup_error(self, exc: ValidationError) -> TrainingConfigError:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        if not field and ": " in message:
            field, message = message.split(": ", 1)
        key = self._key_for_field.get(field, f"(default {field})" if field else "file")
        return TrainingConfigError(key, message)
