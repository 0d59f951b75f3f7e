"""(c) The RL training phase traced on fake tensors with TRL's own loss code, against the closed
form (issue 11). The grid (30 setups) is benchmarks/rl_trace_grid.py, output committed as
benchmarks/rl_trace_grid.txt; this sample covers each reference kind in CI's time."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
trl = pytest.importorskip("trl")

from benchmarks.rl_trace_grid import TOLERANCE, compare, rl_setup  # noqa: E402

#: The trace calls TRL's methods; the closed form's constants were read from this version.
TRL_VERSION = "1.9.0"

SAMPLE = [
    # GRPO, beta > 0, LoRA: the reference is the adapter-disabled policy; old log-probs too
    ("tiny-32k", ("grpo", 0.04, "lora", 4, 64, 128)),
    # GRPO, beta 0, full: no reference, the old log-probs forward only
    ("tiny-32k", ("grpo", 0.0, "full", 2, 64, 128)),
    # DPO, full: a frozen 16-bit copy, forwarded inside the loss
    ("tiny-32k", ("dpo", 0.1, "full", 2, 64, 64, 2)),
]


def test_the_trace_runs_the_trl_version_the_closed_form_cites() -> None:
    assert trl.__version__ == TRL_VERSION


@pytest.mark.parametrize(("stack", "config", "setting", "field"), [
    ("trl-grpo", "GRPOConfig", "beta", "beta"),
    ("trl-grpo", "GRPOConfig", "num_generations", "num_generations"),
    ("trl-grpo", "GRPOConfig", "max_completion_length", "max_completion_length"),
    ("trl-grpo", "GRPOConfig", "use_vllm", "use_vllm"),
    ("trl-grpo", "GRPOConfig", "vllm_mode", "vllm_mode"),
    ("trl-grpo", "GRPOConfig", "vllm_gpu_memory_utilization", "vllm_gpu_memory_utilization"),
    ("trl-grpo", "GRPOConfig", "vllm_enable_sleep_mode", "vllm_enable_sleep_mode"),
    ("trl-grpo", "GRPOConfig", "loss_type", "loss_type"),
    ("trl-rloo", "RLOOConfig", "beta", "beta"),
    ("trl-rloo", "RLOOConfig", "num_generations", "num_generations"),
    ("trl-dpo", "DPOConfig", "beta", "beta"),
    ("trl-dpo", "DPOConfig", "max_length", "max_length"),
    ("trl-dpo", "DPOConfig", "precompute_ref_log_probs", "precompute_ref_log_probs"),
])
def test_trl_rows_are_the_installed_trls_defaults(stack: str, config: str, setting: str,
                                                   field: str) -> None:
    import dataclasses

    import vram.rl as rl

    fields = {f.name: f for f in dataclasses.fields(getattr(trl, config))}
    assert str(fields[field].default) == rl.rl_default(stack, setting).value


@pytest.mark.trace
@pytest.mark.parametrize(("model", "args"), SAMPLE)
def test_closed_form_training_phase_agrees_with_the_trace(model: str,
                                                          args: tuple[object, ...]) -> None:
    row = compare(model, rl_setup(*args))  # type: ignore[arg-type]
    assert abs(row.error) <= TOLERANCE, f"{100 * row.error:+.1f}%"


@pytest.mark.trace
def test_the_reference_adds_its_forward_and_the_policy_step_holds_the_peak() -> None:
    from benchmarks.rl_trace_grid import MODELS
    from vram.trace.rl_step import BACKWARD, LOSS, REF_LOGPS, trace_rl_training

    with_kl = trace_rl_training(MODELS["tiny-32k"], rl_setup("grpo", 0.04, "full", 2, 64, 128))
    without = trace_rl_training(MODELS["tiny-32k"], rl_setup("grpo", 0.0, "full", 2, 64, 128))
    assert REF_LOGPS in with_kl.phase_peaks and REF_LOGPS not in without.phase_peaks
    # the frozen copy: 16-bit weights of the whole model on top of the policy's
    assert with_kl.params_total == 2 * without.params_total
    # the no-grad forwards hold no activations: the policy's loss (forward or backward) peaks
    assert with_kl.phase in (LOSS, BACKWARD) and without.phase in (LOSS, BACKWARD)
