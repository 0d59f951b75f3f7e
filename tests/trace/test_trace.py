"""The exact trace: golden bytes by hand, PEFT's counts, bnb storage, extrapolation, speed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vram.model.params import allocated_bytes as rounded  # noqa: E402
from vram.setup import TrainingSetup  # noqa: E402
from vram.trace import trace_step  # noqa: E402
from vram.trace.quant import QuantLinear, storage_bytes  # noqa: E402
from vram.trace.step import trace_depth  # noqa: E402

pytestmark = pytest.mark.trace

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "models"

H, KV, FF, V = 64, 32, 160, 1000  # hidden, kv width (2 heads x 16), intermediate, vocab
TINY = {
    "model_type": "llama", "vocab_size": V, "hidden_size": H, "intermediate_size": FF,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}
MIXTRAL = {
    "model_type": "mixtral", "vocab_size": V, "hidden_size": H, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 512,
}


def tiny_param_shapes(layers: int) -> list[int]:
    """Numel of every parameter of TINY, written out by hand."""
    per_layer = [H * H, KV * H, KV * H, H * H,  # q, k, v, o
                 FF * H, FF * H, H * FF,  # gate, up, down
                 H, H]  # two RMSNorms
    return [V * H] + per_layer * layers + [H, V * H]  # embed, layers, final norm, lm_head


def charged(numels: list[int], nbytes: int) -> int:
    return sum(rounded(n * nbytes) for n in numels)


#: llama's rotary `inv_freq` (head_dim/2 fp32) and `original_inv_freq`: one block each.
ROPE_BUFFERS = 2 * 512


def _setup(**kw: object) -> TrainingSetup:
    base: dict[str, object] = {"micro_batch": 1, "seq_len": 8, "framework": "other"}
    base.update(kw)
    return TrainingSetup(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("precision", "nbytes"), [("bf16-true", 2), ("fp32", 4)])
def test_full_adamw_golden_buckets(precision: str, nbytes: int) -> None:
    result = trace_step(TINY, _setup(method="full", optimizer="adamw", precision=precision))
    shapes = tiny_param_shapes(2)
    assert result.params_total == result.params_trainable == sum(shapes) == 214_336
    assert result.phase == "optimizer step"
    assert result.buckets["weights"] == charged(shapes, nbytes) + ROPE_BUFFERS
    assert result.buckets["gradients"] == charged(shapes, nbytes)
    # AdamW keeps exp_avg and exp_avg_sq in the parameter dtype; step counters live on the host.
    assert result.buckets["optimizer"] == 2 * charged(shapes, nbytes)
    # The foreach path's `_foreach_sqrt` copy of the second moments is alive at the peak.
    assert result.buckets["activations"] >= charged(shapes, nbytes)


def test_buckets_sum_to_the_peak_and_json() -> None:
    for kw in ({"method": "full", "optimizer": "sgd-momentum", "precision": "bf16-mixed"},
               {"method": "lora", "optimizer": "adamw", "precision": "bf16-true",
                "grad_ckpt": True, "micro_batch": 2, "seq_len": 64}):
        result = trace_step(TINY, _setup(**kw))
        assert sum(result.buckets.values()) == result.allocated_peak_bytes
        data = result.to_json()
        assert set(data["buckets"]) == {"weights", "gradients", "optimizer", "activations"}
        assert data["allocated_peak_bytes"] == result.allocated_peak_bytes
        assert data["phase"] in ("forward", "backward", "optimizer step")
        assert 0 < len(data["timeline"]) <= 2000
        assert max(p[1] for p in data["timeline"]) == result.allocated_peak_bytes
        json.dumps(data)


def test_two_steps_count_lazy_optimizer_state() -> None:
    """State made lazily in step 1 is alive during step 2's forward and backward."""
    raw = trace_depth(TINY, _setup(method="full", optimizer="adamw", precision="bf16-true"), 2)
    phases = [p for _, _, p in raw.timeline]
    assert phases.count("optimizer step") >= 2
    forward_peak = max(peak.buckets["optimizer"] for key, peak in raw.peaks.items()
                       if key[0] == "forward")
    assert forward_peak == 2 * charged(tiny_param_shapes(2), 2)


def test_lora_trainable_params_equal_peft() -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    setup = _setup(method="lora", lora_rank=8, lora_targets="q_proj,v_proj",
                   precision="bf16-true", optimizer="adamw", framework="hf-trainer")
    result = trace_step(TINY, setup)
    with torch.device("meta"):
        cfg = {k: v for k, v in TINY.items() if k != "model_type"}
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **cfg))
        peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        trainable, _ = peft_model.get_nb_trainable_parameters()
    by_hand = 2 * (8 * (H + H) + 8 * (H + KV))  # two layers x (q + v adapters)
    assert result.params_trainable == trainable == by_hand == 3584
    # PEFT keeps adapters in fp32 on a bf16 base (autocast_adapter_dtype): 2 x 4 B states.
    adapters = [8 * H, H * 8, 8 * H, KV * 8] * 2
    assert result.buckets["optimizer"] == 2 * charged(adapters, 4)
    assert result.buckets["gradients"] in (0, charged(adapters, 4))


def test_bnb_storage_bytes() -> None:
    n = 4096 * 4096
    assert storage_bytes(n, "nf4") == n // 2 + 4 * (n // 64) + 64
    blocks = n // 64
    assert storage_bytes(n, "nf4-dq") == n // 2 + blocks + 4 * (blocks // 256) + 4 + 1024 + 64
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        for quant in ("nf4", "nf4-dq"):
            layer = QuantLinear(torch.nn.Linear(4096, 4096, bias=False), quant, torch.bfloat16)
            assert layer.quantized_bytes() == storage_bytes(n, quant)
            assert not any(p.requires_grad for p in layer.parameters())
        int8 = QuantLinear(torch.nn.Linear(4096, 1024, bias=False), "int8", torch.bfloat16)
        assert int8.quantized_bytes() == 4096 * 1024 + 4 * 1024


def test_qlora_weights_bucket_is_bnb_storage() -> None:
    """Linear layers of the blocks in nf4; embeddings, norms, head upcast to fp32 (HF stack)."""
    setup = _setup(method="qlora", quant="nf4", precision="bf16-true", optimizer="adamw",
                   framework="hf-trainer", lora_targets="q_proj,v_proj")
    result = trace_step(TINY, setup)
    linears = [H * H, KV * H, KV * H, H * H, FF * H, FF * H, H * FF] * 2
    quant = sum(rounded(n // 2) + rounded(4 * (n // 64)) + rounded(64) for n in linears)
    fp32 = charged([V * H, H, H, H, H, H, V * H], 4)  # embed, 4 layer norms, final norm, head
    adapters = charged([16 * H, H * 16, 16 * H, KV * 16] * 2, 4)  # r=16 A and B, fp32
    assert result.buckets["weights"] == quant + fp32 + adapters + ROPE_BUFFERS


@pytest.mark.parametrize("kw", [
    {"method": "full", "optimizer": "adamw", "precision": "bf16-mixed", "grad_ckpt": True},
    {"method": "full", "optimizer": "adafactor", "precision": "bf16-true", "attention": "eager"},
    {"method": "full", "optimizer": "adamw-in-backward", "precision": "bf16-true"},
    {"method": "lora", "optimizer": "adamw", "precision": "bf16-true",
     "lora_targets": "all-linear"},
    {"method": "qlora", "optimizer": "paged-adamw-8bit", "precision": "bf16-mixed",
     "grad_ckpt": True},
    {"method": "qlora", "quant": "nf4-dq", "optimizer": "lion", "precision": "bf16-true",
     "framework": "litgpt"},
    {"method": "full", "optimizer": "sgd", "precision": "fp32", "loss": "chunked"},
    {"method": "lora", "optimizer": "adamw", "precision": "bf16-mixed", "attention": "flash"},
])
def test_extrapolation_equals_full_depth(kw: dict[str, object]) -> None:
    config = dict(TINY, num_hidden_layers=5)
    setup = _setup(micro_batch=2, seq_len=64, **kw)
    fast = trace_step(config, setup)
    full = trace_step(config, setup, n_layers=5)
    assert fast.extrapolated and not full.extrapolated
    assert fast.allocated_peak_bytes == full.allocated_peak_bytes
    assert fast.buckets == full.buckets
    assert fast.phase == full.phase
    assert fast.params_total == full.params_total


def test_extrapolation_follows_alternating_layer_kinds() -> None:
    """Gemma 2 alternates sliding-window and global layers, and at 2 × 128 tokens with a
    64-token window a model with both kinds builds a second mask: extending one block at a
    time would count that mask once per block. The trace extends whole periods."""
    config = {"model_type": "gemma2", "vocab_size": V, "hidden_size": H, "intermediate_size": FF,
              "num_hidden_layers": 10, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "sliding_window": 64}
    setup = _setup(method="full", optimizer="adamw", precision="bf16-true", micro_batch=2,
                   seq_len=128, attention="eager")
    fast = trace_step(config, setup)
    full = trace_step(config, setup, n_layers=10)
    assert fast.n_layers_traced == (4, 6)  # two and three periods
    assert (fast.allocated_peak_bytes, fast.buckets) == (full.allocated_peak_bytes, full.buckets)


def test_extrapolation_on_tinyllama() -> None:
    config = json.loads((CONFIGS / "tinyllama-1.1b.json").read_text())
    setup = _setup(method="full", optimizer="adamw", precision="bf16-true", seq_len=128)
    fast = trace_step(config, setup)
    full = trace_step(config, setup, n_layers=config["num_hidden_layers"])
    assert (fast.allocated_peak_bytes, fast.buckets) == (full.allocated_peak_bytes, full.buckets)


def test_paged_states_are_reported_apart() -> None:
    big = dict(TINY, vocab_size=4000)  # embedding and head of 256,000 values: paged
    paged = trace_step(big, _setup(method="full", optimizer="paged-adamw", precision="bf16-true"))
    plain = trace_step(big, _setup(method="full", optimizer="adamw-8bit", precision="bf16-true"))
    assert paged.paged_bytes == 2 * 2 * 4000 * H * 4  # two tensors x two fp32 states
    assert plain.paged_bytes == 0


@pytest.mark.parametrize(("config", "method"), [
    (MIXTRAL, "full"), (MIXTRAL, "lora"),
    ({"model_type": "phi", "vocab_size": V, "hidden_size": H, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 4}, "lora"),
    ({"model_type": "falcon", "vocab_size": V, "hidden_size": H, "num_hidden_layers": 2,
      "num_attention_heads": 4, "multi_query": True, "alibi": False}, "qlora"),
    ({"model_type": "gemma2", "vocab_size": V, "hidden_size": H, "intermediate_size": FF,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16}, "full"),
    ({"model_type": "t5", "vocab_size": V, "d_model": H, "d_kv": 16, "d_ff": FF,
      "num_layers": 2, "num_heads": 4}, "qlora"),
    ({"model_type": "bert", "vocab_size": V, "hidden_size": H, "intermediate_size": FF,
      "num_hidden_layers": 2, "num_attention_heads": 4}, "lora"),
])
def test_families_trace(config: dict[str, object], method: str) -> None:
    setup = _setup(method=method, optimizer="adamw", precision="bf16-true", seq_len=32,
                   lora_targets="q_proj,v_proj")
    result = trace_step(config, setup)
    assert result.allocated_peak_bytes == sum(result.buckets.values()) > 0
    assert result.params_trainable > 0


def test_unknown_family_is_a_clear_error() -> None:
    from vram.trace.build import TraceUnsupported

    with pytest.raises(TraceUnsupported, match="model_type"):
        trace_step({"model_type": "no-such-model", "num_hidden_layers": 2}, _setup(method="full"))


def _timed(name: str) -> float:
    config = json.loads((CONFIGS / name).read_text())
    setup = TrainingSetup(method="full", optimizer="adamw", precision="bf16-true",
                          micro_batch=1, seq_len=2048)
    trace_step(TINY, setup)  # imports and first-call setup are not the trace's cost
    # The process's CPU time, not the wall clock: on a shared 2-core box another process can
    # double the wall time (5.4 s at load 8) without the trace costing more.
    start = time.process_time()
    trace_step(config, setup)
    return time.process_time() - start


@pytest.mark.slow
def test_70b_under_20_seconds() -> None:
    assert _timed("llama-3.1-70b-instruct.json") < 20


@pytest.mark.slow
def test_8b_under_5_seconds() -> None:
    assert _timed("llama-3.1-8b-instruct.json") < 5


def test_imports_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import vram.trace as t\n"
            "assert not t.trace_available()\n"
            "try:\n    t.trace_step({}, None)\n"
            "except t.TraceUnavailable as e:\n    assert \".[trace]\" in str(e)\n"
            "else:\n    raise SystemExit('no error')\n")
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)
