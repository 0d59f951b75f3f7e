"""The package's shape: a curated public API, no Streamlit, typed."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import vram

EXPECTED_API = {
    "Attention", "Bucket", "BucketName", "CatalogEntry", "CatalogError", "ConfigError",
    "Estimate", "FitOption", "FitReport", "Framework", "Gpu", "InferenceEstimate", "LineItem",
    "MomentBytes",
    "Loss", "Method", "ModelSpec", "Offload", "Optimizer", "ParamCounts", "Phase", "Precision",
    "Quant", "Sharding", "TrainingSetup", "VramError", "estimate", "fit", "load_gpus",
    "load_model", "model_catalog", "model_from_config", "model_from_param_count",
    "teaching_models", "LoadedTrainingConfig", "load_training_config",
    # the planner (issue 10)
    "Hardware", "Plan", "plan",
    # the peaks alone, for sweeps and searches (issue 10's speed bars)
    "PeakBytes", "estimate_peaks",
}


def test_public_api_is_pinned() -> None:
    assert set(vram.__all__) == EXPECTED_API
    assert all(hasattr(vram, name) for name in vram.__all__)


def test_the_core_is_light() -> None:
    """`import vram` (and its CLI, validation and trace entry points) loads none of the app's
    dependencies: no Streamlit, no plotly, no pandas (a light core, issue 15)."""
    code = ("import sys, vram, vram.cli, vram.knobs, vram.validate, vram.trace, vram.export, "
            "vram.readers; "
            "print(sorted(m for m in ('streamlit', 'plotly', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_package_is_typed() -> None:
    assert (Path(vram.__file__).parent / "py.typed").exists()


@pytest.mark.parametrize("module", ["vram.estimate", "ui.render", "ui"])
@pytest.mark.parametrize("category", [DeprecationWarning, FutureWarning])
def test_a_deprecation_from_our_own_code_fails_the_tests(module: str,
                                                         category: type[Warning]) -> None:
    """pyproject's filterwarnings turn our own modules' deprecations into errors; a library's
    stay warnings (the filters match the module a warning is attributed to)."""
    with pytest.raises(category):
        warnings.warn_explicit("old API", category, "x.py", 1, module=module)
    with warnings.catch_warnings(record=True):
        warnings.warn_explicit("old API", category, "x.py", 1, module="uvicorn.config")
