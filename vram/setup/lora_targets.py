"""LoRA's target modules as a person names them: the names `vram` understands, in one
canonical order, and the parser every surface (flag, URL, case file, config reader) shares."""

from __future__ import annotations

from typing import Literal

#: LoRA target names (PEFT / Hugging Face naming) that `vram` understands, in the one
#: canonical order (equal setups compare equal, URLs are stable).
LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                 "up_proj", "down_proj", "lm_head")
LORA_TARGET_NAMES: frozenset[str] = frozenset(LORA_TARGETS)
ALL_LINEAR: Literal["all-linear"] = "all-linear"


def parse_lora_targets(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...] | str:
    """``q_proj,v_proj`` (or ``;``-separated, or a list) -> the canonical tuple; ``all-linear``
    stays. An unknown or empty list is a `ValueError` naming what is allowed."""
    raw = value.replace(";", ",").split(",") if isinstance(value, str) else list(value)
    parts = [str(p).strip().lower() for p in raw if str(p).strip()]
    if not parts:
        raise ValueError("give at least one LoRA target module, or all-linear")
    if ALL_LINEAR in parts:
        return ALL_LINEAR
    unknown = [p for p in parts if p not in LORA_TARGET_NAMES]
    if unknown:
        raise ValueError(f"{unknown[0][:40]!r} is not one of: {', '.join(LORA_TARGETS)}, "
                         "or all-linear")
    return tuple(name for name in LORA_TARGETS if name in parts)
