"""The lesson's count: GPUs of the 80 GB class by capacity and as sharding needs them
(vram.gpus.class_fit), and the compute gradient checkpointing costs (vram.plan.flops)."""

from __future__ import annotations

import pytest

import vram
from vram.gpus import class_fit, in_class, load_gpus
from vram.plan.flops import checkpointing_compute
from vram.units import GB


def _class(slug: str, **setup: object) -> vram.gpus.ClassFit:
    model = vram.load_model(slug)
    run = vram.TrainingSetup(**setup)  # type: ignore[arg-type]
    found = class_fit(model, run, vram.fit(model, run))
    assert found is not None
    return found


def test_the_class_is_the_80gb_cards() -> None:
    members = {g.id for g in load_gpus() if in_class(g)}
    assert members == {"a100-80gb-sxm", "a100-80gb-pcie", "h100-pcie", "h100-sxm"}


def test_70b_qlora_with_checkpointing_fits_one_80gb_gpu() -> None:
    """The lesson's promise: 65.1 GB, one 80 GB card, capacity and fit agree (65.7 GB until
    the estimate stopped counting a dequantized layer weight at the loss, where no quantized
    Linear runs)."""
    found = _class("llama-3.1-70b", method="qlora", grad_ckpt=True)
    assert found.reason == "fits-one" and found.needed is not None
    assert found.needed.count == 1 and found.capacity_count == 1
    assert round(found.whole_run_bytes / GB, 1) == 65.1


def test_70b_full_capacity_says_14_sharding_needs_32() -> None:
    """1,165 GB over an 85.9 GB card is 13.6, ~14 by capacity; the fit tries 8, 16, then 32
    GPUs. On 16 each GPU keeps what does not split beside 1/16 of the state: activations,
    overhead and, under the HF stack's FSDP1, the all-gather streams' cached blocks (the root
    unit's 128,256-entry embedding and head whole, 4.2 GB, and three blocks:
    `vram.sharding.fsdp1`), 86.7 GB, over the card. (It needed 16 before those blocks were
    counted; Llama 2 70B, a 32,000 vocabulary, still fits 16 at 82.0 GB.)"""
    found = _class("llama-3.1-70b", method="full", grad_ckpt=True)
    assert round(found.whole_run_bytes / GB) == 1165
    assert found.capacity_count == 14
    assert found.needed is not None and found.needed.count == 32
    assert (found.reason, found.below_count) == ("unsplit", 16)
    assert found.below_peak_bytes is not None and round(found.below_peak_bytes / GB, 1) == 86.7


def test_70b_lora_two_cards_by_capacity_four_sharded() -> None:
    """156 GB is two cards by capacity, but on two each keeps its own activations and
    overhead (17 GB: 11 GB, and FSDP1's all-gather streams' cached blocks, the root unit whole
    and three blocks, 5.5 GB: `vram.sharding.fsdp1`) beside half the weights: 92 GB, over the
    card; four hold it."""
    found = _class("llama-3.1-70b", method="lora", grad_ckpt=True)
    assert found.needed is not None and found.needed.count == 4
    assert (found.capacity_count, found.reason, found.below_count) == (2, "unsplit", 2)
    assert found.below_peak_bytes is not None and found.below_unsplit_bytes is not None
    assert found.below_peak_bytes > found.class_memory_bytes
    assert round(found.below_unsplit_bytes / GB) == 17


def test_without_checkpointing_no_count_of_80gb_cards_holds_70b_full() -> None:
    """221 GB of activations per GPU at the end of the forward: sharding never splits them."""
    found = _class("llama-3.1-70b", method="full")
    assert found.needed is None and found.reason == "none"
    assert found.capacity_count == 14 and found.below_count == 64
    assert found.below_unsplit_bytes is not None
    assert found.below_unsplit_bytes > found.class_memory_bytes


def test_no_class_card_in_the_list_gives_none() -> None:
    model = vram.load_model("llama-3.1-8b")
    run = vram.TrainingSetup()
    small = [g for g in load_gpus() if g.memory_bytes < 50 * 2**30]
    assert class_fit(model, run, vram.fit(model, run, small), small) is None


@pytest.mark.parametrize(("method", "extra"), [("full", 1 / 3), ("lora", 0.48), ("qlora", 0.48)])
def test_checkpointing_costs_one_more_forward(method: str, extra: float) -> None:
    """2N more per token: a third more for a full fine-tune (over 6N), about half for LoRA
    (over 4N plus the adapters' own), whatever the setup's grad_ckpt."""
    model = vram.load_model("llama-3.1-8b")
    for ckpt in (False, True):
        run = vram.TrainingSetup(method=method, grad_ckpt=ckpt)  # type: ignore[arg-type]
        trainable = vram.estimate(model, run).params.trainable
        assert checkpointing_compute(model, run, trainable) == pytest.approx(extra, abs=0.01)
