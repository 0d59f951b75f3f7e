"""A CI-sized sample of the soak (benchmarks/soak.py, issue 25).

In process: the app's state caches, the memo and the resolved setups, with their bounds
lowered so that a few dozen states fill them, are driven through the soak's distinct states;
what Python holds (tracemalloc) stays flat after the warm-up and the caches stay within their
bounds. Against a real server: a few dozen distinct sessions over the websocket, as the
benchmark drives them, with no error. The full run (5,000 sessions, RSS) is
`benchmarks/soak.txt`.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from urllib.parse import parse_qsl

import pytest

from benchmarks import load, soak
from ui import data, params, results
from vram import memo
from vram.model.catalog import model_catalog
from vram.stacks import resolve as resolve_module

UI_BYTES = 3 * 2**20
MEMO_BYTES = 2 * 2**20
MODELS = 8
RESOLVED = 200
WARM_STATES = 60
STATES = 160


def _state(i: int, slugs: list[str]) -> dict[str, object]:
    reg = data.registry()
    query = dict(parse_qsl(soak.distinct_query(i, slugs)))
    query["batch"] = str(soak.slider_value(i))
    plan = query.pop("plan", None) == "1"  # the plan panel's own key (ui.plan_panel)
    parsed, errors = params.parse_query(reg, query)
    assert not errors, errors
    return {**reg.defaults(), **parsed, "plan": plan}


def _show(state: dict[str, object]) -> None:
    """What the calculator computes for a state (ui.results), and the plan when it is open."""
    shown = {k: v for k, v in state.items() if k != "plan"}
    res = results.result(shown)
    if res.estimate is None or res.model is None or res.setup is None:
        return
    results.breakdown_figure(shown, "GB")
    results.inference_figure(shown, "GB")
    results.fit_tables(shown, "GB")
    results.through_step(shown, "GB")
    results.model_config(shown)
    if shown.get("compress"):  # the what-if's result and its limits (main's what-if panel)
        results.what_if_result(shown)
        results.limits(shown)
    if state["plan"]:
        results.plan(res.model, res.setup, None, 1e9)


def test_the_caches_hold_what_their_bounds_say_over_distinct_states(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results._CACHE, "max_bytes", UI_BYTES)
    monkeypatch.setattr(memo._MEMO, "max_bytes", MEMO_BYTES)
    monkeypatch.setattr(data._MODELS, "max_entries", MODELS)
    monkeypatch.setattr(resolve_module._RESOLVED, "max_entries", RESOLVED)
    results._CACHE.clear()
    memo.clear_memo()
    resolve_module._RESOLVED.clear()
    slugs = [e.slug for e in model_catalog()]
    states = [_state(i, slugs) for i in range(STATES)]
    for slug in slugs:  # the catalog is read once per process, not per state: not growth
        data.catalog_model(slug)
    gc.collect()
    tracemalloc.start()
    try:
        held: list[int] = []
        for i, state in enumerate(states):
            _show(state)
            if i >= WARM_STATES and i % 20 == 0:
                gc.collect()
                held.append(tracemalloc.get_traced_memory()[0])
            assert results.cache_stats()[1] <= UI_BYTES
            assert memo.memo_stats()[1] <= MEMO_BYTES
            assert len(data._MODELS) <= MODELS
            assert len(resolve_module._RESOLVED) <= RESOLVED
    finally:
        tracemalloc.stop()
        results._CACHE.clear()
        memo.clear_memo()
    warm = held[0]
    assert max(held) <= 1.10 * warm, [round(h / 2**20, 1) for h in held]


def test_a_real_server_serves_distinct_sessions_without_error() -> None:
    port = load.free_port()
    with load.served(port) as pid:
        url = f"ws://127.0.0.1:{port}/_stcore/stream"
        run = asyncio.run(soak.soak(url, pid, sessions=24, every=12, concurrency=4,
                                    idle_s=0, log=False))
    assert run.errors == []
    assert [s.sessions for s in run.samples] == [12, 24]
    assert all(s.rss_mib > 50 for s in run.samples)
