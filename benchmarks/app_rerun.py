"""How long the calculator's script takes to redraw after a control moves (server time).

Runs `app.py` under Streamlit's AppTest, moves one control per rerun across several settings
(models from 1B to 70B, every method, long sequences, several GPUs, the math shown), and times
the script itself: its CPU time (the script thread's, what one rerun costs the server) and its
wall time, as well as the whole AppTest round trip. The first round meets every state for the
first time (cold: nothing in `ui.results`' caches); the later rounds repeat the same states
(warm), as a team's sessions do for the default page and shared links. The target is 40 ms of
CPU per rerun (issue 13); a real server adds its own per-message work (benchmarks/load.py).

The sidebar's Advanced expander is opened for the moves that need it and closed after them (its
controls are drawn only while it is open), as a person would. "Make it fit" stays closed, as on
the default page (it computes nothing then); the last line times its own reruns, opened once
per round.

    python benchmarks/app_rerun.py > benchmarks/app_rerun.txt
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit.runtime.scriptrunner.script_runner as script_runner
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.streamlit_speed import scan_components_once  # noqa: E402
from ui.inputs import ADVANCED  # noqa: E402

scan_components_once()  # as a server does, once (AppTest rescans on every run, outside the script)

SCRIPT_TIMES: list[float] = []
SCRIPT_CPU: list[float] = []
_exec = script_runner.exec_func_with_error_handling


def _timed_exec(func: Callable[[], Any], ctx: Any) -> Any:
    start, cpu = time.perf_counter(), time.thread_time()
    try:
        return _exec(func, ctx)
    finally:
        SCRIPT_CPU.append(time.thread_time() - cpu)
        SCRIPT_TIMES.append(time.perf_counter() - start)


script_runner.exec_func_with_error_handling = _timed_exec  # type: ignore[assignment]

#: (widget kind, key, value): each step is one control move, as a person would make it.
STEPS: list[tuple[str, str, Any]] = [
    ("slider", "batch", 2),
    ("slider", "batch", 4),
    ("slider", "batch", 8),
    ("select_slider", "seq", 4096),
    ("select_slider", "seq", 32768),
    ("select_slider", "seq", 131072),
    ("select_slider", "seq", 2048),
    ("radio", "method", "lora"),
    ("radio", "method", "full"),
    ("selectbox", "opt", "adamw-8bit"),
    ("advanced", "", True),
    ("toggle", "ckpt", True),
    ("selectbox", "model", "llama-3.1-70b"),
    ("slider", "batch", 1),
    ("select_slider", "gpus", 8),
    ("selectbox", "shard", "zero3"),
    ("advanced", "", False),
    ("selectbox", "model", "llama-3.2-1b"),
    ("radio", "method", "qlora"),
    ("radio", "unit", "GiB"),
    ("toggle", "math", True),
    ("slider", "batch", 16),
    ("select_slider", "seq", 8192),
    ("selectbox", "model", "llama-3.1-8b"),
]
ROUNDS = 3


def _stats(label: str, values_s: list[float]) -> str:
    ms = sorted(1000 * v for v in values_s)
    return (f"{label}: median {statistics.median(ms):5.1f} ms, "
            f"p90 {ms[int(0.9 * len(ms))]:5.1f} ms, max {ms[-1]:5.1f} ms ({len(ms)} reruns)")


def main() -> None:
    load_before = os.getloadavg()[0]
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.run()
    round_trips: list[float] = []
    cold_cpu: list[float] = []
    warm_cpu: list[float] = []
    wall: list[float] = []
    plan_cpu: list[float] = []
    for n in range(ROUNDS):
        for kind, key, value in STEPS:
            if kind == "advanced":
                at.session_state[ADVANCED] = value  # what clicking the expander sets
            else:
                getattr(at, kind)(key=key).set_value(value)
            SCRIPT_CPU.clear()
            SCRIPT_TIMES.clear()
            start = time.perf_counter()
            at.run()
            round_trips.append(time.perf_counter() - start)
            if at.exception:
                raise SystemExit(f"exception after {key}={value}: {at.exception[0].value}")
            (cold_cpu if n == 0 else warm_cpu).extend(SCRIPT_CPU)
            wall.extend(SCRIPT_TIMES)
        # "Make it fit" opened on the last state, then closed
        for value in (True, False):
            at.toggle(key="plan").set_value(value)
            SCRIPT_CPU.clear()
            at.run()
            if value:
                plan_cpu.extend(SCRIPT_CPU)
        # back to the first settings for the next round
        at.session_state[ADVANCED] = True
        for kind, key, value in (
            ("toggle", "math", False),
            ("radio", "unit", "GB"),
            ("toggle", "ckpt", False),
            ("selectbox", "opt", "adamw"),
            ("select_slider", "gpus", 1),
        ):
            getattr(at, kind)(key=key).set_value(value)
            at.run()
        at.session_state[ADVANCED] = False
    print(
        f"python {platform.python_version()} on {platform.machine()}, "
        f"{len(round_trips)} reruns over {len(STEPS)} control moves x {ROUNDS} rounds; "
        f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after (a shared box: CPU time, not wall time, is the measure)"
    )
    print(_stats("script CPU, first round (cold)", cold_cpu))
    print(_stats("script CPU, later rounds (warm)", warm_cpu))
    print(_stats("script wall time, all", wall))
    print(_stats("AppTest round trip, all", round_trips))
    print(_stats("script CPU, 'Make it fit' opened (first round cold)", plan_cpu))
    print(f"cold_cpu_ms={statistics.median(cold_cpu) * 1000:.1f} "
          f"warm_cpu_ms={statistics.median(warm_cpu) * 1000:.1f} target_ms=40")


if __name__ == "__main__":
    main()
