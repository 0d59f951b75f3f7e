"""The model catalog (`data/models/`) and the one way to turn user input into a `ModelSpec`.

`load_model` takes a catalog slug, a path to a config.json, a config dict, or a bare parameter
count ("7e9", "70B") and always returns a `ModelSpec` or raises a `VramError` naming the field.
"""

from __future__ import annotations

import csv
import os
import re
import urllib.request
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from vram.errors import CatalogError, ConfigError, FileReadError
from vram.files import read_limited
from vram.model.architecture import (
    MAX_CONFIG_BYTES,
    ModelSpec,
    config_for_param_count,
    model_from_config,
    model_from_config_file,
    model_from_param_count,
    read_config_text,
)
from vram.model.config_checks import config_name
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


class HubId(BaseModel):
    """Another Hub id for a catalog entry (`data/models/hub_ids.csv`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hub_id: str
    slug: str
    relation: str
    source: str


@cache
def hub_ids() -> tuple[HubId, ...]:
    """Every extra Hub id, validated row by row; each names a catalog slug."""
    path = data_dir() / "models" / "hub_ids.csv"
    slugs = {e.slug for e in model_catalog()}
    rows: list[HubId] = []
    with path.open(newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                entry = HubId(hub_id=row["hub_id"], slug=row["slug"],
                              relation=row["relation"], source=row["source"])
            except (KeyError, ValueError) as exc:
                raise CatalogError(f"{path.name} line {line}: {exc}") from None
            if entry.slug not in slugs:
                raise CatalogError(f"{path.name} line {line}: unknown slug {entry.slug!r}")
            rows.append(entry)
    return tuple(rows)


def ids_for(slug: str) -> tuple[str, ...]:
    """The Hub ids that name a catalog entry: its own repo first, then the others."""
    entry = catalog_entry(slug)
    own = (entry.hf_repo,) if entry else ()
    return own + tuple(h.hub_id for h in hub_ids() if h.slug == slug)


def resolve_hub_id(text: str) -> str | None:
    """The catalog slug for a Hub id (case-insensitive; `https://huggingface.co/` and a
    trailing revision are dropped), or None."""
    name = text.strip().removeprefix("https://huggingface.co/").split("@")[0].strip("/")
    key = name.lower()
    by_repo = [e for e in model_catalog() if e.hf_repo.lower() == key]
    if len(by_repo) == 1:  # a repo shared by several entries (example code) names none
        return by_repo[0].slug
    if any(e.slug == key for e in model_catalog()):
        return key
    return next((h.slug for h in hub_ids() if h.hub_id.lower() == key), None)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
#: Host setting: fetch an unknown Hub model's public config.json (off unless set to 1).
HUB_FETCH_ENV = "VRAM_HUB_FETCH"
HUB_TIMEOUT_S = 10


def looks_like_hub_id(text: str) -> bool:
    return bool(_HUB_ID.match(text)) and not text.endswith(".json")


def fetch_hub_config(hub_id: str) -> dict[str, Any]:
    """The public config.json of a Hub model, read as data only (size-capped JSON; nothing in
    it is executed, no remote code). Only when the host sets VRAM_HUB_FETCH=1."""
    if not looks_like_hub_id(hub_id):
        raise ConfigError("model", f"{hub_id[:80]!r} is not a Hub id (owner/name)")
    url = f"https://huggingface.co/{hub_id}/resolve/main/config.json"
    request = urllib.request.Request(url, headers={"User-Agent": "vram"})
    try:
        with urllib.request.urlopen(request, timeout=HUB_TIMEOUT_S) as response:
            body = response.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError("model", f"could not fetch {hub_id}'s config.json ({exc}); "
                          "download it and pass its path") from None
    return read_config_text(body)


def _unknown_hub_id(text: str) -> ConfigError:
    return ConfigError(
        "model", f"{text[:80]!r} is not in vram's catalog of Hub ids. Download its config.json "
        f"(https://huggingface.co/{text[:80]}/blob/main/config.json) and pass the file's path, "
        f"or paste its contents; a host may allow fetching it with {HUB_FETCH_ENV}=1"
    )


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
    slug = resolve_hub_id(text)
    if slug is not None:
        return _catalog_model(slug)
    count = parse_param_count(text)
    if count is not None:
        return model_from_param_count(count)
    path = Path(text)
    if path.suffix == ".json" or os.path.lexists(path):  # lexists: report a symlink loop
        return model_from_config_file(path)
    if looks_like_hub_id(text):
        if os.environ.get(HUB_FETCH_ENV) == "1":
            return model_from_config(fetch_hub_config(text), text)
        raise _unknown_hub_id(text)
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
    slug = text if catalog_entry(text) is not None else resolve_hub_id(text)
    if isinstance(model, str) and slug is not None:
        return read_config_text((data_dir() / "models" / f"{slug}.json").read_bytes())
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
