"""The state caches of `ui.results` give exactly what computing afresh gives, and are shared."""

from __future__ import annotations

import json

import pytest

import vram
from ui import breakdown_chart, charts, data, params, results, step_charts, tables
from vram import gpus
from vram.result import BUCKET_ORDER


@pytest.fixture
def state() -> dict[str, object]:
    return {**data.registry().defaults(), "batch": 3, "seq": 4096}


def test_key_ignores_order_and_display_only_state(state: dict[str, object]) -> None:
    reordered = dict(reversed(list(state.items())))
    shown_differently = {**state, "unit": "GiB", "math": True, "fits": True}
    assert results.state_key(reordered) == results.state_key(state)
    assert results.state_key(shown_differently) == results.state_key(state)
    assert results.state_key({**state, "batch": 4}) != results.state_key(state)
    hash(results.state_key(state))  # lists (LoRA targets) became tuples


def test_cached_result_equals_a_fresh_estimate_and_fit(state: dict[str, object]) -> None:
    res = results.result(state)
    model, _ = data.resolve_model(state)
    setup, errors = params.build_setup(state)
    assert not errors and model is not None and setup is not None
    assert res.errors == ()
    assert res.estimate == vram.estimate(model, setup)
    assert res.report == vram.fit(model, setup, data.gpus())
    assert results.result(dict(state)) is res  # a second session gets the same object


def test_bad_state_is_cached_with_its_messages(state: dict[str, object]) -> None:
    res = results.result({**state, "model": params.UPLOAD, "config": ""})
    assert res.estimate is None and res.report is None
    assert res.errors and res.errors[0].startswith("Model:")


def test_figures_are_the_charts_and_their_dict_is_computed_once(
    state: dict[str, object],
) -> None:
    est = results.result(state).estimate
    assert est is not None
    fig = results.breakdown_figure(state, "GiB")
    fresh = breakdown_chart.breakdown_figure(est, unit="GiB", capacities=data.capacities())
    assert fig.to_dict() == fresh.to_dict()
    assert fig.to_dict() is fig.to_dict()
    assert results.inference_figure(state, "GB").to_dict() == (
        step_charts.inference_figure(est, unit="GB").to_dict()
    )


def test_tables_and_download_carry_the_report(state: dict[str, object]) -> None:
    res = results.result(state)
    assert res.report is not None and res.estimate is not None
    fits, misses = results.fit_tables(state, "GB")
    small = gpus.too_small(res.estimate.setup, res.estimate.device_peak_bytes,
                           [g for g in data.gpus() if g not in res.report.unsupported])
    fresh_fits, fresh_misses = tables.fit_frames(res.report, res.estimate, small, "GB")
    assert fits.equals(fresh_fits) and misses.equals(fresh_misses)
    assert fits.column("GPU").to_pylist() == [data.short_gpu_name(o.gpu.name)
                                              for o in res.report.fits]
    prices = fits.column("$ per hour").to_pylist()
    assert [float(p) if p != tables.NO_PRICE else None for p in prices] == [
        o.usd_per_hour for o in res.report.fits]
    assert len({len(p) for p in prices if p != tables.NO_PRICE}) == 1  # one width: sorts
    assert misses.column("GPU").to_pylist() == [data.short_gpu_name(g.name) for g in small]
    assert len(fits) == len(res.report.fits) and len(misses) == len(small)
    payload = json.loads(results.download_json(state))
    assert payload["device_peak_bytes"] == res.estimate.device_peak_bytes
    assert [o["gpu"] for o in payload["cheapest"]] == [o.gpu.id for o in res.report.fits]


def test_through_step_table_is_cached_and_matches_the_estimate(state: dict[str, object]) -> None:
    est = results.result(state).estimate
    assert est is not None
    table, captions = results.through_step(state, "GB")
    assert results.through_step(dict(state), "GB")[0] is table  # shared, built once
    fresh, fresh_captions = tables.through_step_data(est, "GB")
    assert table.equals(fresh) and captions == fresh_captions
    assert table.column("at the peak").to_pylist() == [
        round(charts.to_unit(est.bucket(name).bytes, "GB"), 2) for name in BUCKET_ORDER]
