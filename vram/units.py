"""Units, once: bytes per dtype, binary and decimal sizes, and how sizes are written.

Bytes stay integers until they are shown. Text shows GiB (2^30 bytes) and GB (10^9 bytes) side by
side and labelled, because GPU makers sell GB-ish "80 GB" cards that hold 80 GiB-ish tensors and
users mix the two up.

    >>> format_gib(3 * GIB)
    '3.00 GiB'
    >>> size_text(GIB)
    '     1.00 GiB      1.07 GB'
"""

from __future__ import annotations

from enum import StrEnum

#: Bytes per value of each floating dtype a training step uses.
FP32_BYTES = 4
BF16_BYTES = 2
FP16_BYTES = 2
INT8_BYTES = 1

MIB = 2**20
GIB = 2**30
GB = 10**9


class Dtype(StrEnum):
    """The floating dtypes a recipe stores or computes in."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


DTYPE_BYTES: dict[Dtype, int] = {Dtype.FP32: FP32_BYTES, Dtype.BF16: BF16_BYTES,
                                 Dtype.FP16: FP16_BYTES}


def ceil_div(numerator: int, denominator: int) -> int:
    """⌈numerator / denominator⌉ on integers (blocks needed to hold `numerator` values)."""
    return -(-numerator // denominator)


def format_gib(n_bytes: int, width: int = 0, digits: int = 2) -> str:
    """`n_bytes` in GiB (2^30), labelled."""
    return f"{n_bytes / GIB:{width}.{digits}f} GiB"


def format_gb(n_bytes: int, width: int = 0, digits: int = 2) -> str:
    """`n_bytes` in GB (10^9), labelled."""
    return f"{n_bytes / GB:{width}.{digits}f} GB"


def both(n_bytes: int, digits: int = 1) -> str:
    """In prose: GB first (as the app shows by default), GiB beside it, "12.3 GB (11.5 GiB)"."""
    return f"{n_bytes / GB:,.{digits}f} GB ({n_bytes / GIB:,.{digits}f} GiB)"


def size_text(n_bytes: int) -> str:
    """GiB and GB side by side, in fixed-width columns (tables)."""
    return f"{format_gib(n_bytes, 9)} {format_gb(n_bytes, 9)}"
