"""The trace's optimizer table agrees with the closed form's rows
(vram.memory.optimizer.OPTIMIZERS)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from vram.memory.optimizer import OPTIMIZERS
from vram.setup import Optimizer, TrainingSetup
from vram.trace.optim import TRACE_OPTIMIZERS, make_optimizer


def test_every_traced_optimizer_has_a_row_and_steps_where_its_row_says() -> None:
    for optimizer, factory in TRACE_OPTIMIZERS.items():
        assert optimizer in OPTIMIZERS
        # None means "one optimizer per parameter, stepped inside backward"
        assert (factory is None) == OPTIMIZERS[optimizer].steps_in_backward, optimizer


def test_an_optimizer_the_trace_cannot_run_is_a_clear_error() -> None:
    untraced = [o for o in Optimizer if o not in TRACE_OPTIMIZERS]
    assert Optimizer.ADAMW_4BIT in untraced
    with pytest.raises(ValueError, match="optimizer: unknown"):
        make_optimizer(TrainingSetup(method="full", optimizer="adamw-4bit"), [], lambda _: None)
