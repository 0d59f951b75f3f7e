"""The Liger Kernel version, declared once as a field type: which chunk loop its fused linear
cross-entropy runs (`vram.memory.head._fused_linear_head`, `vram.trace.fused_loss`).

linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py changed its chunk
loop twice: up to v0.4.2 each chunk's logits are upcast to fp32 and cast back
(@v0.4.2 lines 77-111); from v0.5.0 (2024-12-09) they stay in the matmul's dtype (@v0.5.0
lines 64-77); from v0.6.2 (2025-08-21) the head's gradient is accumulated as
`grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()` (@v0.6.2 line 134,
@v0.8.2 line 257) where it was an in-place `addmm` (@v0.6.1 lines 126-133): a V x H product
and its fp32 copy per chunk. None is the current release, v0.8.2 (2026-08-18).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

from vram.setup.knob import Knob
from vram.setup.versions import MAJOR_MINOR_PATCH, lenient_version

#: The current release, what an unstated version means (tag v0.8.2, 2026-08-18).
CURRENT_LIGER = (0, 8, 2)
#: The first release that keeps the chunk's logits in the matmul's dtype (no fp32 upcast).
LIGER_NO_UPCAST = (0, 5, 0)
#: The first release that aliases the chunk's gradient to its logits (no `* alpha` copy).
LIGER_ALIASES_GRAD = (0, 5, 3)
#: The first release that accumulates the head's gradient through an fp32 V x H product.
LIGER_FP32_PRODUCT = (0, 6, 2)
#: The first release that accumulates into an fp32 `grad_weight` with `addmm(out_dtype=fp32)`
#: on PyTorch >= 2.8 (@v0.8.1 `_ADDMM_SUPPORTS_OUT_DTYPE`).
LIGER_ADDMM_OUT_DTYPE = (0, 8, 1)



def _liger_version(value: object) -> object:
    # "0.3.0", "v0.6", "0.6.2.dev0" -> "0.3.0", "0.6.0", "0.6.2"; "not stated (...)" -> None
    return lenient_version(value, MAJOR_MINOR_PATCH, "a Liger Kernel version such as 0.3.0")


def liger_release(version: str | None) -> tuple[int, int, int]:
    """The version as numbers; None: the current release."""
    if version is None:
        return CURRENT_LIGER
    major, minor, patch = (int(part) for part in version.split("."))
    return major, minor, patch


#: The Liger Kernel version; None = the current release (v0.8.2).
#: No case file has the column yet (../shared/validation/README.md): `validate` reads one
#: under the field's name where a file has it, else the default.
LigerVersion = Annotated[str | None, BeforeValidator(_liger_version), Knob(
    "Liger Kernel version", key="liger", flag="--liger-version",
    labels=(("auto", "the current release (0.8.2)"),),
    app_options=("0.3.0", "0.4.2", "0.5.2", "0.6.1", "0.6.2", "0.7.0", "0.8.2"),
    help="Liger Kernel version such as 0.3.0 (default: the current release, 0.8.2); up to "
         "0.4.2 its fused loss upcast each chunk's logits, from 0.6.2 a trained head's "
         "gradient goes through an fp32 V x H product per chunk",
)]
