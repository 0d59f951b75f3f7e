"""Selective (per-op) activation checkpointing, torchtitan's `selective_ac_option = "op"`.

Inside each checkpointed block PyTorch's selective-checkpoint policy keeps the outputs of the
ops on torchtitan's save list (matmuls and the fused attention kernels), except every second
matmul, and recomputes the rest (torchtitan/models/llama3/parallelize.py@dfb1a6ad9
`_op_sac_save_list`, torchtitan/distributed/activation_checkpoint.py@dfb1a6ad9 `_apply_op_sac`).
"""

from __future__ import annotations

import pytest

import vram
from vram import TrainingSetup, estimate
from vram.io.knobs import KnobError, setup_from_texts
from vram.io.validate import setup_from_row
from vram.memory.activations import plan
from vram.stacks.profile import profile_for

#: torchtitan's Llama 3.1 8B pre-training recipe (train_configs/llama3_8b.toml): FSDP2 with
#: bf16 parameters and fp32 reduction, AdamW, SDPA (flash), selective op checkpointing.
TITAN = dict(method="full", precision="bf16-mixed", micro_batch=2, seq_len=8192,
             grad_ckpt=True, ckpt_selective=True, framework="torchtitan", sharding="fsdp-full",
             attention="sdpa", optimizer="adamw")


def _checkpoints(**fields: object) -> int:
    """Every layer's checkpointed bytes (the estimate's activation plan)."""
    setup = TrainingSetup.model_validate(fields)
    return plan(vram.load_model("llama-3.1-8b"), setup, profile_for(setup)).checkpointed_bytes


def test_selective_keeps_every_other_matmul_and_the_attention_output() -> None:
    """Per token and layer, beyond the block's input: q (4,096), v (1,024), gate (14,336) and
    down (4,096) outputs of the seven matmuls, and the flash kernel's output (4,096) in bf16,
    plus its fp32 logsumexp per head (32)."""
    common = {**TITAN, "n_gpus": 8}  # 2 x 8,192 tokens: the peak is in the backward
    full = _checkpoints(**{**common, "ckpt_selective": False})
    selective = _checkpoints(**common)
    per_token_layer = 2 * (4096 + 1024 + 14336 + 4096) + 2 * 4096 + 4 * 32
    assert selective - full == 32 * 16384 * per_token_layer


def test_eager_softmax_is_recomputed() -> None:
    """The eager softmax is not on the save list: only the matmuls' outputs are added."""
    common = {**TITAN, "n_gpus": 8, "seq_len": 2048, "attention": "eager"}
    added = _checkpoints(**common) - _checkpoints(**{**common, "ckpt_selective": False})
    assert added == 32 * 4096 * 2 * (4096 + 1024 + 14336 + 4096)


@pytest.mark.parametrize(("gpus", "measured_gib"), [(8, 82.4), (128, 67.0)])
def test_torchtitan_published_fsdp_rows(gpus: int, measured_gib: float) -> None:
    """torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Dec 2024, H100 96 GB), Tables 1
    and 3, row "FSDP" (no compile, no Float8): Llama 3.1 8B, local batch 2 x 8,192 tokens,
    selective activation checkpointing; Memory(GiB) is the step log's peak reserved."""
    result = estimate(vram.load_model("llama-3.1-8b"),
                      TrainingSetup.model_validate({**TITAN, "n_gpus": gpus}))
    assert result.figure("reserved") / 2**30 == pytest.approx(measured_gib, rel=0.05)


def test_selective_needs_checkpointing() -> None:
    with pytest.raises(KnobError) as caught:
        setup_from_texts({"ckpt_selective": "true"}, lambda knob: knob.flag,
                         lambda knob: knob.name)
    assert str(caught.value).startswith("--ckpt-selective")


def test_the_case_file_says_selective_in_grad_ckpt() -> None:
    row = {"method": "full", "grad_ckpt": "selective", "n_gpus": "8", "sharding": "fsdp-full",
           "framework": "torchtitan"}
    setup = setup_from_row(row)
    assert setup.grad_ckpt and setup.ckpt_selective
    assert not setup_from_row({**row, "grad_ckpt": "true"}).ckpt_selective
