"""The `liger_version` knob: which chunk loop Liger's fused linear cross-entropy runs.

Up to v0.4.2 each chunk's logits are upcast to fp32 (fused_linear_cross_entropy.py@v0.4.2
lines 77-111); from v0.5.0 they are not; from v0.6.2 a trained head's gradient is accumulated
through `torch.mm(...).float()` (@v0.6.2 line 134, @v0.8.2 line 257): a V x H product and
its fp32 copy per chunk (`vram.setup.liger`).
"""

from __future__ import annotations

import json

import pytest

import vram
from ui import params
from vram.cli import main
from vram.io.knobs import KnobError
from vram.io.validate import setup_from_row
from vram.memory.head import liger_head_product_bytes
from vram.result import MomentId
from vram.setup import TrainingSetup

#: Llama 3 8B's head: V = 128,256, H = 4,096.
V, H = 128_256, 4_096
EIGHT_B = {"framework": "hf-trainer", "method": "full", "optimizer": "adamw",
           "precision": "bf16-true", "micro_batch": 1, "seq_len": 4096, "grad_ckpt": True,
           "loss": "fused-linear"}


def _loss_moment(**fields: object) -> int:
    result = vram.estimate(vram.load_model("meta-llama-3-8b"),
                           TrainingSetup.model_validate({**EIGHT_B, **fields}))
    return next(m.allocated_bytes for m in result.moments if m.label == MomentId.LOSS)


def test_versions_are_read_leniently_and_bad_ones_named() -> None:
    assert TrainingSetup(liger_version="v0.8.2").liger_version == "0.8.2"
    assert TrainingSetup(liger_version="0.6").liger_version == "0.6.0"
    assert TrainingSetup(liger_version="not stated (Aug 2024)").liger_version is None
    assert TrainingSetup().liger_version is None
    with pytest.raises(ValueError, match=r"not a Liger Kernel version such as 0\.3\.0"):
        TrainingSetup(liger_version="banana")
    with pytest.raises(KnobError, match=r"^liger_version: 'banana' is not a Liger"):
        setup_from_row({"liger_version": "banana"})


def test_the_knob_round_trips_through_cli_url_and_case_column(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--model", "llama-3.2-1b", "--liger-version", "0.3.0", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["liger_version"] == "0.3.0"
    assert main(["estimate", "--model", "llama-3.2-1b", "--liger-version", "banana"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--liger-version: 'banana' is not a Liger" in err
    reg = params.registry(("llama-3.2-1b",), "llama-3.2-1b", gpu_vendors=("NVIDIA",),
                          gpu_segments=("datacenter",))
    values, errors = params.parse_query(reg, {"liger": "0.3.0"})
    assert values == {"liger": "0.3.0"} and errors == []
    assert params.to_query(reg, {**reg.defaults(), **values})["liger"] == "0.3.0"
    _, errors = params.parse_query(reg, {"liger": "banana"})
    assert len(errors) == 1 and "URL parameter liger (Liger Kernel version)" in errors[0]
    assert setup_from_row({"liger_version": "0.6.2"}).liger_version == "0.6.2"
    assert setup_from_row({}).liger_version is None


def test_the_fp32_product_by_hand() -> None:
    """A bf16 head (bf16-true) from v0.6.2: the bf16 product (2·V·H) and its fp32 copy (4·V·H);
    an fp32 head under autocast, bf16 product: the same until v0.8.1's addmm(out_dtype) on
    PyTorch >= 2.8; an fp32 product is its own `.float()`; a frozen head, or v0.6.1, nothing."""
    matrix = V * H
    assert liger_head_product_bytes(matrix, 2, 2, (0, 8, 2), addmm_out_dtype=True) \
        == 3_152_019_456 == 6 * 128_256 * 4_096
    assert liger_head_product_bytes(matrix, 2, 4, (0, 8, 2), addmm_out_dtype=True) == 0
    assert liger_head_product_bytes(matrix, 2, 4, (0, 8, 2), addmm_out_dtype=False) == 6 * matrix
    assert liger_head_product_bytes(matrix, 2, 4, (0, 8, 0), addmm_out_dtype=True) == 6 * matrix
    assert liger_head_product_bytes(matrix, 4, 4, (0, 6, 2), addmm_out_dtype=True) == 4 * matrix
    assert liger_head_product_bytes(matrix, 2, 0, (0, 8, 2), addmm_out_dtype=True) == 0
    assert liger_head_product_bytes(matrix, 2, 2, (0, 6, 1), addmm_out_dtype=True) == 0


def test_llama_3_8b_loss_moment_by_version() -> None:
    """Llama 3 8B, bf16-true full, 4,096 tokens: chunks of next_power_of_2(ceil(4,096 / 32)) =
    128 tokens. v0.6.1 peaks at two bf16 chunks (2·2·128·V); v0.8.2 at one chunk beside the
    product: + 6·V·H - 2·128·V = 3,119,185,920 bytes. v0.3.0 at max(3e, 2e + 4) = 8 bytes per
    chunk entry against v0.6.1's 4: + 4·128·V. The default is the current release."""
    old, mid, new = (_loss_moment(liger_version=v) for v in ("0.3.0", "0.6.1", "0.8.2"))
    assert new - mid == 6 * V * H - 2 * 128 * V == 3_119_185_920
    assert old - mid == 4 * 128 * V
    assert _loss_moment() == new
    assert _loss_moment(liger_version="0.4.2") == old
    assert _loss_moment(liger_version="0.5.2") - mid == 2 * 128 * V  # the `* alpha` copy
