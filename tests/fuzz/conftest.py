"""The fuzz suite's budget: a fixed seed and a short run in CI, a long one on request.

`VRAM_FUZZ_EXAMPLES` sets the hypothesis examples per API/CLI test (default 60) and
`VRAM_FUZZ_APP` the AppTest runs per page and of uploads (default 1); `benchmarks/fuzz.py`
runs the same surfaces with a long budget and writes `benchmarks/fuzz.txt`.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("VRAM_FUZZ_EXAMPLES", "60"))
APP_RUNS = int(os.environ.get("VRAM_FUZZ_APP", "1"))
SEED = 13

#: Fixed seed (derandomize), no example database, no hypothesis deadline: `surfaces.within`
#: enforces the 5 s limit per input itself.
settings.register_profile(
    "fuzz", max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
    suppress_health_check=list(HealthCheck), print_blob=True,
)


@pytest.fixture(scope="session")
def warm_app() -> None:
    """One untimed run first: the first AppTest run imports pandas, plotly and the pages."""
    from tests.fuzz.surfaces import run_url

    run_url("app.py", {}, seconds=120)
