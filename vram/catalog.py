"""The model catalog (`data/models/`) and the one way to turn user input into a `ModelSpec`.

`load_model` takes a catalog slug, a path to a config.json, a config dict, or a bare parameter
count ("7e9", "70B") and always returns a `ModelSpec` or raises a `VramError` naming the field.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from vram.architecture import (
    MAX_CONFIG_BYTES,
    ModelSpec,
    config_for_param_count,
    model_from_config,
    model_from_config_file,
    model_from_param_count,
    read_config_text,
)
from vram.config_checks import config_name
from vram.errors import CatalogError, ConfigError, FileReadError
from vram.files import read_limited
from vram.paths import data_dir

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmbt]|e\d+)?\s*$", re.IGNORECASE)
_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


class CatalogEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slug: str
    hf_repo: str
    display_name: str
    family: str
    params: int
    params_source: str
    teaching_size: str | None = None


@cache
def model_catalog() -> tuple[CatalogEntry, ...]:
    """Every catalog model, in file order; validated row by row."""
    path = data_dir() / "models" / "catalog.csv"
    entries: list[CatalogEntry] = []
    with path.open(newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                entries.append(CatalogEntry(
                    slug=row["slug"], hf_repo=row["hf_repo"], display_name=row["display_name"],
                    family=row["family"], params=int(row["params"]),
                    params_source=row["params_source"],
                    teaching_size=row["teaching_size"] or None,
                ))
            except (KeyError, ValueError) as exc:
                raise CatalogError(f"{path.name} line {line}: {exc}") from None
    return tuple(entries)


def catalog_entry(slug: str) -> CatalogEntry | None:
    return next((e for e in model_catalog() if e.slug == slug), None)


def teaching_models() -> dict[str, CatalogEntry]:
    """The four classroom sizes (1B, 8B, 13B, 70B), mapped to real models."""
    return {e.teaching_size: e for e in model_catalog() if e.teaching_size}


@cache
def _catalog_model(slug: str) -> ModelSpec:
    entry = catalog_entry(slug)
    name = entry.display_name if entry else slug
    return model_from_config_file(data_dir() / "models" / f"{slug}.json", name)


#: Largest exponent a size may carry ("7e9"); anything past 1e30 is not a model size, and a
#: huge exponent would make the integer arithmetic itself run for minutes.
_MAX_SIZE_EXPONENT = 30


def parse_param_count(text: str) -> int | None:
    """'7e9', '7B', '1.5b', '70000000000' -> an integer, or None if it is not a size.

    Sizes beyond 1e30 raise ConfigError (the range check in `config_for_param_count` then
    names the real bounds for anything smaller)."""
    match = _SIZE.match(text)
    if not match:
        return None
    number, suffix = match.group(1), (match.group(2) or "").lower()
    if suffix.startswith("e"):
        # Bound the exponent before any arithmetic: 10 ** 99999999 alone runs for minutes.
        exponent = int(suffix[1:]) if len(suffix) <= 4 else _MAX_SIZE_EXPONENT + 1
        scale = 10.0 ** min(exponent, _MAX_SIZE_EXPONENT + 1)
    else:
        scale = _SCALE.get(suffix, 1.0)
    value = float(number) * scale  # float() of digits is quick, and inf when it overflows
    if not value < 10.0 ** _MAX_SIZE_EXPONENT:
        raise ConfigError("model", f"{text.strip()[:40]!r} is too large a size; sizes are "
                          "between 10 million and 10 trillion parameters")
    return int(value)


def load_model(model: str | Path | Mapping[str, Any] | int) -> ModelSpec:
    """A ModelSpec from a catalog slug, a config.json path, a config dict or a parameter count."""
    if isinstance(model, Mapping):
        return model_from_config(model, config_name(model, "custom model"))
    if isinstance(model, int) and not isinstance(model, bool):
        return model_from_param_count(model)
    if isinstance(model, Path):
        return model_from_config_file(model)
    if not isinstance(model, str):
        raise ConfigError("model", "give a catalog name, a config.json path or a parameter count")
    text = model.strip()
    if not text or len(text) > 4096:
        raise ConfigError("model", "give a catalog name, a config.json path or a parameter count")
    if catalog_entry(text) is not None:
        return _catalog_model(text)
    if text.startswith("{"):
        return load_model(read_config_text(text))
    count = parse_param_count(text)
    if count is not None:
        return model_from_param_count(count)
    path = Path(text)
    if path.suffix == ".json" or os.path.lexists(path):  # lexists: report a symlink loop
        return model_from_config_file(path)
    slugs = ", ".join(e.slug for e in model_catalog()[:6])
    raise ConfigError(
        "model", f"{text[:80]!r} is not a catalog model, a config.json or a size "
        f"(e.g. {slugs}, ...; `python -m vram models` lists all)"
    )


def load_config(model: str | Path | Mapping[str, Any] | int) -> dict[str, Any]:
    """The config.json behind `load_model`'s argument, as a dict (for the exact trace)."""
    if isinstance(model, Mapping):
        return dict(model)
    if isinstance(model, int) and not isinstance(model, bool):
        return config_for_param_count(model)
    text = str(model).strip()
    if isinstance(model, str) and catalog_entry(text) is not None:
        return read_config_text((data_dir() / "models" / f"{text}.json").read_bytes())
    if text.startswith("{"):
        return read_config_text(text)
    count = parse_param_count(text)
    if count is not None:
        return config_for_param_count(count)
    path = Path(text)
    load_model(path)  # validates, with the same messages
    try:
        return read_config_text(read_limited(path, MAX_CONFIG_BYTES, what="config.json"))
    except FileReadError as exc:
        raise ConfigError("model", str(exc)) from None
