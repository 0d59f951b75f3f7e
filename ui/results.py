"""What a page shows for a state, computed once per distinct state and shared by every session.

Streamlit reruns the page script on every widget change. Everything below depends only on the
state (the URL), so it is cached by the state itself: a team's sessions mostly ask for states
someone already asked for (the default page, the teaching sizes, a shared link), and a person
who toggles a control back sees the earlier state again. A cold state costs what it always did;
a warm one skips the estimate, the fit, the figures and the tables.

Cached values are shared between sessions and threads, so they are never mutated: the models
are frozen, and the figures here are only read (see `frozen_figure`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import pyarrow as pa

import vram
from ui import breakdown_chart, data, params, server, step_charts, tables
from ui import present as present_mode
from ui.charts import Unit
from ui.plan_chart import path_figure
from vram import gpus
from vram.gpus import ClassFit, FitOption, FitReport
from vram.io import report
from vram.plan.compressed import CompressedLimits, compressed_limits
from vram.plan.flops import checkpointing_compute
from vram.plan.hardware import Hardware
from vram.plan.planner import Plan
from vram.step.what_if import WhatIf, parse_ratios, what_if, what_if_fit

# The first page run imports this module, after Streamlit, pandas and plotly are loaded.
server.tune_gc()

#: Distinct states kept: an entry (estimate, fit, two figures, tables) holds about 0.25 MB
#: (tracemalloc), so the caches stay under ~60 MB per process.
MAX_STATES = 256

#: State that changes how a page looks, not the estimate or the fit: left out of the key, so
#: switching units or opening the math reuses the result.
DISPLAY_KEYS = frozenset({"unit", "math", "vendor", "segment", "fits", "pins", "present",
                          *params.WHAT_IF_KEYS})

StateKey = tuple[tuple[str, Any], ...]


def state_key(state: Mapping[str, Any]) -> StateKey:
    """A hashable, order-free key for the state an estimate depends on (lists become tuples)."""
    return tuple(
        sorted(
            (k, tuple(v) if isinstance(v, list) else v)
            for k, v in state.items()
            if k not in DISPLAY_KEYS
        )
    )


@dataclass(frozen=True)
class Result:
    """The model, setup, estimate and GPU fit for one state, or the messages saying why not."""

    model: vram.ModelSpec | None
    setup: vram.TrainingSetup | None
    estimate: vram.Estimate | None
    report: FitReport | None
    errors: tuple[str, ...]
    #: The lesson's count: the fewest 80 GB GPUs beside the capacity count (vram.gpus).
    class_fit: ClassFit | None = None
    #: What gradient checkpointing adds to the step's compute (0.33: a third more).
    ckpt_compute: float | None = None


def _gpu_list_path() -> str | None:
    # The fit depends on the GPU list, which VRAM_GPUS_CSV can replace.
    return os.environ.get("VRAM_GPUS_CSV") or None


@functools.lru_cache(maxsize=MAX_STATES)
def _result(key: StateKey, gpu_list: str | None) -> Result:
    state = dict(key)
    model, model_error = data.resolve_model(state)
    setup, setup_errors = params.build_setup(state)
    errors = tuple(([model_error] if model_error else []) + setup_errors)
    if model is None or setup is None:
        return Result(model, setup, None, None, errors)
    est = vram.estimate(model, setup)
    catalog = data.gpus_from(gpu_list)
    report = vram.fit(model, setup, catalog)
    return Result(model, setup, est, report, errors, gpus.class_fit(model, setup, report, catalog),
                  checkpointing_compute(model, setup, est.params.trainable))


def result(state: Mapping[str, Any]) -> Result:
    """The estimate and fit of `state` (cached by the state and the GPU list)."""
    return _result(state_key(state), _gpu_list_path())


def frozen_figure(fig: go.Figure) -> go.Figure:
    """`fig`, with `to_dict()` computed once.

    `st.plotly_chart` calls `to_dict()` on every run, a deep copy of the figure and its
    template (about 2 ms); a cached figure is never changed, so its dict never changes either.
    """
    spec = fig.to_dict()
    object.__setattr__(fig, "to_dict", lambda: spec)
    return fig


def _runnable_capacities(res: Result, gpu_list: str | None) -> tuple[
        list[tuple[str, int]], frozenset[str]]:
    """The capacity lines to draw (GPUs that can run the setup's precision) and the names of
    those too small for it: the same list the 'Too small' table shows."""
    assert res.estimate is not None and res.report is not None
    unsupported = {data.short_gpu_name(g.name) for g in res.report.unsupported}
    caps = [(name, size) for name, size in data.capacities() if name not in unsupported]
    small = frozenset(data.short_gpu_name(g.name) for g in gpus.too_small(
        res.estimate.setup, res.estimate.device_peak_bytes, data.gpus_from(gpu_list)))
    return caps, small


@functools.lru_cache(maxsize=MAX_STATES)
def _breakdown(key: StateKey, gpu_list: str | None, unit: Unit, present: bool) -> go.Figure:
    res = _result(key, gpu_list)
    assert res.estimate is not None
    caps, small = _runnable_capacities(res, gpu_list)
    size = ({"font_px": present_mode.FONT_PX, "height": present_mode.CHART_HEIGHT,
             "min_plot_px": present_mode.MIN_PLOT_PX} if present else {})
    return frozen_figure(
        breakdown_chart.breakdown_figure(res.estimate, unit=unit, capacities=caps, too_small=small,
                                keep_labelled=data.lesson_capacities(), **size)
    )


@functools.lru_cache(maxsize=MAX_STATES)
def _inference(key: StateKey, gpu_list: str | None, unit: Unit) -> go.Figure:
    est = _result(key, gpu_list).estimate
    assert est is not None
    return frozen_figure(step_charts.inference_figure(est, unit=unit))


def breakdown_figure(state: Mapping[str, Any], unit: Unit, *, present: bool = False,
                     ) -> go.Figure:
    return _breakdown(state_key(state), _gpu_list_path(), unit, present)


def inference_figure(state: Mapping[str, Any], unit: Unit) -> go.Figure:
    return _inference(state_key(state), _gpu_list_path(), unit)


@dataclass(frozen=True)
class WhatIfResult:
    """The step with some buckets compressed: its peak, its fit and the fewest 80 GB GPUs."""

    what: WhatIf
    report: FitReport
    lesson: FitOption | None


@functools.lru_cache(maxsize=MAX_STATES)
def _what_if(key: StateKey, gpu_list: str | None, compress: str) -> WhatIfResult:
    res = _result(key, gpu_list)
    assert res.model is not None and res.setup is not None and res.estimate is not None
    ratios = parse_ratios(compress.split(","))
    fitted = what_if_fit(res.model, res.setup, ratios, data.gpus_from(gpu_list))
    return WhatIfResult(what_if(res.estimate, ratios), fitted, gpus.fewest_in_class(fitted))


def what_if_result(state: Mapping[str, Any]) -> WhatIfResult | None:
    """The what-if of the state's `compress` (None when nothing is compressed)."""
    compress = str(state.get("compress") or "")
    if not compress:
        return None
    return _what_if(state_key(state), _gpu_list_path(), compress)


@functools.lru_cache(maxsize=MAX_STATES)
def _limits(key: StateKey, gpu_list: str | None, compress: str,
            gpu_id: str) -> CompressedLimits | None:
    res = _result(key, gpu_list)
    gpu = next((g for g in data.gpus_from(gpu_list) if g.id == gpu_id), None)
    if res.model is None or res.setup is None or gpu is None:
        return None
    ratios = parse_ratios([t for t in compress.split(",") if t])
    return compressed_limits(res.model, res.setup, ratios, gpu)


def limits(state: Mapping[str, Any]) -> CompressedLimits | None:
    """The largest batch, sequence and model that fit the what-if's GPU, compressed and not
    (three searches of dozens of estimates: cached by their inputs)."""
    return _limits(state_key(state), _gpu_list_path(), str(state.get("compress") or ""),
                   str(state.get("wgpu") or ""))


@functools.lru_cache(maxsize=MAX_STATES)
def _download_json(key: StateKey, gpu_list: str | None, compress: str) -> str:
    res = _result(key, gpu_list)
    assert res.estimate is not None and res.report is not None
    found = _what_if(key, gpu_list, compress) if compress else None
    return report.estimate_json_text(res.estimate, res.report,
                                     (found.what, found.report) if found else None)


def download_json(state: Mapping[str, Any]) -> str:
    """The JSON file the page offers: byte for byte what ``python -m vram estimate --json``
    prints for the same state (one serializer, vram.io.report), with its `what_if` when
    buckets are compressed (``--compress``)."""
    return _download_json(state_key(state), _gpu_list_path(), str(state.get("compress") or ""))


@functools.lru_cache(maxsize=MAX_STATES)
def _fit_tables(key: StateKey, gpu_list: str | None, unit: Unit) -> tuple[pa.Table, pa.Table]:
    res = _result(key, gpu_list)
    assert res.report is not None and res.estimate is not None
    supported = [g for g in data.gpus_from(gpu_list) if g not in res.report.unsupported]
    small = gpus.too_small(res.estimate.setup, res.estimate.device_peak_bytes, supported)
    return tables.fit_frames(res.report, res.estimate, small, unit)


def fit_tables(state: Mapping[str, Any], unit: Unit) -> tuple[pa.Table, pa.Table]:
    """The tables of GPUs that hold the run and of those too small (immutable, shared)."""
    return _fit_tables(state_key(state), _gpu_list_path(), unit)


@functools.lru_cache(maxsize=MAX_STATES)
def _through_step(key: StateKey, gpu_list: str | None, unit: Unit,
                  ) -> tuple[pa.Table, tuple[str, ...]]:
    est = _result(key, gpu_list).estimate
    assert est is not None
    return tables.through_step_data(est, unit)


def through_step(state: Mapping[str, Any], unit: Unit) -> tuple[pa.Table, tuple[str, ...]]:
    """The at-the-peak / through-the-step table and its captions (immutable, shared)."""
    return _through_step(state_key(state), _gpu_list_path(), unit)


@functools.lru_cache(maxsize=MAX_STATES)
def _model_config(key: StateKey) -> dict[str, Any] | None:
    return data.model_config(dict(key))


def model_config(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config.json behind the chosen model, for the exact trace (read-only: shared)."""
    return _model_config(state_key(state))


@functools.lru_cache(maxsize=MAX_STATES)
def _plan(model: vram.ModelSpec, setup: vram.TrainingSetup, hardware: Hardware | None,
          tokens: float, gpu_list: str | None) -> Plan:
    return vram.plan(model, setup, hardware=hardware, tokens=tokens,
                     gpus=data.gpus_from(gpu_list))


def plan(model: vram.ModelSpec, setup: vram.TrainingSetup, hardware: Hardware | None,
         tokens: float) -> Plan:
    """`vram.plan` (40-150 ms: dozens of estimates), cached by its frozen inputs."""
    return _plan(model, setup, hardware, tokens, _gpu_list_path())


@functools.lru_cache(maxsize=MAX_STATES)
def _plan_figure(model: vram.ModelSpec, setup: vram.TrainingSetup, hardware: Hardware | None,
                 tokens: float, gpu_list: str | None, unit: Unit) -> go.Figure:
    return frozen_figure(path_figure(_plan(model, setup, hardware, tokens, gpu_list), unit=unit))


def plan_figure(model: vram.ModelSpec, setup: vram.TrainingSetup, hardware: Hardware | None,
                tokens: float, unit: Unit) -> go.Figure:
    """The plan's path chart for the same inputs as `plan` (read-only: shared)."""
    return _plan_figure(model, setup, hardware, tokens, _gpu_list_path(), unit)
