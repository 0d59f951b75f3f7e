"""DeepSpeed and FSDP settings, as axolotl, LLaMA-Factory and TRL spell them.

A DeepSpeed config may be inline (a mapping) or a path to a JSON file. The file is read only
when the host allows file reads and it lies beside the training config (same folder or below);
nothing is ever fetched. Otherwise its ZeRO stage is taken from its name when the name says it
(`zero3_bf16.json`, `ds_z3_offload_config.json`), and the report says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from vram.errors import FileReadError, TrainingConfigError
from vram.files import read_limited_text
from vram.io.readers.mapper import Mapper, shown

MAX_DEEPSPEED_BYTES = 256_000
ACCELERATE_FSDP = "accelerate/utils/dataclasses.py@v1.15.0 FullyShardedDataParallelPlugin"

_STAGE_IN_NAME = re.compile(r"(?:zero|_z|^z)_?([0-3])", re.IGNORECASE)
_STAGE_SHARDING = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}


def _read_beside(path_text: str, base_dir: Path | None) -> dict[str, Any] | None:
    """The JSON next to the config, or None when reading it is not allowed or possible."""
    if base_dir is None:
        return None
    base = base_dir.resolve()
    # As written (relative to the config's folder), else the same file name beside it.
    candidates = [(base / path_text).resolve(), (base / Path(path_text).name).resolve()]
    path = next((p for p in candidates if base in p.parents and p.is_file()), None)
    if path is None:
        return None
    try:  # a regular file, never read past the cap (vram.files), as every named file
        data = json.loads(read_limited_text(path, MAX_DEEPSPEED_BYTES, what="DeepSpeed config"))
    except FileReadError as exc:
        raise TrainingConfigError("deepspeed", f"{path.name}: {exc.reason}") from None
    except (ValueError, RecursionError) as exc:
        raise TrainingConfigError("deepspeed", f"{path.name} is not valid JSON "
                                  f"({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise TrainingConfigError("deepspeed", f"{path.name} must hold a JSON object")
    return data


def _device(section: object) -> str:
    if isinstance(section, dict):
        device = section.get("device")
        return device.lower() if isinstance(device, str) else "none"
    return "none"


def _engine(m: Mapper, stage: int, key: str, value: Any) -> None:
    """ZeRO stages 1-3 run in DeepSpeed's engine, not the stack's default FSDP."""
    if stage:
        m.set("sharding_engine", "deepspeed", key, value, "DeepSpeed's ZeRO engine")


def map_deepspeed(m: Mapper, key: str, base_dir: Path | None) -> bool:
    """Map a `deepspeed:` value; True when the run uses DeepSpeed."""
    value = m.get(key)
    if value is None or value == "":
        return False
    config: dict[str, Any] | None
    if isinstance(value, dict):
        config, where = value, "inline"
    elif isinstance(value, str):
        config, where = _read_beside(value, base_dir), value
    else:
        raise TrainingConfigError(key, f"must be a path to a JSON file or a mapping, got "
                                  f"{shown(value)}")
    if config is None:
        name = Path(str(value)).name
        match = _STAGE_IN_NAME.search(name)
        if match is None:
            m.record(key, value, "DeepSpeed config not read (not beside the config, or file "
                     "reads are off) and its name gives no ZeRO stage: pass --sharding")
            return True
        stage = int(match.group(1))
        m.set("sharding", _STAGE_SHARDING[stage], key, value,
              "ZeRO stage from the file name; the file itself was not read")
        _engine(m, stage, key, value)
        if "offload" in name.lower():
            offload = "params+optimizer" if stage == 3 else "optimizer"
            m.set("offload", offload, key, value, "from the file name ('offload')")
        return True
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise TrainingConfigError(f"{key} zero_optimization", "must be a mapping")
    stage = zero.get("stage", 0)
    if stage == "auto" or not isinstance(stage, int) or stage not in _STAGE_SHARDING:
        raise TrainingConfigError(f"{key} zero_optimization.stage",
                                  f"must be 0, 1, 2 or 3, got {shown(stage)}")
    m.set("sharding", _STAGE_SHARDING[stage], f"{key} zero_optimization.stage", stage,
          f"DeepSpeed config ({where})")
    _engine(m, stage, key, value)
    optimizer_off = _device(zero.get("offload_optimizer")) in ("cpu", "nvme")
    params_off = _device(zero.get("offload_param")) in ("cpu", "nvme")
    if params_off:
        m.set("offload", "params+optimizer", f"{key} zero_optimization.offload_param",
              zero.get("offload_param"))
    elif optimizer_off:
        m.set("offload", "optimizer", f"{key} zero_optimization.offload_optimizer",
              zero.get("offload_optimizer"))
    return True


_FSDP_STRATEGIES = {"full_shard": "zero3", "shard_grad_op": "zero2", "no_shard": "ddp",
                    "hybrid_shard": "zero3", "hybrid_shard_zero2": "zero2",
                    "1": "zero3", "2": "zero2", "3": "ddp", "4": "zero3"}


def _fsdp_get(config: dict[str, Any], name: str) -> Any:
    """FSDP config keys appear with and without the `fsdp_` prefix."""
    if name in config:
        return config[name]
    return config.get(f"fsdp_{name}")


def map_fsdp(m: Mapper, fsdp_key: str = "fsdp", config_key: str = "fsdp_config",
             version_key: str | None = None) -> bool:
    """Map Transformers-style `fsdp:` + `fsdp_config:`; True when the run uses FSDP."""
    fsdp = m.get(fsdp_key)
    config = m.get(config_key)
    if fsdp in (None, "", [], False) and not config:
        return False
    if config is not None and not isinstance(config, dict):
        raise TrainingConfigError(config_key, "must be a mapping")
    config = config or {}
    words: list[str]
    if isinstance(fsdp, str):
        words = fsdp.lower().split()
    elif isinstance(fsdp, list):
        words = [str(w).lower() for w in fsdp]
    elif fsdp is True or fsdp is None:
        words = []
    else:
        raise TrainingConfigError(fsdp_key, f"must be text or a list, got {shown(fsdp)}")
    version_raw = (m.get(version_key) if version_key else None) or _fsdp_get(config, "version")
    if version_raw is not None:
        version = m.int_key(version_key or f"{config_key}.fsdp_version", version_raw,
                            low=1, high=2)
        m.set("fsdp_version", version, version_key or f"{config_key}.fsdp_version", version_raw)
    else:
        m.default("fsdp_version", 1, ACCELERATE_FSDP + " (fsdp_version None means 1)")
    strategy = _fsdp_get(config, "sharding_strategy")
    reshard = _fsdp_get(config, "reshard_after_forward")
    chosen = next((w for w in words if w in _FSDP_STRATEGIES), None)
    if isinstance(reshard, bool):
        m.set("sharding", "zero3" if reshard else "zero2", f"{config_key}.reshard_after_forward",
              reshard, "FSDP2: resharding after forward is full sharding")
    elif strategy is not None:
        text = str(strategy).lower()
        if text not in _FSDP_STRATEGIES:
            raise TrainingConfigError(f"{config_key}.fsdp_sharding_strategy",
                                      f"unknown strategy {shown(strategy)}")
        m.set("sharding", _FSDP_STRATEGIES[text], f"{config_key}.fsdp_sharding_strategy",
              strategy)
    elif chosen is not None:
        m.set("sharding", _FSDP_STRATEGIES[chosen], fsdp_key, fsdp)
    else:
        m.default("sharding", "zero3", ACCELERATE_FSDP + " sharding_strategy FULL_SHARD")
    offload = _fsdp_get(config, "offload_params")
    if offload is None and "offload" in words:
        offload = True
    if offload is not None:
        on = m.bool_key(f"{config_key}.fsdp_offload_params", offload)
        if on:
            m.set("offload", "params+optimizer", f"{config_key}.fsdp_offload_params", offload,
                  "FSDP CPU offload moves parameters, gradients and the optimizer step")
    ckpt = _fsdp_get(config, "activation_checkpointing")
    if ckpt is not None and m.bool_key(f"{config_key}.fsdp_activation_checkpointing", ckpt):
        m.set("grad_ckpt", True, f"{config_key}.activation_checkpointing", ckpt,
              "FSDP's own checkpoint wrapper")
        m.set("ckpt_reentrant", False, f"{config_key}.activation_checkpointing", ckpt,
              "accelerate wraps with checkpoint_wrapper, non-reentrant")
    return True
