"""The traced step replayed through the caching allocator model (vram.trace.allocator)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vram.memory.allocator import ALLOC, FREE, AllocConf, replay  # noqa: E402
from vram.memory.allocator.libraries import CUBLAS_WORKSPACE_SM90_BYTES  # noqa: E402
from vram.setup import TrainingSetup  # noqa: E402
from vram.trace import trace_step  # noqa: E402
from vram.trace.allocator import trace_allocations, with_reserved  # noqa: E402

pytestmark = pytest.mark.trace

TINY = {
    "model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}
SETUPS = [
    {"method": "full", "optimizer": "adamw", "precision": "bf16-true"},
    {"method": "lora", "optimizer": "adamw", "precision": "bf16-mixed", "grad_ckpt": True},
    {"method": "full", "optimizer": "sgd-momentum", "precision": "fp32"},
]


def _setup(**kw: object) -> TrainingSetup:
    base: dict[str, object] = {"micro_batch": 2, "seq_len": 16, "framework": "other"}
    base.update(kw)
    return TrainingSetup(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("kw", SETUPS)
def test_replayed_allocations_peak_where_the_trace_peaks(kw: dict[str, object]) -> None:
    """Every tensor of the tiny model is under 1 MiB: small-pool blocks are the requests
    rounded to 512 B, exactly what the trace counts, so the replay's allocated peak over the
    steps is the trace's allocated peak (plus nothing: no cuBLAS workspace asked for)."""
    setup = _setup(**kw)
    log = trace_allocations(TINY, setup)
    result = replay(log.program(2, workspace_bytes=0))
    assert result.allocated_peak_bytes == trace_step(TINY, setup, n_layers=2).allocated_peak_bytes
    assert result.reserved_peak_bytes >= result.allocated_peak_bytes
    assert result.reserved_peak_bytes % (2 << 20) == 0  # whole 2 MiB small segments


def test_steps_are_balanced_and_each_thread_gets_a_workspace() -> None:
    log = trace_allocations(TINY, _setup(**SETUPS[0]))
    for step in log.steps[1:]:
        born = {key for kind, key, _, _ in step if kind == ALLOC}
        dead = {key for kind, key, _, _ in step if kind == FREE}
        assert born <= dead  # a steady step frees all it allocates
    assert sorted(thread for _, _, thread in log.first_matmuls) == ["autograd", "main"]
    plain = replay(log.program(workspace_bytes=0))
    with_ws = replay(log.program())
    workspaces = with_ws.allocated_end_bytes - plain.allocated_end_bytes
    assert workspaces == 2 * CUBLAS_WORKSPACE_SM90_BYTES


def test_trace_result_reports_reserved_beside_allocated() -> None:
    setup = _setup(**SETUPS[0])
    result = with_reserved(trace_step(TINY, setup), TINY, setup)
    assert result.reserved_peak_bytes is not None
    assert result.reserved_peak_bytes >= result.allocated_peak_bytes
    data = result.to_json()
    assert data["reserved_peak_bytes"] == result.reserved_peak_bytes
    assert data["alloc_conf"] == ""
    grown = with_reserved(trace_step(TINY, setup), TINY, setup,
                          conf=AllocConf(expandable_segments=True))
    assert grown.alloc_conf == "expandable_segments:True"
    assert "reserved_peak_bytes" not in trace_step(TINY, setup).to_json()
