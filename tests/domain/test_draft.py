"""Drafts and groups (`vram.step.draft`): moments that are not the peak are compared by bytes; what
the peak writes out must be exactly what was counted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vram import TrainingSetup, estimate, load_model
from vram.memory.activations import plan
from vram.result import LineItem
from vram.step.draft import ItemDraft, ItemGroup, line_items
from vram.step.estimate import state_part
from vram.step.moments import step_moments


def test_line_items_keep_the_order_and_write_groups_out_in_place() -> None:
    cached = LineItem(key="a", label="a", formula="f", bytes=1)
    group = ItemGroup(5, lambda: [LineItem(key="b", label="b", formula="f", bytes=2),
                                  LineItem(key="c", label="c", formula="f", bytes=3)])
    draft = ItemDraft("d", "d", "f", {"tokens": 8}, 16, source="s")
    items = line_items([cached, group, draft])
    assert [(i.key, i.bytes) for i in items] == [("a", 1), ("b", 2), ("c", 3), ("d", 16)]
    assert items[0] is cached
    assert items[3] == LineItem(key="d", label="d", formula="f", inputs={"tokens": 8},
                                bytes=16, source="s")


def test_a_negative_draft_is_refused_by_its_key() -> None:
    with pytest.raises(ValueError, match=r"activations\.x: bytes must be >= 0, got -1"):
        ItemDraft("activations.x", "x", "f", {}, -1)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["llama-3.1-8b", "t0_3b", "mixtral-8x7b-v0.1", "gemma-2-9b",
                             "falcon-7b"]),
       method=st.sampled_from(["full", "lora", "qlora"]), grad_ckpt=st.booleans(),
       attention=st.sampled_from(["eager", "sdpa", "flash"]),
       loss=st.sampled_from([None, "chunked", "fused-linear"]),
       micro_batch=st.sampled_from([1, 3]), seq_len=st.sampled_from([256, 4096]))
def test_every_moment_counts_what_it_would_write_out(name: str, method: str, grad_ckpt: bool,
                                                     attention: str, loss: str | None,
                                                     micro_batch: int, seq_len: int) -> None:
    """A group's total equals its items, for every moment, not only the peak's."""
    model = load_model(name)
    setup = TrainingSetup(method=method, grad_ckpt=grad_ckpt, attention=attention, loss=loss,
                          micro_batch=micro_batch, seq_len=seq_len)
    part = state_part(model, setup)
    moments = step_moments(
        model, setup, part.profile, plan(model, setup, part.profile), part.grads, part.working,
        part.optimizer.step_temp_bytes + part.zero.step_copies_bytes)
    for moment in moments:
        written = line_items(moment.activation_items)
        assert sum(item.bytes for item in written) == moment.activation_bytes, moment.label
        assert moment.figures() == (moment.gradients_total, moment.activation_bytes,
                                    moment.in_flight_bytes, moment.weight_bytes), moment.label
    result = estimate(model, setup)
    assert result.bucket("activations").bytes == max(
        moments, key=lambda m: m.gradients_total + m.activation_bytes).activation_bytes


def test_a_fused_linear_head_is_remembered_per_token_count() -> None:
    """Liger's chunk size follows the micro-batch's tokens: two batch sizes of one structure
    get the figures of a fresh model each."""
    model = load_model("llama-3.1-8b")
    for batch in (1, 2, 16, 2):
        setup = TrainingSetup(method="full", loss="fused-linear", micro_batch=batch)
        assert estimate(model, setup).model_dump() == estimate(
            model.model_copy(), setup).model_dump()
