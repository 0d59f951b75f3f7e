"""Cached reads of the data files, and the model a state dict points at.

Streamlit reruns the whole page script on every widget change, so file reads are cached here
(practice 8). The estimate takes microseconds; `ui.results` remembers a state's estimate and
fit together, because the fit over the whole GPU catalog is what costs.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st
from streamlit.errors import FragmentHandledException

import vram
from ui import charts, params, text
from vram.errors import VramError
from vram.model.architecture import read_config_text
from vram.model.catalog import load_config

#: GPUs whose capacity is drawn as a line on the charts, when the catalog has them.
COMMON_GPU_IDS: tuple[str, ...] = (
    "t4",
    "rtx-4090",
    "a100-40gb-sxm",
    "l40s",
    "h100-sxm",
    "h200",
    "mi300x",
)


@st.cache_resource(show_spinner=False)
def catalog() -> tuple[vram.CatalogEntry, ...]:
    """The model catalog: teaching sizes first (1B, 8B, 13B, 70B), then by parameters."""
    order = {"1B": 0, "8B": 1, "13B": 2, "70B": 3}
    entries = vram.model_catalog()
    return tuple(
        sorted(entries, key=lambda e: (order.get(e.teaching_size or "", 9), e.params, e.slug))
    )


def default_model() -> str:
    """The 8B teaching model (Llama 3.1 8B in the shipped catalog), else the first entry."""
    for entry in catalog():
        if entry.teaching_size == "8B":
            return str(entry.slug)
    return str(catalog()[0].slug)


@st.cache_resource(show_spinner=False)
def registry() -> params.Registry:
    gpu_list = gpus()
    return params.registry(
        tuple(e.slug for e in catalog()), default_model(),
        gpu_vendors=tuple(sorted({g.vendor for g in gpu_list})),
        gpu_segments=tuple(sorted({g.segment for g in gpu_list})),
        gpu_ids=tuple(g.id for g in gpu_list), lesson_gpu=LESSON_GPU_ID,
    )


@functools.cache
def _catalog_labels() -> dict[str, str]:
    # functools, not st.cache_resource: this runs once per option of the model list, and a
    # Streamlit cache lookup (hashing, a lock) costs more than the lookup itself.
    return {
        e.slug: (f"{e.teaching_size} · " if e.teaching_size else "") + e.display_name
        for e in catalog()
    }


def model_label(slug: str) -> str:
    """What the model list shows: ``8B · Llama 3.1 8B`` for teaching sizes, else the name."""
    if slug == params.UPLOAD:
        return "Upload a config.json…"
    if slug == params.BY_SIZE:
        return "Any size (parameter count)…"
    # One dict lookup: the model list formats every catalog entry on every rerun.
    return _catalog_labels().get(slug, slug)


@st.cache_resource(show_spinner=False)
def gpus_from(path: str | None) -> tuple[vram.Gpu, ...]:
    return tuple(vram.load_gpus(path))


def gpus() -> tuple[vram.Gpu, ...]:
    """The GPU catalog, or the team's own list named by VRAM_GPUS_CSV (read once per path)."""
    return gpus_from(os.environ.get("VRAM_GPUS_CSV") or None)


def stop_if_gpu_list_is_bad() -> None:
    """Name a GPU list that cannot be used (a team's VRAM_GPUS_CSV) and end the run as failed.

    The page shows the file and the line; the run ends with an exception Streamlit counts as
    an error without drawing its own box, so `/_stcore/script-health-check` (enabled with
    `server.scriptHealthCheckEnabled`) answers 503 and an orchestrator notices (docs/app.md).
    """
    try:
        gpus()
    except VramError as exc:
        text.error([str(exc)], lead="**The GPU list cannot be used.** Fix the file named below "
                   "and restart the app.")
        raise FragmentHandledException from None


def filter_gpus(gpu_list: Sequence[vram.Gpu], vendors: Sequence[str],
                segments: Sequence[str]) -> list[vram.Gpu]:
    """The GPUs of the chosen vendors and segments (nothing chosen keeps every one)."""
    return [g for g in gpu_list
            if (not vendors or g.vendor in vendors) and (not segments or g.segment in segments)]


short_gpu_name = charts.short_gpu_name


#: The card the lessons are about ("QLoRA of 70B fits one 80 GB GPU"): when a chart runs out
#: of room for capacity labels, this line keeps its label longest below the peak.
LESSON_GPU_ID = "h100-sxm"


def lesson_capacities() -> frozenset[int]:
    """Sizes (bytes) whose capacity labels the charts keep longest: the lesson card's."""
    return frozenset(int(g.memory_bytes) for g in gpus() if g.id == LESSON_GPU_ID)


def capacities() -> list[tuple[str, int]]:
    """(name, bytes) of the common GPUs to draw as lines; every GPU for a team's own list."""
    all_gpus = gpus()
    common = [g for g in all_gpus if g.id in COMMON_GPU_IDS] or list(all_gpus)
    return [(short_gpu_name(g.name), int(g.memory_bytes)) for g in common]


@st.cache_resource(show_spinner=False, max_entries=256)
def catalog_model(slug: str) -> vram.ModelSpec:
    return vram.load_model(slug)


@st.cache_resource(show_spinner=False, max_entries=64)
def config_model(text: str) -> vram.ModelSpec:
    """A model from config.json text; vram parses it as JSON (nothing is executed)."""
    config = read_config_text(text)
    name = str(config.get("_name_or_path") or "uploaded config.json")[:80]
    config.setdefault("_name_or_path", name)
    return vram.load_model(config)


@st.cache_resource(show_spinner=False, max_entries=64)
def sized_model(n_params: int) -> vram.ModelSpec:
    return vram.model_from_param_count(n_params)


def resolve_model(state: Mapping[str, Any]) -> tuple[vram.ModelSpec | None, str | None]:
    """The ModelSpec a state points at, or None and a message naming what is wrong."""
    choice = state["model"]
    try:
        if choice == params.UPLOAD:
            text = state.get("config") or ""
            if not text:
                return (
                    None,
                    "Model: choose a config.json file to upload (a Hugging Face model's config).",
                )
            return config_model(text), None
        if choice == params.BY_SIZE:
            return sized_model(round(float(state["size"]) * 1e9)), None
        return catalog_model(choice), None
    except VramError as exc:
        return None, f"Model: {exc}"


def custom_gpu_list() -> bool:
    return bool(os.environ.get("VRAM_GPUS_CSV"))


def model_config(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config.json dict behind the chosen model (for the exact trace), or None."""
    choice = state["model"]
    try:
        if choice == params.UPLOAD:
            text = state.get("config") or ""
            return read_config_text(text) if text else None
        if choice == params.BY_SIZE:
            return load_config(round(float(state["size"]) * 1e9))
        return load_config(str(choice))
    except (VramError, ValueError):
        return None
