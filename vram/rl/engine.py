"""The rollout engine's memory: its budget, weights, working memory, CUDA graphs and KV pool.

vLLM (v1 engine, >= 0.7): KV memory = `total_gpu_memory × gpu_memory_utilization − peak`, the
peak being weights + the profiled forward + non-torch memory
(vllm/v1/worker/gpu_worker.py@0012cf69 `determine_available_memory`; the same at @35d5cda1:
`requested_memory − profile_result.non_kv_cache_memory`); newer versions also refuse to start
when free memory is below `total × utilization` (@35d5cda1 `init_device`). CUDA graphs are
captured *after* the KV cache is allocated and are not in that budget: @35d5cda1
`compile_or_warm_up_model` captures them (`cuda_graph_memory_bytes = capture_model()`) and says
"`memory_profiling` does not consider CUDAGraph memory size". So the engine holds its budget
*plus* its graphs. Sleep level 1 offloads the "weights" pool to host and drops "kv_cache";
level 2 drops both (`Worker.sleep`); CUDA graphs are outside those pools and stay.
SGLang: `rest = free_after_load − free_before_load × (1 − mem_fraction_static)`, so the fraction
is of the memory *free* when the engine starts (model_runner_kv_cache_mixin.py@226149ac).
"""

from __future__ import annotations

from vram.model.architecture import ModelSpec
from vram.rl.setup import Engine
from vram.units import BF16_BYTES, FP32_BYTES, GIB

#: TRL's colocated engine: `LLM(..., max_num_batched_tokens=4096)` and `max_num_seqs` = the
#: per-device batch (trl/generation/vllm_generation.py@v1.9.0 L363; grpo_trainer.py L1091).
TRL_COLOCATE_TOKENS = 4096
#: vLLM's own defaults for the offline `LLM` class (servers in RL stacks build one):
#: `max_num_batched_tokens` 16384 and `max_num_seqs` 1024 on GPUs of 70 GiB and more (not
#: A100), else 8192 and 256 (vllm/engine/arg_utils.py@99d7eb5d `_set_default_args`).
LARGE_GPU_BYTES = 70 * GIB
LLM_CLASS_DEFAULTS = {True: (16384, 1024), False: (8192, 256)}


def profile_shape(colocated_trl: bool, sequences: int, gpu_memory_bytes: int) -> tuple[int, int]:
    """(tokens, sequences) of the engine's profiling forward: TRL's colocate settings, else
    vLLM's `LLM` defaults for the GPU's size (`max_num_seqs` capped by the tokens)."""
    if colocated_trl:
        return TRL_COLOCATE_TOKENS, min(sequences, TRL_COLOCATE_TOKENS)
    return LLM_CLASS_DEFAULTS[gpu_memory_bytes >= LARGE_GPU_BYTES]
#: CUDA graphs: vLLM measures them when it captures (`capture_model` returns the bytes, logged
#: as "Graph capturing finished ... took N GiB"); no source states a size ahead of the run.
#: An assumption, stated as such: 1 GiB (logs of 7-8B models show 0.5-1.5 GiB). Outside the
#: gpu_memory_utilization budget (module docstring).
CUDA_GRAPH_BYTES = 1 * GIB


def engine_weight_bytes(model: ModelSpec) -> int:
    """The engine's own copy of the weights, 16-bit (vLLM loads the merged bf16 model)."""
    return model.n_params * BF16_BYTES


def engine_working_bytes(model: ModelSpec, tokens: int, sequences: int) -> int:
    """The profiled forward (`profile_run`): one layer's working set for `tokens` tokens
    (3 × 2 B × tokens × widest projection) plus the sampler's fp32 logits and probabilities
    for `sequences`."""
    stack = model.decoder
    widest = max(stack.intermediate_size * max(1, stack.experts_per_token),
                 stack.n_heads * stack.head_dim)
    return (3 * BF16_BYTES * tokens * widest
            + 2 * FP32_BYTES * sequences * model.vocab_size)


def requested_bytes(engine: Engine, utilization: float, total_bytes: int,
                    free_at_start_bytes: int) -> int:
    """What the engine claims: vLLM a share of TOTAL memory, SGLang a share of FREE memory."""
    if engine is Engine.VLLM:
        return int(total_bytes * utilization)
    return int(free_at_start_bytes * utilization)


def kv_pool_bytes(requested: int, weights: int, working: int) -> int:
    """The KV pool: the engine's budget less its weights and profiled forward (CUDA graphs
    come after, outside the budget)."""
    return max(requested - weights - working, 0)
