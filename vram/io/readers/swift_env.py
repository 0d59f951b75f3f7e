"""The environment variables an ms-swift run is started with (a launch script's `VAR=value`
prefixes, or its config file's `ENV` mapping) -> setup.

- `NPROC_PER_NODE`, `NNODES`: `swift/cli/main.py@3602360a` `get_torchrun_args` starts one
  process per GPU with torchrun when either is set; without them the run is one process, and
  with several `CUDA_VISIBLE_DEVICES` ms-swift splits the model over them (`device_map`,
  `swift/utils/env.py@3602360a` `is_mp`), which vram does not model.
- `MAX_PIXELS`, `MIN_PIXELS`, `VIDEO_MAX_PIXELS`: the Qwen-VL family's bounds, read by
  `qwen_vl_utils` through `swift/model/models/qwen.py@3602360a` `patch_qwen_vl_utils`
  (`get_env_args`, `swift/utils/utils.py@3602360a`); for qwen_vl_utils >= 0.0.14
  `compat_qwen_vl_utils` turns each into a token budget `VALUE // (patch · merge)²`, the same
  pixels. Unset, qwen_vl_utils' own bounds hold (`vision_process.py` IMAGE_MAX_TOKEN_NUM 16,384
  and IMAGE_MIN_TOKEN_NUM 4 tokens of 28² px for Qwen2.5-VL: 12,845,056 and 3,136, its
  processor's too), which the setup leaves to the model.
- `FPS`, `FPS_MAX_FRAMES`, `FPS_MIN_FRAMES`, `VIDEO_MIN_PIXELS`, `VIDEO_TOTAL_PIXELS`: how a
  video is sampled; the frames a sample holds come from the data (`--video-frames`).
- `PYTORCH_CUDA_ALLOC_CONF` (`PYTORCH_ALLOC_CONF` from torch 2.10): the allocator's settings.
"""

from __future__ import annotations

from typing import Any

from vram.errors import TrainingConfigError
from vram.io.readers.mapper import Mapper, shown
from vram.io.readers.swift_command import ShellExpansion
from vram.setup import MAX_GPUS
from vram.setup.vision import MAX_PIXELS

AT = "@3602360a"
QWEN = f"swift/model/models/qwen.py{AT} patch_qwen_vl_utils"
_BOUNDS = (("MAX_PIXELS", "max_pixels"), ("MIN_PIXELS", "min_pixels"),
           ("VIDEO_MAX_PIXELS", "video_max_pixels"))
_VIDEO = ("FPS", "FPS_MAX_FRAMES", "FPS_MIN_FRAMES", "VIDEO_MIN_PIXELS", "VIDEO_TOTAL_PIXELS")
_TOKEN_BUDGETS = ("IMAGE_MAX_TOKEN_NUM", "IMAGE_MIN_TOKEN_NUM", "VIDEO_MAX_TOKEN_NUM",
                  "VIDEO_MIN_TOKEN_NUM", "SPATIAL_MERGE_SIZE")
#: Variables that start or place the processes and change no GPU's memory.
_LAUNCH = frozenset({"MASTER_PORT", "MASTER_ADDR", "NODE_RANK", "WANDB_API_KEY",
                     "WANDB_PROJECT", "SWANLAB_API_KEY", "HF_ENDPOINT", "USE_HF",
                     "MODELSCOPE_CACHE", "HF_HOME", "TOKENIZERS_PARALLELISM", "NCCL_DEBUG",
                     "OMP_NUM_THREADS", "ASCEND_RT_VISIBLE_DEVICES", "PYTHONPATH",
                     "TORCH_NCCL_AVOID_RECORD_STREAMS", "SWIFT_DEBUG", "SWIFT_UI_LANG"})
_ALLOC = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _count(m: Mapper, name: str, value: Any, high: int) -> int:
    """A whole number from an environment value (text in a shell, a number in YAML)."""
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 30:
        value = int(value.strip())
    number = m.int_key(name, value, high=high)
    if number is None:  # pragma: no cover - a None value is dropped before
        raise TrainingConfigError(name, "must be a whole number")
    return number


def map_environment(m: Mapper, env: dict[str, Any], *, launched: bool = False) -> int:
    """Map `env`; returns the GPU count of the run (1 without torchrun). `launched`: a
    launcher that starts a process per GPU runs ms-swift's script (accelerate, torchrun)."""
    known = {*(name for name, _ in _BOUNDS), *_VIDEO, *_TOKEN_BUDGETS, *_ALLOC,
             "NPROC_PER_NODE", "NNODES", "CUDA_VISIBLE_DEVICES"}
    values: dict[str, Any] = {}
    for name, value in env.items():
        key = str(name)
        if isinstance(value, ShellExpansion):
            m.ignore(key, f"{shown(value.text)} needs the shell to run; vram runs nothing: "
                     "give the value itself" + (" (--gpus N)" if key == "NPROC_PER_NODE"
                                                else ""))
        elif value is None or value == "":
            continue
        elif key in known:
            values[key] = value
        elif key in _LAUNCH:
            m.ignore(key, "does not change training memory (launch, logging, hub)")
        else:
            m.ignore(key, "not an environment variable vram reads for ms-swift")
    n_gpus = _launch(m, values, launched)
    _vision(m, values)
    for name in _ALLOC:
        if name in values:
            m.set("alloc_conf", str(values[name]), name, values[name])
    return n_gpus


def _launch(m: Mapper, env: dict[str, Any], launched: bool) -> int:
    per_node = _count(m, "NPROC_PER_NODE", env["NPROC_PER_NODE"], MAX_GPUS) if (
        "NPROC_PER_NODE" in env) else None
    nodes = _count(m, "NNODES", env["NNODES"], MAX_GPUS) if "NNODES" in env else 1
    visible = env.get("CUDA_VISIBLE_DEVICES")
    devices = [d for d in str(visible).split(",") if d.strip()] if visible is not None else []
    if visible is not None:
        m.record("CUDA_VISIBLE_DEVICES", visible, f"{len(devices)} GPU(s) visible")
    if per_node is None and "NNODES" not in env:
        if launched:
            m.note("the launcher's process count was not found: give the GPU count (--gpus N)")
        elif len(devices) > 1:
            m.note(f"{len(devices)} GPUs visible and no NPROC_PER_NODE: ms-swift splits the "
                   f"model over them (device_map; swift/cli/main.py{AT} starts one process), "
                   "which vram does not model: estimated as one GPU holding it all")
        return 1
    n_gpus = (per_node or 1) * nodes
    if n_gpus > MAX_GPUS:
        raise TrainingConfigError("NNODES", f"NPROC_PER_NODE x NNODES must be at most "
                                  f"{MAX_GPUS:,}, got {n_gpus:,}")
    key = "NPROC_PER_NODE" if "NNODES" not in env else "NPROC_PER_NODE x NNODES"
    m.set("n_gpus", n_gpus, key, f"{per_node or 1}x{nodes}" if "NNODES" in env else per_node,
          f"torchrun processes (swift/cli/main.py{AT} get_torchrun_args)")
    return n_gpus


def _vision(m: Mapper, env: dict[str, Any]) -> None:
    for name, field in _BOUNDS:
        if name in env:
            m.set(field, _count(m, name, env[name], MAX_PIXELS), name, env[name],
                  f"qwen_vl_utils' bound ({QWEN})")
    for name in _VIDEO:
        if name in env:
            m.record(name, env[name], "video sampling: the frames a sample holds come from "
                     "--video-frames" + (" (at most this)" if name == "FPS_MAX_FRAMES" else ""))
    for name in _TOKEN_BUDGETS:
        if name in env:
            m.record(name, env[name], "a token budget, not modelled: give --max-pixels "
                     f"(tokens x (patch x merge)^2, swift/model/models/qwen.py{AT} "
                     "compat_qwen_vl_utils)")
