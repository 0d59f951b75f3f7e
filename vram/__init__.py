"""vram: how much GPU memory a training run needs, where it goes, and which GPUs hold it.

    >>> import vram
    >>> model = vram.load_model("llama-3.1-8b")
    >>> result = vram.estimate(model, vram.TrainingSetup(method="qlora", seq_len=2048))
    >>> result.device_peak_bytes, result.bucket_bytes
    >>> vram.estimate_peaks(model, result.setup)  # the same peaks, no breakdown (sweeps)
    >>> vram.fit(model, result.setup).cheapest
    >>> vram.plan(model, result.setup, hardware=vram.Hardware(gpu="rtx-4090"), tokens=1e9)
    >>> loaded = vram.load_training_config("qlora.yml")  # axolotl, torchtune, LF, TRL, ms-swift
"""

from vram.errors import CatalogError, ConfigError, VramError
from vram.gpus import FitOption, FitReport, Gpu, fit, load_gpus
from vram.io.readers import LoadedTrainingConfig, load_training_config
from vram.model.architecture import ModelSpec, model_from_config, model_from_param_count
from vram.model.catalog import CatalogEntry, load_model, model_catalog, teaching_models

# `vram.plan` is the function; its modules stay importable as vram.plan.<module>.
from vram.plan import Hardware, Plan, plan
from vram.result import (
    Bucket,
    BucketName,
    Estimate,
    InferenceEstimate,
    LineItem,
    MomentBytes,
    ParamCounts,
    PeakBytes,
    Phase,
)
from vram.setup import (
    Attention,
    Framework,
    Loss,
    Method,
    Offload,
    Optimizer,
    Precision,
    Quant,
    Sharding,
    TrainingSetup,
)
from vram.step.estimate import estimate, estimate_peaks

__all__ = [
    "Attention",
    "Bucket",
    "BucketName",
    "CatalogEntry",
    "CatalogError",
    "ConfigError",
    "Estimate",
    "FitOption",
    "FitReport",
    "Framework",
    "Gpu",
    "Hardware",
    "InferenceEstimate",
    "LineItem",
    "LoadedTrainingConfig",
    "Loss",
    "Method",
    "ModelSpec",
    "MomentBytes",
    "Offload",
    "Optimizer",
    "ParamCounts",
    "PeakBytes",
    "Phase",
    "Plan",
    "Precision",
    "Quant",
    "Sharding",
    "TrainingSetup",
    "VramError",
    "estimate",
    "estimate_peaks",
    "fit",
    "load_gpus",
    "load_model",
    "load_training_config",
    "model_catalog",
    "model_from_config",
    "model_from_param_count",
    "plan",
    "teaching_models",
]
