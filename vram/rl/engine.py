"""The rollout engine's memory: its budget, weights, working memory, CUDA graphs and KV pool.

vLLM (v1 engine, >= 0.7): KV memory = `total_gpu_memory × gpu_memory_utilization − peak`, the
peak being weights + the profiled forward + non-torch memory
(vllm/v1/worker/gpu_worker.py@0012cf69 `determine_available_memory`); newer versions also refuse
to start when free memory is below `total × utilization` (`init_device`). Sleep level 1 offloads
the "weights" pool to host and drops "kv_cache"; level 2 drops both (`Worker.sleep`); CUDA
graphs are outside those pools and stay.
SGLang: `rest = free_after_load − free_before_load × (1 − mem_fraction_static)`, so the fraction
is of the memory *free* when the engine starts (model_runner_kv_cache_mixin.py@226149ac).
"""

from __future__ import annotations

from vram.architecture import ModelSpec
from vram.rl.setup import Engine
from vram.units import BF16_BYTES, FP32_BYTES, GIB

#: Tokens vLLM's profiling forward runs (`max_num_batched_tokens`; 8192 is the v1 default
#: for online serving; offline `LLM` may use more). An assumption, stated as such.
PROFILE_TOKENS = 8192
#: Sequences the sampler handles at once (`max_num_seqs`, vLLM's default 256).
MAX_NUM_SEQS = 256
#: CUDA graphs: vLLM logs "Graph capturing finished ... took N GiB"; about 0.5-1.5 GiB for
#: 7-8B models. Not read from a source in this session: a typical figure, 1 GiB.
CUDA_GRAPH_BYTES = 1 * GIB


def engine_weight_bytes(model: ModelSpec) -> int:
    """The engine's own copy of the weights, 16-bit (vLLM loads the merged bf16 model)."""
    return model.n_params * BF16_BYTES


def engine_working_bytes(model: ModelSpec) -> int:
    """The profiled forward: one layer's working set for PROFILE_TOKENS tokens (3 × 2 B ×
    tokens × widest projection) plus the sampler's fp32 logits and probabilities."""
    stack = model.decoder
    widest = max(stack.intermediate_size * max(1, stack.experts_per_token),
                 stack.n_heads * stack.head_dim)
    return (3 * BF16_BYTES * PROFILE_TOKENS * widest
            + 2 * FP32_BYTES * MAX_NUM_SEQS * model.vocab_size)


def requested_bytes(engine: Engine, utilization: float, total_bytes: int,
                    free_at_start_bytes: int) -> int:
    """What the engine claims: vLLM a share of TOTAL memory, SGLang a share of FREE memory."""
    if engine is Engine.VLLM:
        return int(total_bytes * utilization)
    return int(free_at_start_bytes * utilization)


def kv_pool_bytes(requested: int, weights: int, working: int, graphs: int) -> int:
    """The KV pool: the engine's budget less its weights, profiled forward and CUDA graphs."""
    return max(requested - weights - working - graphs, 0)
