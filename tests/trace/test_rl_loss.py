"""(c) The GRPO loss step traced on fake tensors (TRL's code path) against vram.rl's closed form."""

from __future__ import annotations

import pytest

import vram
import vram.rl as rl
from vram.rl.estimate import logits_bytes
from vram.trace import trace_available

pytestmark = pytest.mark.skipif(not trace_available(), reason="needs the trace extra")


@pytest.mark.parametrize(("model_name", "batch", "gens", "completion", "precision"), [
    ("qwen2.5-7b-instruct", 1, 8, 1024, "bf16-true"),
    ("llama-3.1-8b", 2, 4, 512, "bf16-mixed"),
    ("qwen2.5-7b-instruct", 4, 16, 256, "fp32"),
    ("llama-3.1-8b", 1, 1, 512, "bf16-true"),
    ("llama-3.2-1b", 2, 2, 256, "fp32"),
])
def test_closed_form_logits_match_the_trace(model_name: str, batch: int, gens: int,
                                            completion: int, precision: str) -> None:
    from vram.trace.rl_loss import trace_grpo_loss

    model = vram.load_model(model_name)
    policy = vram.TrainingSetup(method="lora", precision=precision)
    setup = rl.RLSetup(policy=policy, batch=batch, num_generations=gens,
                       completion_len=completion, beta=0.04)
    traced = trace_grpo_loss(setup.sequences_per_gpu, completion, model.hidden_size,
                             model.vocab_size, beta=0.04, fp32_logits=precision == "fp32")
    assert abs(logits_bytes(model, setup) / traced.peak_above_inputs_bytes - 1) < 0.05
