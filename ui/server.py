"""Process-wide settings for serving the app, applied once when the first page imports `ui`.

Python's cyclic garbage collector runs a young-generation pass every 700 net allocations; one
rerun of the calculator allocates enough for a few passes, each of which also walks what the
caches keep alive. A threshold of 50,000 and freezing what the imports created (Streamlit,
pandas, plotly, pydantic: ~135,000 objects that live as long as the process) cut the CPU of a
rerun by 5-10 ms (benchmarks/app_rerun.py, cold states: mean 56 -> 47 ms). Reference counting
still frees a rerun's objects at once; only cycles wait for the (rarer) passes.
"""

from __future__ import annotations

import gc

#: Net allocations between young-generation passes (Python's default: 700).
GC_THRESHOLD_0 = 50_000

_applied = False


def tune_gc() -> None:
    """Freeze the objects alive now and collect the young generation less often (once)."""
    global _applied
    if _applied:
        return
    _applied = True
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD_0, gen1, gen2)
