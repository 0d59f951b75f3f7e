"""`vram.__all__` is the public API, pinned both ways (as httpx's own test does).

Every public name in the `vram` namespace is in `__all__`, and every name in `__all__` is
defined: a name that leaks into the namespace fails as surely as one that is removed.
Subpackages (`vram.model`, `vram.step`, ...) are the package's rooms, not members of its API.
"""

from __future__ import annotations

import types

import vram

PUBLIC_API = {
    "Attention", "Bucket", "BucketName", "CatalogEntry", "CatalogError", "ConfigError",
    "Estimate", "FitOption", "FitReport", "Framework", "Gpu", "Hardware", "InferenceEstimate",
    "LineItem", "LoadedTrainingConfig", "Loss", "Method", "ModelSpec", "MomentBytes", "Offload",
    "Optimizer", "ParamCounts", "PeakBytes", "Phase", "Plan", "Precision", "Quant", "Sharding",
    "TrainingSetup", "VramError", "estimate", "estimate_peaks", "fit", "load_gpus", "load_model",
    "load_training_config", "model_catalog", "model_from_config", "model_from_param_count",
    "plan", "teaching_models",
}


def test_all_is_the_pinned_api() -> None:
    assert set(vram.__all__) == PUBLIC_API
    assert len(vram.__all__) == len(set(vram.__all__))


def test_every_public_name_in_the_namespace_is_exported() -> None:
    public = {name for name, value in vars(vram).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public == set(vram.__all__)


def test_every_exported_name_is_defined() -> None:
    assert all(hasattr(vram, name) for name in vram.__all__)
