"""How long the calculator's script takes to redraw after a control moves (server time).

Runs `app.py` under Streamlit's AppTest, moves one control per rerun across several settings
(models from 1B to 70B, every method, long sequences, several GPUs, the math shown), and times
the script itself (the time Streamlit spends executing it, what a browser waits for before the
first delta), as well as the whole AppTest round trip. Prints the median; the target is 150 ms.

    python benchmarks/app_rerun.py > benchmarks/app_rerun.txt
"""

from __future__ import annotations

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

SCRIPT_TIMES: list[float] = []
_exec = script_runner.exec_func_with_error_handling


def _timed_exec(func: Callable[[], Any], ctx: Any) -> Any:
    start = time.perf_counter()
    try:
        return _exec(func, ctx)
    finally:
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
    ("toggle", "ckpt", True),
    ("selectbox", "model", "llama-3.1-70b"),
    ("slider", "batch", 1),
    ("select_slider", "gpus", 8),
    ("selectbox", "shard", "zero3"),
    ("selectbox", "model", "llama-3.2-1b"),
    ("radio", "method", "qlora"),
    ("radio", "unit", "GiB"),
    ("toggle", "math", True),
    ("slider", "batch", 16),
    ("select_slider", "seq", 8192),
    ("selectbox", "model", "llama-3.1-8b"),
]
ROUNDS = 3


def main() -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.run()
    SCRIPT_TIMES.clear()
    round_trips: list[float] = []
    for _ in range(ROUNDS):
        for kind, key, value in STEPS:
            widget = getattr(at, kind)(key=key)
            widget.set_value(value)
            start = time.perf_counter()
            at.run()
            round_trips.append(time.perf_counter() - start)
            if at.exception:
                raise SystemExit(f"exception after {key}={value}: {at.exception[0].value}")
        # back to the first settings for the next round
        for kind, key, value in (
            ("toggle", "math", False),
            ("radio", "unit", "GB"),
            ("toggle", "ckpt", False),
            ("selectbox", "opt", "adamw"),
            ("select_slider", "gpus", 1),
        ):
            getattr(at, kind)(key=key).set_value(value)
            at.run()
    script_ms = [t * 1000 for t in SCRIPT_TIMES]
    trip_ms = [t * 1000 for t in round_trips]
    print(
        f"python {platform.python_version()} on {platform.machine()}, "
        f"{len(trip_ms)} reruns over {len(STEPS)} control moves x {ROUNDS} rounds"
    )
    print(
        f"script run (server time): median {statistics.median(script_ms):.1f} ms, "
        f"p90 {sorted(script_ms)[int(0.9 * len(script_ms))]:.1f} ms, "
        f"max {max(script_ms):.1f} ms"
    )
    print(
        f"AppTest round trip:       median {statistics.median(trip_ms):.1f} ms, "
        f"p90 {sorted(trip_ms)[int(0.9 * len(trip_ms))]:.1f} ms, max {max(trip_ms):.1f} ms"
    )
    print(f"median_ms={statistics.median(script_ms):.1f} target_ms=150")


if __name__ == "__main__":
    main()
